# frozen_string_literal: true

require_relative "test_helper"

# The execution model seen from Ruby (DESIGN §3): which values a flush keeps,
# and so every trace key, is a function of the program, never of when Ruby's
# GC collects a dead tensor.  The same training loop, with results that are
# computed and never read (dead pending readers of the step's values), runs
# in two fresh processes, one with GC.stress: the flushes, keys and cache
# hits are the same.  And a tensor read twice is computed at most twice.
class SteadyStateTest < Minitest::Test
  LOOP = <<~RUBY
    Kiln.manual_seed(3)
    x = Kiln.randn(32, 16)
    y = Kiln.tensor(Array.new(32) { |i| i % 4 })
    w1 = (Kiln.randn(16, 24) * 0.3).detach
    w2 = (Kiln.randn(24, 4) * 0.3).detach
    m1 = Kiln.zeros(16, 24)
    [w1, w2].each { |p| p.requires_grad = true }
    GC.stress = ARGV[0] == "stress"
    losses = []
    settled = nil
    12.times do |step|
      settled = Kiln.stats if step == 8
      h = x.matmul(w1).relu
      logits = h.matmul(w2)
      unread = logits.argmax(dim: 1).eq(y).sum # never read: garbage whenever the GC says
      unread = nil
      loss = Kiln.cross_entropy(logits, y)
      losses << loss.item
      loss.backward
      Kiln.no_grad do
        m1 = m1 * 0.9 + w1.grad # momentum rebound every step
        w1.sub_scaled!(m1, 0.1)
        w2.sub_scaled!(w2.grad, 0.1)
        [w1, w2].each(&:zero_grad!)
      end
    end
    GC.stress = false
    s = Kiln.stats
    late = [s[:traces_seen] - settled[:traces_seen], s[:recomputed] - settled[:recomputed]]
    puts [s[:flushes], s[:traces_seen], s[:cache_hits], s[:cache_misses], *late,
          losses.map { |l| [l].pack("E").unpack1("H*") }.join(",")].join(" ")
  RUBY

  include KilnChild

  def run_loop(mode) = kiln_child(LOOP, mode).split

  def test_keys_do_not_depend_on_the_gc
    calm = run_loop("calm")
    stressed = run_loop("stress")
    assert_equal calm, stressed, "flushes, traces seen, hits, misses and the losses (bits)"
    flushes, late_traces, late_recomputed = calm[0].to_i, calm[4].to_i, calm[5].to_i
    assert_operator flushes, :>=, 12
    assert_equal 0, late_traces, "settled: no new trace in the last steps"
    assert_equal 0, late_recomputed, "settled: nothing computed twice in the last steps"
  end

  def test_a_value_read_twice_is_computed_at_most_twice
    Kiln.sync
    s0 = Kiln.stats
    x = Kiln.randn(64, 64)
    first = x.sum.item
    5.times { assert_equal first, x.sum.item }
    s1 = Kiln.stats
    assert_equal 6, s1[:flushes] - s0[:flushes]
    assert_equal 1, s1[:recomputed] - s0[:recomputed] # the second read; then x is kept
  end
end
