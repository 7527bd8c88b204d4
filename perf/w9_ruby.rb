# frozen_string_literal: true

# w9_ruby.rb — W9: what driving Kiln from Ruby costs.  W1 and W5 written with
# the `kiln` gem, timed like perf_w1_elementwise / perf_w5_op_chain, next to
# those C programs run in the same invocation; reports the Ruby time, the C
# time and the overhead per op.
#
#   (cd bindings/ruby && rake compile)       # the gem's extension
#   ruby perf/w9_ruby.rb [--smoke] [--reps N]
#
# W5: a chain of 100 scalar ops (x*1.01, then +0.01, 50 times) on a 16-element
#     float32 tensor x[i] = 0.1 i, then read back (to_a); 500 chains per
#     repetition; µs per op.  Ruby adds a method call and a wrapper object per op.
# W1: tanh(x*y + 0.5) * sigmoid(x) - y*y*0.25 over 2^24 float32, then Kiln.sync;
#     ms per evaluation (8 ops: the per-op overhead is lost in the memory traffic).
# W14:cnn: the digits CNN training step of perf/w14_cnn.c (conv-relu-pool x2,
#     linear, cross-entropy, the loss read, backward, hand-written Adam), the
#     same ops on the same inputs: ms per step, and Ruby's speed over C's
#     (issue 17's target: >= 0.9x).  Its check (the first two losses) must
#     equal the C program's.
# The C programs are looked up in build/release/perf (KILN_PERF_DIR overrides);
# without them only the Ruby rows are printed.  Nothing here asserts a time.
# Lines starting with @result use perf/bench.c's format (contender=kiln-ruby).
root = File.expand_path("..", __dir__)
gem_lib = File.join(root, "bindings", "ruby", "lib")
$LOAD_PATH.unshift(gem_lib) if File.exist?(File.join(gem_lib, "kiln", "kiln_ext.so"))
require "kiln"
require "open3"

smoke = ARGV.include?("--smoke")
reps_arg = ARGV.index("--reps") && Integer(ARGV[ARGV.index("--reps") + 1])
perf_dir = ENV.fetch("KILN_PERF_DIR", File.join(root, "build", "release", "perf"))

def now
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

def median(a)
  s = a.sort
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
end

# "peak_mib=...\t": the process's peak resident set (Linux VmHWM) since the
# row before, as perf/bench.c reports it ("" where unknown); starts a new peak
def peak_field
  kb = File.foreach("/proc/self/status").find { |l| l.start_with?("VmHWM:") }&.split&.fetch(1)
  File.write("/proc/self/clear_refs", "5")
  kb ? format("peak_mib=%.1f\t", kb.to_f / 1024) : ""
rescue SystemCallError
  kb ? format("peak_mib=%.1f\t", kb.to_f / 1024) : ""
end

def result_line(workload, times, extra)
  format("@result\tworkload=%s\tcontender=kiln-ruby\ttime_s=%.9g\tmin_s=%.9g\treps=%d\tthreads=%d\t" \
         "isa=%s\tblas=%s\t%s%s", workload, median(times), times.min, times.size, Kiln.num_threads,
         Kiln.cpu_isa, Kiln.blas_core.empty? ? "none" : Kiln.blas_core, peak_field, extra)
end

# runs a C benchmark program: [median time_s, min_s], nil when it is absent
def c_time(dir, prog, args)
  path = File.join(dir, prog)
  return nil unless File.executable?(path)

  out, status = Open3.capture2(path, *args)
  return nil unless status.success?

  line = out.lines.find { |l| l.start_with?("@result") }
  line && [line[/\ttime_s=([0-9.eE+-]+)/, 1].to_f, line[/\tmin_s=([0-9.eE+-]+)/, 1].to_f]
end

# --- W5 -------------------------------------------------------------------------
OPS = 100
elems = 16
x0 = Kiln.tensor(Array.new(elems) { |i| (i * 0.1).to_f })
chains = smoke ? 1 : 500
w5_reps = reps_arg || (smoke ? 1 : 7)
out = nil
chain = lambda do
  t0 = now
  x = x0
  k = 0
  while k < OPS
    x = k.odd? ? x + 0.01 : x * 1.01
    k += 1
  end
  out = x.to_a
  now - t0
end
w5 = (-1...w5_reps).map do |r|
  t = 0.0
  chains.times { t += chain.call }
  r >= 0 ? t / (chains * OPS) : nil
end.compact
puts result_line("W5", w5, "ops=#{OPS}\tchains=#{chains}\tcheck=sum=#{format('%.6g', out.sum)}")

# --- W1 -------------------------------------------------------------------------
n = smoke ? 4096 : 1 << 24
w1_reps = reps_arg || (smoke ? 1 : 9)
# the inputs bench_fill_sin makes: sin computed in float64, stored as float32
x = (Kiln.arange(n, dtype: :float64) * 0.001).sin.float
y = ((Kiln.arange(n, dtype: :float64) * 0.0007 + 0.5).sin * 1.5).float
Kiln.sync
w1_ops = 8
res = nil
w1 = (-2...w1_reps).map do |r|
  res = nil
  t0 = now
  res = (x * y + 0.5).tanh * x.sigmoid - y * y * 0.25
  Kiln.sync
  dt = now - t0
  r >= 0 ? dt : nil
end.compact
puts result_line("W1", w1, "bytes=#{12 * n}\telems=#{n}\tcheck=sum=#{format('%.6g', res.sum.item)}")

