# frozen_string_literal: true

require_relative "test_helper"

# A GRU written the way a Rubyist writes it — a cell called in an `each`
# over the time steps, lengths changing every training step — runs rolled
# (trace/loop.h, issue #39): the forward and backward loops are each one
# step trace, and the weights' sums over the steps are one GEMM after the
# loop.  In fresh processes, with and without GC.stress: the same flushes,
# keys and loss bits (what the GC collects never changes the program), and
# losses within rounding of the same program run unrolled.
class RolledLoopTest < Minitest::Test
  LOOP = <<~RUBY
    Kiln.manual_seed(5)
    b, i, h = 4, 6, 8
    wx = (Kiln.randn(i, 3 * h) * 0.3).detach
    wh = (Kiln.randn(h, 3 * h) * 0.3).detach
    bias = Kiln.zeros(3 * h)
    wo = (Kiln.randn(h, 1) * 0.3).detach
    params = [wx, wh, bias, wo]
    params.each { |p| p.requires_grad = true }
    cell = lambda do |x, state|
      g = x.matmul(wx) + bias
      u = state.matmul(wh)
      r = (g[0.., 0...h] + u[0.., 0...h]).sigmoid
      z = (g[0.., h...2 * h] + u[0.., h...2 * h]).sigmoid
      n = (g[0.., 2 * h..] + r * u[0.., 2 * h..]).tanh
      n + z * (state - n)
    end
    GC.stress = ARGV[0] == "stress"
    before = Kiln.stats
    losses = []
    [5, 7, 6].each_with_index do |len, step|
      xs = Kiln.randn(len, b, i)
      state = Kiln.zeros(b, h)
      outs = []
      (0...len).each do |t|
        state = cell.call(xs[t], state)
        outs << state
      end
      loss = (Kiln.stack(outs, 0).matmul(wo) ** 2).mean
      losses << loss.item
      loss.backward
      Kiln.no_grad do
        params.each { |p| p.sub_scaled!(p.grad, 0.1) }
        params.each(&:zero_grad!)
      end
      GC.start if step == 1
    end
    GC.stress = false
    s = Kiln.stats
    puts [s[:flushes] - before[:flushes], s[:traces_seen] - before[:traces_seen],
          s[:loops_rolled] - before[:loops_rolled], s[:loop_sums] - before[:loop_sums],
          losses.map { |l| [l].pack("E").unpack1("H*") }.join(","),
          losses.map { |l| format("%.9e", l) }.join(",")].join(" ")
  RUBY

  include KilnChild

  def run_loop(mode, env = {}) = kiln_child(LOOP, mode, env: env).split

  def test_a_ruby_each_loop_rolls_the_same_under_gc_stress
    calm = run_loop("calm")
    stressed = run_loop("stress")
    assert_equal calm[0..4], stressed[0..4], "flushes, traces, rolled loops, sums, loss bits"
    rolled, sums = calm[2].to_i, calm[3].to_i
    assert_operator rolled, :>=, 6, "forward and backward rolled at every step"
    assert_operator sums, :>=, 3, "the weights' sums over the steps left the loop"
    unrolled = run_loop("calm", "KILN_ROLL_LOOPS" => "0")
    assert_equal 0, unrolled[2].to_i
    calm[5].split(",").zip(unrolled[5].split(",")).each do |a, b|
      assert_in_delta b.to_f, a.to_f, 1e-5 * [b.to_f.abs, 1].max, "rolled and unrolled losses"
    end
  end
end
