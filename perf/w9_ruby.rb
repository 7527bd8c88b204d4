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

def result_line(workload, times, extra)
  format("@result\tworkload=%s\tcontender=kiln-ruby\ttime_s=%.9g\tmin_s=%.9g\treps=%d\tthreads=%d\t" \
         "isa=%s\tblas=%s\t%s", workload, median(times), times.min, times.size, Kiln.num_threads,
         Kiln.cpu_isa, Kiln.blas_core.empty? ? "none" : Kiln.blas_core, extra)
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

# --- the same workloads in C, and the overhead -------------------------------------
c_args = smoke ? ["--smoke"] : []
c_w5 = c_time(perf_dir, "perf_w5_op_chain", c_args + (reps_arg ? ["--reps", reps_arg.to_s] : []))
c_w1 = c_time(perf_dir, "perf_w1_elementwise", c_args + (reps_arg ? ["--reps", reps_arg.to_s] : []))

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
puts "(C: #{perf_dir} not built: cmake --build build/release)" unless c_w1 && c_w5
