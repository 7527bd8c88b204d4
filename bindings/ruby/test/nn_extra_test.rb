# frozen_string_literal: true

require_relative "test_helper"

# lib/kiln/nn_extra.rb: activations, losses, normalizations, padding and
# pooling against values computed by hand, and their modules
class NNExtraTest < Minitest::Test
  F = Kiln::NN::Functional

  def x
    Kiln.tensor([-2.0, -0.5, 0.0, 1.0, 30.0], dtype: :float64)
  end

  def sig(v)
    1 / (1 + Math.exp(-v))
  end

  def test_activations
    assert_tensor x.to_a.map { |v| v * sig(v) }, F.silu(x), tol: 1e-12
    assert_tensor [-0.2, -0.05, 0.0, 1.0, 30.0], F.leaky_relu(x, 0.1), tol: 1e-12
    assert_tensor x.to_a.map { |v| v.positive? ? v : Math.exp(v) - 1 }, F.elu(x), tol: 1e-12
    softplus = x.to_a.map { |v| v > 20 ? v : Math.log(1 + Math.exp(v)) }
    assert_tensor softplus, F.softplus(x), tol: 1e-12
    assert_tensor x.to_a.zip(softplus).map { |v, s| v * Math.tanh(s) }, F.mish(x), tol: 1e-12
    assert_tensor [-1.0, -0.5, 0.0, 1.0, 1.0], F.hardtanh(x)
    assert_tensor [0.0, 0.0, 0.0, 1.0, 6.0], F.relu6(x)
    assert_tensor [-1 / 3.0, -0.5 * (0.5 - 0.5 / 6), 0.0, 2 / 3.0, 30.0], F.hardswish(x), tol: 1e-12
    assert_tensor softplus.zip(x.to_a).map { |_, v| -Math.log(1 + Math.exp(-v)) }, F.logsigmoid(x), tol: 1e-12
    assert_tensor x.to_a.map { |v| v / (1 + v.abs) }, F.softsign(x), tol: 1e-12
    assert_tensor F.leaky_relu(x, 0.2).to_a, Kiln::NN::LeakyReLU.new(0.2).(x)
    assert_tensor F.elu(x, 2.0).to_a, Kiln::NN::ELU.new(alpha: 2.0).(x)
    assert_tensor F.silu(x).to_a, Kiln::NN::SiLU.new.(x)
    assert_tensor F.hardtanh(x, -0.5, 2.0).to_a, Kiln::NN::Hardtanh.new(-0.5, max_val: 2.0).(x)
    assert_tensor F.celu(x, 2.0).to_a, Kiln::NN::CELU.new(2.0).(x)
    assert_raises(ArgumentError) { Kiln::NN::LeakyReLU.new(negtive_slope: 0.2) } # a typo is an error
    assert_raises(ArgumentError) { Kiln::NN::ELU.new(1.0, 2.0) }
    w = Kiln.tensor([0.3, -1.2], dtype: :float64, requires_grad: true)
    F.silu(w).sum.backward
    assert_tensor w.to_a.map { |v| sig(v) * (1 + v * (1 - sig(v))) }, w.grad, tol: 1e-12
  end

  def test_losses
    y = Kiln.tensor([0.0, 0.0, 0.5, 1.0, 28.0], dtype: :float64) # |x - y| = 2, .5, .5, 0, 2
    assert_in_delta 1.0, F.l1_loss(x, y).item, 1e-12
    assert_in_delta 5.0, Kiln::NN::L1Loss.new(reduction: "sum").(x, y).item, 1e-12
    assert_in_delta (1.5 + 0.125 + 0.125 + 0 + 1.5) / 5, F.smooth_l1_loss(x, y).item, 1e-12
    assert_in_delta (2 + 0.125 + 0.125 + 0 + 2) / 5, F.huber_loss(x, y, delta: 2.0).item, 1e-12
    p = Kiln.tensor([0.9, 0.2, 0.5], dtype: :float64)
    t = Kiln.tensor([1.0, 0.0, 1.0], dtype: :float64)
    assert_in_delta(-(Math.log(0.9) + Math.log(0.8) + Math.log(0.5)) / 3, Kiln::NN::BCELoss.new.(p, t).item, 1e-12)
    lp = Kiln.tensor([[0.2, 0.8]], dtype: :float64).log
    q = Kiln.tensor([[0.5, 0.5]], dtype: :float64)
    assert_in_delta 0.5 * Math.log(0.5 / 0.2) + 0.5 * Math.log(0.5 / 0.8), F.kl_div(lp, q, reduction: "batchmean").item, 1e-12
    assert_raises(Kiln::ShapeError) { F.l1_loss(x, Kiln.zeros(4)) }
    assert_raises(ArgumentError) { F.l1_loss(x, y, reduction: "max") }
  end

  def test_normalizations_and_similarities
    m = Kiln.tensor([[3.0, 4.0], [1.0, 0.0]], dtype: :float64)
    assert_tensor [[0.6, 0.8], [1.0, 0.0]], F.normalize(m)
    assert_tensor [0.96, 0.0], F.cosine_similarity(m, Kiln.tensor([[4.0, 3.0], [0.0, 1.0]], dtype: :float64))
    img = Kiln.randn(2, 4, 3, 3, dtype: :float64)
    y = Kiln::NN::GroupNorm.new(2, 4).(img)
    g = y.reshape(2, 2, -1)
    assert_tensor [[0.0, 0.0], [0.0, 0.0]], g.mean(dim: -1), tol: 1e-12
    assert_tensor [[1.0, 1.0], [1.0, 1.0]], g.var(dim: -1, unbiased: false), tol: 1e-4
    bn = Kiln::NN::BatchNorm1d.new(3)
    assert_tensor [0.0, 0.0, 0.0], bn.(Kiln.randn(8, 3)).mean(dim: 0), tol: 1e-5
    assert_equal [4, 3, 6], bn.(Kiln.randn(4, 3, 6)).shape
    assert_raises(Kiln::ShapeError) { bn.(Kiln.randn(4)) }
  end

  def test_padding_and_pooling
    assert_tensor [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]], F.pad(Kiln.ones(2, 2), [1, 0, 0, 1])
    assert_tensor [[1.0, 1.0, 5.0], [1.0, 1.0, 5.0]], F.pad(Kiln.ones(2, 3), [-1, 1], value: 5)
    assert_equal [1, 1, 3, 3], Kiln::NN::ZeroPad2d.new(1).(Kiln.ones(1, 1, 1, 1)).shape
    img = Kiln.arange(25, dtype: :float64).reshape(1, 1, 5, 5)
    assert_tensor [[[[12.0]]]], Kiln::NN::AdaptiveAvgPool2d.new(1).(img)
    # 5 -> 2: rows (and columns) 0..2 and 2..4
    assert_tensor [[[[6.0, 8.0], [16.0, 18.0]]]], F.adaptive_avg_pool2d(img, 2)
    # 10 -> 2 divides: 5 x 5 windows, their means 22, 27, 72, 77 (avg_pool2d)
    assert_tensor [[[[22.0, 27.0], [72.0, 77.0]]]], F.adaptive_avg_pool2d(Kiln.arange(100, dtype: :float64).reshape(1, 1, 10, 10), 2)
  end

  def test_module_dict
    d = Kiln::NN::ModuleDict.new(a: Kiln::NN::Linear.new(2, 3), b: Kiln::NN::SiLU.new)
    assert_equal %w[a b], d.keys
    assert_equal 2, d.parameters.size
    assert_equal %w[a.weight a.bias], d.named_parameters.map(&:first)
    assert_equal [2, 3], d[:a].(Kiln.ones(2, 2)).shape
    assert_raises(TypeError) { d[:c] = 1 }
  end