# --- the digits CNN training step (perf/w14_cnn.c, written with the gem) -----------
# bench_fill_hash: amp * (2u - 1) in double, stored as float32; u from the
# lowbias32 hash of i + seed * 0x9E3779B9 (uint32 arithmetic)
def fill_hash(shape, seed, amp, offset = nil)
  base = (seed * 0x9E3779B9) & 0xFFFFFFFF
  vals = Array.new(shape.inject(1, :*)) do |i|
    h = (i + base) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    h ^= h >> 16
    amp * (2.0 * ((h >> 8) / 16_777_216.0) - 1.0)
  end
  t = Kiln.tensor(vals, dtype: :float32).reshape(*shape)
  offset ? t + offset : t # offset added in float32, as the C side does
end

F = Kiln::NN::Functional
cnn_x = fill_hash([64, 64], 70, 0.5, 0.5)
cnn_target = Kiln.tensor(Array.new(64) { |i| (i * 7 + 3) % 10 }, dtype: :int64)
cnn_p = [fill_hash([16, 1, 3, 3], 71, Math.sqrt(6.0 / 9)), fill_hash([16], 72, 0.01),
         fill_hash([32, 16, 3, 3], 73, Math.sqrt(6.0 / 144)), fill_hash([32], 74, 0.01),
         fill_hash([128, 10], 75, Math.sqrt(6.0 / 128)), fill_hash([10], 76, 0.01)]
cnn_p.each { |t| t.requires_grad = true }
cnn_m = cnn_p.map { |t| Kiln.zeros_like(t) }
cnn_v = cnn_p.map { |t| Kiln.zeros_like(t) }
cnn_t = 0
lr, b1, b2, eps = 3e-3, 0.9, 0.999, 1e-8
cnn_step = lambda do
  h = cnn_x.reshape(64, 1, 8, 8)
  h = F.max_pool2d(F.conv2d(h, cnn_p[0], cnn_p[1], padding: 1).relu, 2)
  h = F.max_pool2d(F.conv2d(h, cnn_p[2], cnn_p[3], padding: 1).relu, 2)
  loss = (h.reshape(64, 128).matmul(cnn_p[4]) + cnn_p[5]).cross_entropy(cnn_target)
  value = loss.item
  loss.backward
  Kiln.no_grad do # Adam as perf/bench.c's bench_adam_step writes it
    cnn_t += 1
    bc1 = 1.0 - b1**cnn_t
    bc2 = 1.0 - b2**cnn_t
    cnn_p.each_with_index do |p, i|
      g = p.grad
      cnn_m[i] = cnn_m[i] * b1 + g * (1.0 - b1)
      cnn_v[i] = cnn_v[i] * b2 + (g * g) * (1.0 - b2)
      p.sub_scaled!((cnn_m[i] / bc1) / ((cnn_v[i] / bc2).sqrt + eps), lr)
      p.zero_grad!
    end
  end
  value
end
loss1 = cnn_step.call
loss2 = cnn_step.call
cnn_reps = reps_arg || (smoke ? 3 : 200)
(smoke ? 1 : 50).times do
  cnn_step.call
  Kiln.sync
end
Kiln.jit_wait
cnn = Array.new(cnn_reps) do
  t0 = now
  cnn_step.call
  Kiln.sync
  now - t0
end
puts result_line("W14:cnn", cnn, format("steps=%d\tcheck=loss1=%.9g,loss2=%.9g", cnn_t, loss1, loss2))

# --- the same workloads in C, and the overhead -------------------------------------
c_args = smoke ? ["--smoke"] : []
c_w5 = c_time(perf_dir, "perf_w5_op_chain", c_args + (reps_arg ? ["--reps", reps_arg.to_s] : []))
c_w1 = c_time(perf_dir, "perf_w1_elementwise", c_args + (reps_arg ? ["--reps", reps_arg.to_s] : []))
c_cnn = c_time(perf_dir, "perf_w14_cnn", c_args + (reps_arg ? ["--reps", reps_arg.to_s] : []))

puts
puts format("W9  Kiln %s from Ruby %s, %d threads, %s (median / best of the repetitions)", Kiln.library_version,
            RUBY_VERSION, Kiln.num_threads, Kiln.cpu_isa)
puts format("%-34s %21s %21s %21s", "workload", "Ruby", "C", "Ruby - C, per op")
row = lambda do |name, ruby, c, scale, unit, ops|
  r = [median(ruby), ruby.min].map { |v| v * scale }
  if c
    cc = c.map { |v| v * scale }
    per_op = [r[0] - cc[0], r[1] - cc[1]].map { |v| v / ops * (unit == "ms" ? 1e3 : 1) }
    puts format("%-34s %9.3f / %6.3f %s %9.3f / %6.3f %s %8.3f / %6.3f µs", name, r[0], r[1], unit, cc[0], cc[1],
                unit, per_op[0], per_op[1])
  else
    puts format("%-34s %9.3f / %6.3f %s %21s", name, r[0], r[1], unit, "n/a")
  end
end
row.call("W5 one op (16 elems, 100-op chain)", w5, c_w5, 1e6, "µs", 1)
row.call("W1 one evaluation (2^24 f32)", w1, c_w1, 1e3, "ms", w1_ops)
row.call("W14:cnn digits CNN training step", cnn, c_cnn, 1e3, "ms", 1)
if c_cnn
  puts format("W14:cnn from Ruby runs at %.2fx the speed of the same C program (median; target >= 0.9x)",
              c_cnn[0] / median(cnn))
end
puts "(C: #{perf_dir} not built: cmake --build build/release)" unless c_w1 && c_w5 && c_cnn
