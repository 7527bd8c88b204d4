# frozen_string_literal: true

# w17_char_rnn.rb — W17: examples/ruby/char_rnn.rb's model trained from Ruby,
# timed per epoch (BENCHMARKS.md).  An Embedding(V, 64), a GRU(64, 128,
# batch_first), a Linear(128, V) over the characters of
# data/a_scandal_in_bohemia.txt; Adam (lr 3e-3), clip_grad_norm! 1.0, the
# loss read every step.  An epoch is 60 steps of batch 16, each step's
# window length in 32..64.  The windows come from bench_hash_u32, so
# perf/peers.py's PyTorch rows (the same model with torch.nn.GRU, from
# Python) train on the very same windows.
#
#   (cd bindings/ruby && rake compile)            # the gem's extension
#   ruby perf/w17_char_rnn.rb [--smoke] [--reps N] [--warmup N] [--label NAME]
#
# Prints one @result line in perf/bench.c's format: time_s is the median
# seconds per epoch over --reps epochs (3) after --warmup untimed ones (1);
# cold_s is the first epoch (compiles included).  KILN_JIT=0 makes it the
# kiln-eager row.
root = File.expand_path("..", __dir__)
gem_lib = File.join(root, "bindings", "ruby", "lib")
$LOAD_PATH.unshift(gem_lib) if File.exist?(File.join(gem_lib, "kiln", "kiln_ext.so"))
require "kiln"

def arg(name, default)
  i = ARGV.index(name)
  i ? ARGV[i + 1] : default
end

SMOKE = ARGV.include?("--smoke")
REPS = Integer(arg("--reps", SMOKE ? 1 : 3))
WARMUP = Integer(arg("--warmup", SMOKE ? 0 : 1))
LABEL = arg("--label", ENV["KILN_JIT"] == "0" ? "kiln-eager" : "kiln")
STEPS = SMOKE ? 2 : 60
BATCH = SMOKE ? 2 : 16
HIDDEN = SMOKE ? 16 : 128
EMBED = SMOKE ? 8 : 64
MIN_LEN = SMOKE ? 4 : 32
MAX_LEN = SMOKE ? 6 : 64

# bench_hash_u32 (perf/bench.c, perf/peers.py's hash_u32): lowbias32
def hash_u32(k)
  m = 0xFFFFFFFF
  k &= m
  k ^= k >> 16
  k = (k * 0x7FEB352D) & m
  k ^= k >> 15
  k = (k * 0x846CA68B) & m
  k ^ (k >> 16)
end

text = File.read(File.join(root, "data", "a_scandal_in_bohemia.txt"), encoding: "UTF-8")
vocab = text.chars.uniq.sort
index = vocab.each_with_index.to_h
data = text.chars.map { |c| index[c] }

class CharRNN < Kiln::NN::Module
  def initialize(vocab_size, embed, hidden)
    super()
    @embedding = Kiln::NN::Embedding.new(vocab_size, embed)
    @gru = Kiln::NN::GRU.new(embed, hidden, batch_first: true)
    @head = Kiln::NN::Linear.new(hidden, vocab_size)
  end

  def forward(tokens)
    out, = @gru.(@embedding.(tokens))
    @head.(out)
  end
end

Kiln.manual_seed(1)
model = CharRNN.new(vocab.size, EMBED, HIDDEN)
opt = Kiln::Optim::Adam.new(model.parameters, lr: 3e-3)
step = 0
first_loss = nil
train_step = lambda do
  len = MIN_LEN + hash_u32(2 * step + 1) % (MAX_LEN - MIN_LEN + 1)
  starts = Array.new(BATCH) { |b| hash_u32(1_000_003 * step + b + 7) % (data.size - len - 1) }
  step += 1
  x = Kiln.tensor(starts.map { |s| data[s, len] }, dtype: :int64)
  y = Kiln.tensor(starts.map { |s| data[s + 1, len] }, dtype: :int64)
  loss = Kiln.cross_entropy(model.(x).reshape(BATCH * len, vocab.size), y.reshape(BATCH * len))
  opt.zero_grad
  loss.backward
  Kiln::NN::Utils.clip_grad_norm!(model.parameters, 1.0)
  opt.step
  value = loss.item
  first_loss ||= value
  value
end

def now
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

epoch = lambda do
  t0 = now
  total = 0.0
  STEPS.times { total += train_step.call }
  [now - t0, total / STEPS]
end

cold_s, = epoch.call
(WARMUP - 1).times { epoch.call } if WARMUP > 1
times = []
last_loss = nil
REPS.times do
  secs, last_loss = epoch.call
  times << secs
end
sorted = times.sort
median = sorted.size.odd? ? sorted[sorted.size / 2] : (sorted[sorted.size / 2 - 1] + sorted[sorted.size / 2]) / 2.0
stats = Kiln.stats
# the process's peak resident set (Linux VmHWM), as perf/bench.c reports it
peak = begin
  kb = File.foreach("/proc/self/status").find { |l| l.start_with?("VmHWM:") }&.split&.fetch(1)
  kb ? format("peak_mib=%.1f\t", kb.to_f / 1024) : ""
rescue SystemCallError
  ""
end
puts format("@result\tworkload=W17\tcontender=%s\ttime_s=%.9g\tmin_s=%.9g\treps=%d\tthreads=%d\tisa=%s\t" \
            "blas=%s\t%ssteps=%d\tbatch=%d\thidden=%d\tlengths=%d..%d\tcold_s=%.4g\tloss_last_epoch=%.4f\t" \
            "kernels=%d\ttraces_seen=%d\tloops_rolled=%d\tcheck=loss1=%.6f",
            LABEL, median, sorted.first, REPS, Kiln.num_threads, Kiln.cpu_isa,
            Kiln.blas_core.empty? ? "none" : Kiln.blas_core, peak, STEPS, BATCH, HIDDEN, MIN_LEN, MAX_LEN,
            cold_s, last_loss, stats[:kernels_compiled], stats[:traces_seen], stats[:loops_rolled], first_loss)
