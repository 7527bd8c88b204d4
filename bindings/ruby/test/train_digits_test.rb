# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/digits"

# A 64-64-10 relu MLP trained from Ruby with minibatch SGD (sub_scaled!), and
# the JIT seen from Ruby: once warm, every training step is the same trace,
# found in Kiln's cache, whatever Ruby's GC has or has not collected yet.
class TrainDigitsTest < Minitest::Test
  HIDDEN = 64
  BATCH = 32
  EPOCHS = 40
  LR = 0.3

  def forward(params, x)
    w1, b1, w2, b2 = params
    (x.matmul(w1) + b1).relu.matmul(w2) + b2
  end

  def accuracy(params, x, y)
    Kiln.no_grad { forward(params, x).argmax(dim: 1).eq(y).float.mean.item }
  end

  def test_mlp_reaches_95_percent_and_steps_hit_the_cache
    skip "#{Digits::PATH} not found" unless Digits.available?
    xtr, ytr, xte, yte = Digits.split
    ntrain = xtr.shape[0]
    Kiln.manual_seed(0)
    params = [(Kiln.randn(64, HIDDEN) * Math.sqrt(2.0 / 64)).detach, Kiln.zeros(HIDDEN),
              (Kiln.randn(HIDDEN, 10) * Math.sqrt(2.0 / HIDDEN)).detach, Kiln.zeros(10)]
    params.each { |p| p.requires_grad = true }
    rng = Digits::Rng.new(7)
    order = (0...ntrain).to_a
    steps = [] # per step: [cache hits, cache misses] from Kiln.stats deltas
    losses = []
    step = 0
    EPOCHS.times do
      rng.shuffle!(order)
      loss_sum = Kiln.zeros([]) # stays pending: read once per epoch
      (0...ntrain).step(BATCH) do |start|
        s0 = Kiln.stats
        idx = Kiln.tensor(order[start, BATCH])
        xb = xtr.index_select(0, idx)
        yb = ytr[idx]
        loss = Kiln.cross_entropy(forward(params, xb), yb)
        # Ruby's GC runs at places the program does not choose; make it
        # collect the step's dead temporaries at some steps and not others
        GC.start if rng.next % 5 == 0
        loss.backward
        Kiln.no_grad do
          params.each do |p|
            p.sub_scaled!(p.grad, LR)
            p.zero_grad!
          end
          loss_sum += loss.detach * idx.numel
        end
        GC.start if rng.next % 7 == 0
        Kiln.sync # end of step: one trace, the same one every step
        s1 = Kiln.stats
        steps << [s1[:cache_hits] - s0[:cache_hits], s1[:cache_misses] - s0[:cache_misses]]
        step += 1
      end
      losses << loss_sum.item / ntrain
    end
    acc = accuracy(params, xte, yte)
    assert_operator acc, :>=, 0.95, "test accuracy #{(100 * acc).round(2)}%"
    assert_operator losses.last, :<, losses.first / 4, "loss #{losses.first} -> #{losses.last}"

    last = steps.last(50)
    hits = last.sum(&:first)
    misses = last.sum(&:last)
    assert_operator hits + misses, :>=, 50, "each step looks the cache up"
    rate = hits.to_f / (hits + misses)
    if ENV["KILN_TEST_VERBOSE"]
      puts format("\ndigits: test accuracy %.2f%%, loss %.4f -> %.4f, hit rate over the last 50 steps %.1f%% " \
                  "(%d hits, %d misses), %d steps", 100 * acc, losses.first, losses.last, 100 * rate, hits, misses,
                  step)
    end
    assert_operator rate, :>=, 0.95, "hit rate #{(100 * rate).round(1)}% over the last 50 steps #{last.inspect}"
  end
end