end

# Embedding's padding_idx and from_pretrained; the schedulers beyond StepLR
class NNExtraEmbeddingAndSchedulersTest < Minitest::Test
  def test_embedding_padding_idx_gets_no_gradient
    e = Kiln::NN::Embedding.new(5, 3, padding_idx: 0)
    assert_tensor [0.0, 0.0, 0.0], e.weight[0]
    e.(Kiln.tensor([[0, 2, 0], [1, 0, 4]])).sum.backward
    assert_tensor [[0.0] * 3, [1.0] * 3, [1.0] * 3, [0.0] * 3, [1.0] * 3], e.weight.grad
    assert_equal 4, Kiln::NN::Embedding.new(5, 3, padding_idx: -1).padding_idx
    assert_raises(ArgumentError) { Kiln::NN::Embedding.new(5, 3, padding_idx: 5) }
    f = Kiln::NN::Embedding.from_pretrained(Kiln.arange(6, dtype: :float32).reshape(3, 2))
    assert_tensor [[4.0, 5.0], [2.0, 3.0]], f.(Kiln.tensor([2, 1]))
    refute f.weight.requires_grad
    assert Kiln::NN::Embedding.from_pretrained(Kiln.ones(2, 2), freeze: false).weight.requires_grad
  end

  def lrs(scheduler_class, *args, steps: 6, **kw)
    opt = Kiln::Optim::SGD.new([Kiln.zeros(1, requires_grad: true)], lr: 1.0)
    s = scheduler_class.new(opt, *args, **kw)
    Array.new(steps) { opt.param_groups[0][:lr].tap { s.step } }
  end

  def test_schedulers
    s = Kiln::Optim::LRScheduler
    assert_equal [1.0, 1.0, 0.5, 0.5, 0.25, 0.25], lrs(s::MultiStepLR, milestones: [4, 2], gamma: 0.5)
    assert_equal [1.0, 0.5, 0.25], lrs(s::ExponentialLR, gamma: 0.5, steps: 3)
    assert_equal [0.5, 0.625, 0.75, 0.875, 1.0, 1.0], lrs(s::LinearLR, start_factor: 0.5, total_iters: 4)
    got = lrs(s::LambdaLR, ->(e) { 0.9**e }, steps: 4)
    [1.0, 0.9, 0.81, 0.729].zip(got).each { |w, g| assert_in_delta w, g, 1e-12 }
  end
