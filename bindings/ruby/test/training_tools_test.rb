# frozen_string_literal: true

require_relative "test_helper"

# Issue 42's everyday training tools, as torch-rb names them: writing a
# parameter's gradient (p.grad.mul!, p.grad =), gradient clipping, RMSprop,
# Adagrad, ReduceLROnPlateau, NN::Init and Conv1d, each against plain-Ruby
# references of torch's rules.
class TrainingToolsTest < Minitest::Test
  include KilnAssertions

  START = [1.0, -2.0, 0.5].freeze

  # loss = sum(p**2) / 2 + sum(p * C): grad = p + C
  C = [0.3, -0.1, 0.2].freeze

  def step_loss(p)
    ((p * p).sum * 0.5 + (p * Kiln.tensor(C, dtype: :float64)).sum).backward
  end

  def run_kiln(steps)
    p = Kiln.tensor(START, dtype: :float64, requires_grad: true)
    opt = yield([p])
    steps.times do
      opt.zero_grad
      step_loss(p)
      opt.step
    end
    p.to_a
  end

  # --- the gradient is the tensor p.grad returns -------------------------------

  def test_an_in_place_update_of_grad_is_what_the_optimizer_reads
    p = Kiln.tensor([1.0, 2.0, 3.0], requires_grad: true)
    (p * 2).sum.backward
    p.grad.mul!(0.5) # silently dropped before kiln_set_grad
    assert_tensor [1.0, 1.0, 1.0], p.grad
    Kiln::Optim::SGD.new([p], lr: 1.0).step
    assert_tensor [0.0, 1.0, 2.0], p
    (p * 3).sum.backward # accumulates onto the written gradient
    assert_tensor [4.0, 4.0, 4.0], p.grad
  end

  def test_grad_can_be_assigned
    p = Kiln.tensor([1.0, 2.0], requires_grad: true)
    p.grad = Kiln.tensor([0.25, -0.5])
    assert_tensor [0.25, -0.5], p.grad
    p.grad = nil
    assert_nil p.grad
    err = assert_raises(Kiln::ShapeError) { p.grad = Kiln.tensor([1.0, 2.0, 3.0]) }
    assert_match(/shape/, err.message)
    assert_raises(Kiln::DTypeError) { p.grad = Kiln.tensor([1.0, 2.0], dtype: :float64) }
    q = Kiln.tensor([1.0, 2.0]) # requires no grad
    assert_raises(Kiln::Error) { q.grad = Kiln.tensor([1.0, 2.0]) }
  end

  # --- gradient clipping ------------------------------------------------------------

  def grads_of(values)
    values.map do |v|
      p = Kiln.tensor(v.map { 1.0 }, dtype: :float64, requires_grad: true)
      (p * Kiln.tensor(v, dtype: :float64)).sum.backward
      p
    end
  end

  def test_clip_grad_norm_scales_every_gradient_by_the_total_norm
    ps = grads_of([[3.0, 0.0, 0.0], [0.0, 4.0]]) # total 2-norm 5
    total = Kiln::NN::Utils.clip_grad_norm!(ps, 1.0)
    assert_in_delta 5.0, total.item, 1e-12
    s = 1.0 / (5.0 + 1e-6)
    assert_tensor [3 * s, 0.0, 0.0], ps[0].grad, tol: 1e-12
    assert_tensor [0.0, 4 * s], ps[1].grad, tol: 1e-12
    # under the bound: unchanged
    ps = grads_of([[0.3, 0.4]])
    assert_in_delta 0.5, Kiln::NN::Utils.clip_grad_norm!(ps, 1.0).item, 1e-12
    assert_tensor [0.3, 0.4], ps[0].grad, tol: 1e-12
    # the max norm, and p = 1
    ps = grads_of([[-6.0, 1.0], [2.0]])
    assert_in_delta 6.0, Kiln::NN::Utils.clip_grad_norm!(ps, 3.0, norm_type: Float::INFINITY).item, 1e-12
    assert_tensor [-6.0 * 3 / (6 + 1e-6), 1.0 * 3 / (6 + 1e-6)], ps[0].grad, tol: 1e-12
    ps = grads_of([[-6.0, 1.0], [2.0]])
    assert_in_delta 9.0, Kiln::NN::Utils.clip_grad_norm!(ps, 100.0, norm_type: 1).item, 1e-12
    # a parameter without a gradient is skipped; none at all is a zero norm
    bare = Kiln.tensor([1.0], requires_grad: true)
    assert_in_delta 0.0, Kiln::NN::Utils.clip_grad_norm!([bare], 1.0).item, 0
    ps = grads_of([[Float::NAN]])
    assert_raises(Kiln::Error) { Kiln::NN::Utils.clip_grad_norm!(ps, 1.0, error_if_nonfinite: true) }
  end

  def test_clip_grad_value_clamps_every_gradient
    ps = grads_of([[-3.0, 0.5, 2.0]])
    Kiln::NN::Utils.clip_grad_value!(ps, 1.0)
    assert_tensor [-1.0, 0.5, 1.0], ps[0].grad
  end

  # --- RMSprop and Adagrad against torch's rules -------------------------------------

  def rmsprop_ref(steps, lr:, alpha: 0.99, eps: 1e-8, weight_decay: 0, momentum: 0, centered: false)
    START.each_with_index.map do |x, i|
      sq = ga = buf = 0.0
      steps.times do
        g = x + C[i]
        g += weight_decay * x
        sq = alpha * sq + (1 - alpha) * g * g
        if centered
          ga = alpha * ga + (1 - alpha) * g
          avg = Math.sqrt(sq - ga * ga) + eps
        else
          avg = Math.sqrt(sq) + eps
        end
        if momentum.zero?
          x -= lr * g / avg
        else
          buf = momentum * buf + g / avg
          x -= lr * buf
        end
      end
      x
    end
  end

  def test_rmsprop_follows_torch
    [{ lr: 0.01 }, { lr: 0.05, alpha: 0.9, weight_decay: 0.1 },
     { lr: 0.02, momentum: 0.9, centered: true }, { lr: 0.01, centered: true, eps: 1e-3 }].each do |kw|
      got = run_kiln(5) { |ps| Kiln::Optim::RMSprop.new(ps, **kw) }
      rmsprop_ref(5, **kw).zip(got) { |e, a| assert_in_delta e, a, 1e-12, kw.inspect }
    end
    assert_raises(ArgumentError) { Kiln::Optim::RMSprop.new([Kiln.ones(1, requires_grad: true)], alpha: 1.0) }
  end

  def adagrad_ref(steps, lr:, lr_decay: 0, weight_decay: 0, initial_accumulator_value: 0, eps: 1e-10)
    START.each_with_index.map do |x, i|
      sum = initial_accumulator_value.to_f
      (1..steps).each do |t|
        g = x + C[i] + weight_decay * x
        clr = lr / (1 + (t - 1) * lr_decay)
        sum += g * g
        x -= clr * g / (Math.sqrt(sum) + eps)
      end
      x
    end
  end

  def test_adagrad_follows_torch
    [{ lr: 0.1 }, { lr: 0.5, lr_decay: 0.1, weight_decay: 0.05 },
     { lr: 0.2, initial_accumulator_value: 0.5, eps: 1e-6 }].each do |kw|
      got = run_kiln(6) { |ps| Kiln::Optim::Adagrad.new(ps, **kw) }
      adagrad_ref(6, **kw).zip(got) { |e, a| assert_in_delta e, a, 1e-12, kw.inspect }
    end
  end

  # the same trace every step once warm (as Adam: the first steps read
  # fresh state, then what the flush learned to keep): the state tensors
  # are rebound, never grown
  def test_rmsprop_steps_reuse_one_trace
    p = Kiln.tensor(START, dtype: :float64, requires_grad: true)
    opt = Kiln::Optim::RMSprop.new([p], lr: 0.01, momentum: 0.5)
    seen = nil
    10.times do |i|
      opt.zero_grad
      step_loss(p)
      opt.step
      p.to_a
      seen = Kiln.stats[:traces_seen] if i == 5
    end
    assert_equal seen, Kiln.stats[:traces_seen]
  end

  # --- ReduceLROnPlateau ------------------------------------------------------------

  def test_reduce_lr_on_plateau_cuts_after_patience
    opt = Kiln::Optim::SGD.new([Kiln.ones(1, requires_grad: true)], lr: 1.0)
    sched = Kiln::Optim::LRScheduler::ReduceLROnPlateau.new(opt, factor: 0.5, patience: 2, min_lr: 0.2)
    lrs = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95].map do |m|
      sched.step(Kiln.tensor(m))
      opt.param_groups[0][:lr]
    end
    # best 0.9 at epoch 2; bad epochs 3, 4, 5: the third (> patience 2) cuts;
    # three more cut again; then the floor
    assert_equal [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25], lrs
    4.times { sched.step(0.95) }
    assert_in_delta 0.2, opt.param_groups[0][:lr], 1e-15
  end

  def test_reduce_lr_on_plateau_max_mode_threshold_and_cooldown
    opt = Kiln::Optim::SGD.new([Kiln.ones(1, requires_grad: true)], lr: 1.0)
    sched = Kiln::Optim::LRScheduler::ReduceLROnPlateau.new(opt, mode: :max, factor: 0.1, patience: 0,
                                                                 threshold: 0.1, threshold_mode: :abs, cooldown: 1)
    # 0.5 best; 0.55 is within the 0.1 threshold: bad -> cut; cooldown 1
    # epoch (no count); then bad again -> cut
    lrs = [0.5, 0.55, 0.56, 0.57].map do |m|
      sched.step(m)
      opt.param_groups[0][:lr]
    end
    assert_equal [1.0, 0.1, 0.1, 0.010000000000000002], lrs
    assert_raises(ArgumentError) { Kiln::Optim::LRScheduler::ReduceLROnPlateau.new(opt, factor: 1.0) }
    assert_raises(ArgumentError) { Kiln::Optim::LRScheduler::ReduceLROnPlateau.new(opt, mode: :median) }
  end

  # --- NN::Init ---------------------------------------------------------------------

  def test_init_gains_and_fans
    assert_in_delta Math.sqrt(2), Kiln::NN::Init.calculate_gain(:relu), 1e-15
    assert_in_delta 5.0 / 3, Kiln::NN::Init.calculate_gain("tanh"), 1e-15
    assert_in_delta Math.sqrt(2.0 / (1 + 0.2**2)), Kiln::NN::Init.calculate_gain(:leaky_relu, 0.2), 1e-15
    assert_equal [3 * 5 * 5, 8 * 5 * 5], Kiln::NN::Init.calculate_fan_in_and_fan_out(Kiln.empty(8, 3, 5, 5))
    assert_raises(Kiln::ShapeError) { Kiln::NN::Init.xavier_uniform!(Kiln.empty(4)) }
    assert_raises(ArgumentError) { Kiln::NN::Init.calculate_gain(:swish) }
  end

  def test_init_writes_in_place_with_torchs_statistics
    Kiln.manual_seed(7)
    w = Kiln::NN::Linear.new(400, 300).weight
    assert_same w, Kiln::NN::Init.xavier_uniform!(w)
    a = Math.sqrt(6.0 / 700)
    v = w.to_a.flatten
    assert v.all? { |x| x.abs <= a }
    assert_in_delta a * a / 3, v.sum { |x| x * x } / v.size, a * a / 3 * 0.02
    assert w.requires_grad, "still a parameter"
    Kiln::NN::Init.kaiming_normal!(w, mode: :fan_out, nonlinearity: :relu)
    std = Math.sqrt(2.0) / Math.sqrt(300)
    v = w.to_a.flatten
    assert_in_delta 0.0, v.sum / v.size, std * 0.02
    assert_in_delta std, Math.sqrt(v.sum { |x| x * x } / v.size), std * 0.02
    Kiln::NN::Init.constant!(w, 0.25)
    assert w.to_a.flatten.all? { |x| x == 0.25 }
    e = Kiln.empty(2, 3)
    assert_tensor [[1, 0, 0], [0, 1, 0]], Kiln::NN::Init.eye!(e)
    assert_tensor [0.0, 0.0], Kiln::NN::Init.zeros!(Kiln.ones(2))
    assert_raises(Kiln::DTypeError) { Kiln::NN::Init.ones!(Kiln.tensor([1, 2])) }
  end

  # --- Conv1d -----------------------------------------------------------------------

  # the definition, in plain Ruby: out[n][o][l]
  def conv1d_ref(x, w, b, stride, padding, dilation, groups)
    n, c, len = x.size, x[0].size, x[0][0].size
    o_ch, cg, k = w.size, w[0].size, w[0][0].size
    out_len = (len + 2 * padding - dilation * (k - 1) - 1) / stride + 1
    Array.new(n) do |ni|
      Array.new(o_ch) do |o|
        g = o / (o_ch / groups)
        Array.new(out_len) do |l|
          s = b ? b[o] : 0.0
          cg.times do |ci|
            k.times do |ki|
              pos = l * stride - padding + ki * dilation
              s += x[ni][g * cg + ci][pos] * w[o][ci][ki] if pos >= 0 && pos < len
            end
          end
          s
        end
      end
    end.tap { c }
  end

  def test_conv1d_matches_its_definition
    Kiln.manual_seed(3)
    [[4, 6, 3, {}], [4, 6, 3, { stride: 2, padding: 2 }], [4, 4, 2, { dilation: 2, padding: 1, groups: 2 }]]
      .each do |cin, cout, k, kw|
      conv = Kiln::NN::Conv1d.new(cin, cout, k, **kw)
      x = Kiln.randn(2, cin, 9)
      got = conv.(x)
      want = conv1d_ref(x.to_a, conv.weight.to_a, conv.bias.to_a, kw[:stride] || 1, kw[:padding] || 0,
                        kw[:dilation] || 1, kw[:groups] || 1)
      assert_tensor want, got, tol: 1e-5
    end
    err = assert_raises(Kiln::ShapeError) { Kiln::NN::Functional.conv1d(Kiln.randn(2, 3), Kiln.randn(1, 3, 2)) }
    assert_match(/\[N, C, L\]/, err.message)
  end

  # the weight's gradient against central differences in float64
  def test_conv1d_gradient_matches_finite_differences
    Kiln.manual_seed(5)
    x = Kiln.randn(2, 3, 7, dtype: :float64)
    w = Kiln.randn(4, 3, 3, dtype: :float64, requires_grad: true)
    loss = ->(wt) { (Kiln::NN::Functional.conv1d(x, wt, nil, stride: 2, padding: 1)**2).sum }
    loss.(w).backward
    grad = w.grad.to_a.flatten
    base = w.detach.to_a.flatten
    h = 1e-6
    [0, 7, 20, 35].each do |i|
      up = base.dup.tap { |a| a[i] += h }
      dn = base.dup.tap { |a| a[i] -= h }
      fd = (loss.(Kiln.tensor(up, dtype: :float64).reshape(4, 3, 3)).item -
            loss.(Kiln.tensor(dn, dtype: :float64).reshape(4, 3, 3)).item) / (2 * h)
      assert_in_delta fd, grad[i], 1e-6 * [1, fd.abs].max
    end
  end
end
