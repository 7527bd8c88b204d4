# frozen_string_literal: true

require_relative "test_helper"

# Kiln::Optim against plain-Ruby references of torch's update rules, on
# loss = sum(p**2) / 2 (so grad = p) (issue 17, item 4).
class OptimTest < Minitest::Test
  START = [1.0, -2.0, 0.5].freeze

  def run_kiln(steps, &make)
    p = Kiln.tensor(START, dtype: :float64, requires_grad: true)
    opt = make.call([p])
    steps.times do
      opt.zero_grad
      ((p * p).sum * 0.5).backward
      opt.step
    end
    p.to_a
  end

  def sgd_ref(steps, lr:, momentum: 0, dampening: 0, weight_decay: 0, nesterov: false)
    START.map do |x|
      buf = nil
      steps.times do
        g = x + weight_decay * x
        if momentum != 0
          buf = buf.nil? ? g : momentum * buf + (1 - dampening) * g
          g = nesterov ? g + momentum * buf : buf
        end
        x -= lr * g
      end
      x
    end
  end

  def adam_ref(steps, lr:, b1: 0.9, b2: 0.999, eps: 1e-8, weight_decay: 0, decoupled: false)
    START.map do |x|
      m = v = 0.0
      (1..steps).each do |t|
        g = x
        if decoupled
          x *= 1 - lr * weight_decay
        else
          g += weight_decay * x
        end
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat = m / (1 - b1**t)
        vhat = v / (1 - b2**t)
        x -= lr * mhat / (Math.sqrt(vhat) + eps)
      end
      x
    end
  end

  def test_sgd_variants
    assert_nested sgd_ref(5, lr: 0.1), run_kiln(5) { |ps| Kiln::Optim::SGD.new(ps, lr: 0.1) }, 1e-9, []
    assert_nested sgd_ref(5, lr: 0.1, momentum: 0.9), run_kiln(5) { |ps| Kiln::Optim::SGD.new(ps, lr: 0.1, momentum: 0.9) }, 1e-9, []
    assert_nested sgd_ref(5, lr: 0.1, momentum: 0.9, dampening: 0.5, weight_decay: 0.01),
                  run_kiln(5) { |ps| Kiln::Optim::SGD.new(ps, lr: 0.1, momentum: 0.9, dampening: 0.5, weight_decay: 0.01) }, 1e-9, []
    assert_nested sgd_ref(5, lr: 0.1, momentum: 0.9, nesterov: true),
                  run_kiln(5) { |ps| Kiln::Optim::SGD.new(ps, lr: 0.1, momentum: 0.9, nesterov: true) }, 1e-9, []
    assert_raises(ArgumentError) { Kiln::Optim::SGD.new([Kiln.ones(1)], lr: 0.1, nesterov: true) }
  end

  def test_adam_and_adamw
    assert_nested adam_ref(6, lr: 0.1), run_kiln(6) { |ps| Kiln::Optim::Adam.new(ps, lr: 0.1) }, 1e-9, []
    assert_nested adam_ref(6, lr: 0.1, weight_decay: 0.1),
                  run_kiln(6) { |ps| Kiln::Optim::Adam.new(ps, lr: 0.1, weight_decay: 0.1) }, 1e-9, []
    assert_nested adam_ref(6, lr: 0.1, weight_decay: 0.1, decoupled: true),
                  run_kiln(6) { |ps| Kiln::Optim::AdamW.new(ps, lr: 0.1, weight_decay: 0.1) }, 1e-9, []
  end

  def test_param_groups_zero_grad_and_skipping_params_without_grad
    a = Kiln.tensor([1.0], requires_grad: true)
    b = Kiln.tensor([1.0], requires_grad: true)
    unused = Kiln.tensor([5.0], requires_grad: true)
    opt = Kiln::Optim::SGD.new([{ params: [a] }, { params: [b, unused], lr: 0.5 }], lr: 0.1)
    (a + b).sum.backward
    opt.step
    assert_tensor [0.9], a
    assert_tensor [0.5], b
    assert_tensor [5.0], unused
    opt.zero_grad
    assert_nil a.grad
    assert_equal [0.1, 0.5], opt.param_groups.map { |g| g[:lr] }
  end

  def test_schedulers
    opt = Kiln::Optim::SGD.new([Kiln.ones(1, requires_grad: true)], lr: 1.0)
    s = Kiln::Optim::LRScheduler::StepLR.new(opt, step_size: 2, gamma: 0.5)
    lrs = 6.times.map { v = s.get_last_lr[0]; s.step; v }
    assert_equal [1.0, 1.0, 0.5, 0.5, 0.25, 0.25], lrs
    opt = Kiln::Optim::Adam.new([Kiln.ones(1, requires_grad: true)], lr: 0.1)
    c = Kiln::Optim::LRScheduler::CosineAnnealingLR.new(opt, 4, eta_min: 0.02)
    lrs = 5.times.map { v = opt.param_groups[0][:lr]; c.step; v }
    expect = (0..4).map { |e| 0.02 + 0.08 * (1 + Math.cos(Math::PI * e / 4)) / 2 }
    assert_nested expect, lrs, 1e-12, []
  end

  # learning rates are host scalars: a scheduler changing them every step
  # never adds a trace to compile
  def test_changing_the_learning_rate_never_recompiles
    Kiln.manual_seed(3)
    model = Kiln::NN::Sequential.new(Kiln::NN::Linear.new(8, 16), Kiln::NN::ReLU.new, Kiln::NN::Linear.new(16, 4))
    opt = Kiln::Optim::Adam.new(model.parameters, lr: 0.01)
    sched = Kiln::Optim::LRScheduler::CosineAnnealingLR.new(opt, 20)
    x = Kiln.randn(32, 8)
    y = Kiln.tensor(Array.new(32) { |i| i % 4 })
    step = lambda do
      opt.zero_grad
      loss = F.cross_entropy(model.call(x), y)
      loss.backward
      opt.step
      sched.step
      Kiln.sync
    end
    5.times { step.call }
    Kiln.jit_wait
    misses = Kiln.stats[:cache_misses]
    10.times { step.call }
    assert_equal misses, Kiln.stats[:cache_misses], "a step with a new learning rate compiled a new trace"
  end

  F = Kiln::NN::F
end