end

# MultiheadAttention hands is_causal and a single bool mask to the fused op
# (the causal one as its causal flag): the same outputs as the additive
# float mask torch's docs describe
class MultiheadAttentionMasksTest < Minitest::Test
  def test_causal_and_bool_masks_match_the_additive_mask
    Kiln.manual_seed(4)
    mha = Kiln::NN::MultiheadAttention.new(16, 4, batch_first: true)
    x = Kiln.randn(2, 7, 16)
    later = Kiln.ones(7, 7, dtype: :bool).triu(1)
    additive = Kiln.zeros(7, 7).masked_fill(later, -Float::INFINITY)
    want, = mha.(x, x, x, attn_mask: additive, need_weights: false)
    [{ attn_mask: later }, { is_causal: true }].each do |kw|
      got, = mha.(x, x, x, need_weights: false, **kw)
      assert_tensor want.to_a, got, tol: 1e-5
    end
    # a mask that is not causal, and one with a key padding mask (the additive path)
    odd = Kiln.tensor(Array.new(7) { |i| Array.new(7) { |j| (i + j).odd? && j != i } })
    want, = mha.(x, x, x, attn_mask: Kiln.zeros(7, 7).masked_fill(odd, -Float::INFINITY), need_weights: false)
    got, = mha.(x, x, x, attn_mask: odd, need_weights: false)
    assert_tensor want.to_a, got, tol: 1e-5
    pad = Kiln.tensor([[false] * 6 + [true], [false] * 7])
    got, = mha.(x, x, x, attn_mask: later, key_padding_mask: pad, need_weights: false)
    weights_path, = mha.(x, x, x, attn_mask: later, key_padding_mask: pad, need_weights: true)
    assert_tensor weights_path.to_a, got, tol: 1e-5
  end
end
