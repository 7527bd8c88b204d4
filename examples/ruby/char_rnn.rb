# frozen_string_literal: true

# char_rnn.rb — a character-level GRU language model trained from Ruby, the
# way a torch-rb user writes one (Kiln::NN::Embedding, GRU, Linear; Adam;
# gradient clipping), on windows of varying length, then sampling text.
#
#   ruby -Ibindings/ruby/lib examples/ruby/char_rnn.rb [options] [TEXT]
#   (from the repo after `cd bindings/ruby && rake compile`, or with the gem)
#
#   --epochs N   epochs of --steps training steps (8, 60)
#   --hidden N   the GRU's width (128)
#   --batch N    windows per step (16); each step's length is drawn from
#                --min-len..--max-len (32..64), so no two steps need be alike
#   --sample N   characters to sample after training (400), --temperature T (0.8)
#   --seed N     the data order, the weights and the sample (1)
#
# Text: data/a_scandal_in_bohemia.txt, "A Scandal in Bohemia" by Arthur Conan
# Doyle (1891), public domain (data/README.md).
require "kiln"
require "optparse"

opts = { epochs: 8, steps: 60, hidden: 128, batch: 16, min_len: 32, max_len: 64, lr: 3e-3, sample: 400,
         temperature: 0.8, seed: 1 }
OptionParser.new do |o|
  o.banner = "usage: char_rnn.rb [options] [TEXT]"
  %i[epochs steps hidden batch min_len max_len sample seed].each do |k|
    o.on("--#{k.to_s.tr('_', '-')} N", Integer) { |v| opts[k] = v }
  end
  o.on("--lr X", Float) { |v| opts[:lr] = v }
  o.on("--temperature X", Float) { |v| opts[:temperature] = v }
end.parse!
path = ARGV[0] || File.expand_path("../../data/a_scandal_in_bohemia.txt", __dir__)
text = File.read(path, encoding: "UTF-8")
vocab = text.chars.uniq.sort
index = vocab.each_with_index.to_h
data = text.chars.map { |c| index[c] }
abort "char_rnn.rb: #{path} is too short for windows of #{opts[:max_len]}" if data.size < opts[:max_len] + 2

# tokens [B, T] -> logits [B, T, V] and the GRU's last state
class CharRNN < Kiln::NN::Module
  def initialize(vocab_size, hidden)
    super()
    @embedding = Kiln::NN::Embedding.new(vocab_size, 64)
    @gru = Kiln::NN::GRU.new(64, hidden, batch_first: true)
    @head = Kiln::NN::Linear.new(hidden, vocab_size)
  end

  def forward(tokens, state = nil)
    out, state = @gru.(@embedding.(tokens), state)
    [@head.(out), state]
  end
end

Kiln.manual_seed(opts[:seed])
rng = Random.new(opts[:seed])
model = CharRNN.new(vocab.size, opts[:hidden])
opt = Kiln::Optim::Adam.new(model.parameters, lr: opts[:lr])
puts "#{data.size} characters, #{vocab.size} distinct; GRU #{opts[:hidden]}, batch #{opts[:batch]}, " \
     "windows of #{opts[:min_len]}..#{opts[:max_len]}"
opts[:epochs].times do |epoch|
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  total = 0.0
  seen = 0
  opts[:steps].times do
    len = rng.rand(opts[:min_len]..opts[:max_len])
    starts = Array.new(opts[:batch]) { rng.rand(data.size - len - 1) }
    x = Kiln.tensor(starts.map { |s| data[s, len] }, dtype: :int64)
    y = Kiln.tensor(starts.map { |s| data[s + 1, len] }, dtype: :int64)
    logits, = model.(x)
    loss = Kiln.cross_entropy(logits.reshape(opts[:batch] * len, vocab.size), y.reshape(opts[:batch] * len))
    opt.zero_grad
    loss.backward
    Kiln::NN::Utils.clip_grad_norm!(model.parameters, 1.0)
    opt.step
    total += loss.item
    seen += opts[:batch] * len
  end
  secs = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
  puts format("epoch %2d  loss %.3f  %7.0f characters/s", epoch + 1, total / opts[:steps], seen / secs)
end

# sampling: one character at a time, the GRU's state carried
model.eval
out = +"T"
Kiln.no_grad do
  token = index.fetch("T", 0)
  state = nil
  opts[:sample].times do
    logits, state = model.(Kiln.tensor([[token]], dtype: :int64), state)
    probs = (logits.reshape(vocab.size) * (1.0 / opts[:temperature])).softmax(-1).to_a
    r = rng.rand
    token = probs.each_with_index.find { |p, _| (r -= p) <= 0 }&.last || probs.size - 1
    out << vocab[token]
  end
end
puts "--- sampled at temperature #{opts[:temperature]} ---"
print out, "\n" # the sample as drawn, then one newline (even after a drawn one)
