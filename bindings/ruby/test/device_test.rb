# frozen_string_literal: true

require_relative "test_helper"

# Devices from Ruby: the CPU always; CUDA where a GPU is (on a machine
# without one, asking for it is a Kiln::Error with status :device and the
# reason, never a crash).
class DeviceTest < Minitest::Test
  def test_cpu_tensors_and_moves
    x = Kiln.tensor([1.0, 2.0, 3.0])
    assert_equal :cpu, x.device
    refute x.cuda?
    y = x.cpu
    assert_equal :cpu, y.device
    assert_tensor [1.0, 2.0, 3.0], y
    assert_tensor [1.0, 2.0, 3.0], x.to(:cpu)
    z = x.to(:cpu, :float64)
    assert_equal :float64, z.dtype
    assert_equal :float64, x.to(dtype: :float64).dtype
  end

  def test_device_info
    assert_match(/CPU, .*threads/, Kiln.device_info(:cpu))
    refute_empty Kiln::CUDA.info
    assert_raises(ArgumentError) { Kiln.device_info(:tpu) }
    assert_raises(Kiln::DTypeError) { Kiln.ones(2).to(:tpu) } # neither a device nor a dtype
  end

  def test_cuda_without_a_gpu_is_a_device_error
    skip "a CUDA device is present: the GPU suite (scripts/gpu-check) covers it" if Kiln::CUDA.available?
    x = Kiln.ones(3) * 2
    e = assert_raises(Kiln::Error) { x.cuda }
    assert_equal :device, e.status
    assert_match(/no CUDA device is available/, e.message)
    assert_raises(Kiln::Error) { x.to(:cuda) }
    assert_tensor [2.0, 2.0, 2.0], x # nothing lost
  end

  def test_cuda_round_trip
    skip "no CUDA device here" unless Kiln::CUDA.available?
    x = Kiln.tensor([[1.0, -2.0], [3.5, 4.0]])
    g = x.cuda
    assert_equal :cuda, g.device
    y = ((g * 2).relu + 1).sum(1)
    assert_equal :cuda, y.device
    assert_tensor [4.0, 17.0], y.cpu # [[2, 0], [7, 8]] + 1, summed
    e = assert_raises(Kiln::Error) { g + x }
    assert_equal :device, e.status
  end

  # bf16, f16 and the small integers on the device (issue 41): each op
  # rounds as the CPU's does, a half matmul is one GemmEx, and a model
  # trained under bf16 autocast keeps f32 weights and gradients
  def test_halves_and_bytes_on_cuda
    skip "no CUDA device here" unless Kiln::CUDA.available?
    x = Kiln.tensor([[1.0, -2.5, 0.1], [3.0, 0.3, -7.75]])
    %i[bfloat16 float16].each do |dt|
      h = x.to(:cuda, dt)
      assert_equal [:cuda, dt], [h.device, h.dtype]
      y = ((h * 3.1) + 1).relu
      assert_equal :cuda, y.device
      assert_equal (((x.to(dt) * 3.1) + 1).relu).to_a, y.cpu.to_a, "#{dt}: the CPU's bits"
      m = h.matmul(h.t)
      assert_equal dt, m.dtype
      want = x.matmul(x.t).to_a.flatten
      m.cpu.to_a.flatten.zip(want).each { |g, w| assert_in_delta w, g, 0.02 * [w.abs, 1].max }
    end
    u = Kiln.tensor([250, 7], dtype: :uint8).cuda
    assert_equal [244, 14], (u + u).cpu.to_a # wraps
    assert_equal [-12, 14], (u.to(dtype: :int8) * 2).cpu.to_a # 250 is -6 as int8
    # the same model and steps on each device: the GPU follows the CPU's
    # losses (GEMMs in bf16 on both, summed in other orders) and learns
    Kiln.manual_seed(5)
    init = Kiln::NN::Linear.new(3, 2)
    losses = %i[cpu cuda].map do |dev|
      model = Kiln::NN::Linear.new(3, 2)
      model.weight.assign!(init.weight.detach)
      model.bias.assign!(init.bias.detach)
      model = model.to(dev)
      xd, target = x.to(dev), Kiln.tensor([[0.5, -1.0], [1.0, 2.0]]).to(dev)
      5.times.map do
        loss = Kiln::AMP.autocast(:bfloat16) { ((model.(xd) - target)**2).mean }
        loss.backward
        assert_equal [dev, :float32], [model.weight.grad.device, model.weight.grad.dtype]
        model.parameters.each do |p|
          p.sub_scaled!(p.grad, 0.01)
          p.grad = nil
        end
        loss.item
      end
    end
    losses[1].zip(losses[0]).each { |g, c| assert_in_delta c, g, 0.02 * c }
    assert_operator losses[1].last, :<, losses[1].first
  end

  # the calls users make every day give the CPU's values on the device:
  # numbers next to a CUDA tensor become fills there (never a CPU tensor
  # in a CUDA op), modules and optimizers move with .cuda
  def test_everyday_calls_on_cuda
    skip "no CUDA device here" unless Kiln::CUDA.available?
    f = Kiln::NN::Functional
    calls = {
      "fill!" => ->(x, _d) { y = x.clone; y.fill!(3); y },
      "clamp" => ->(x, _d) { x.clamp(-1, 1) + x.clamp_min(0) },
      "where" => ->(x, _d) { Kiln.where(x > 0, x, 0.0) },
      "pow and reflected ops" => ->(x, _d) { (x**2) + (2**x) + (1 - x) + (1.0 / x) },
      "masked_fill!" => ->(x, _d) { y = x.clone; y.masked_fill!(x > 0, -1.5); y },
      "copy! broadcast" => ->(x, d) { y = x.clone; y.copy!(Kiln.tensor([1.0, 2.0, 3.0]).to(d)); y },
      "lerp addcmul" => ->(x, _d) { x.lerp(x * 2, 0.5).addcmul(x, x, value: 0.5) },
      "rows" => ->(x, _d) { x.softmax(-1) + x.log_softmax(-1) + x.cumsum(1) + x.triu(0) },
      "reductions" => ->(x, _d) { Kiln.stack([x.mean, x.std, x.norm, x.max]) },
      "like" => ->(x, _d) { Kiln.full_like(x, 2.0) + Kiln.ones_like(x) + x.new_full([3], 3.0) },
      "activations" => ->(x, _d) { f.relu(x) + f.gelu(x) + f.normalize(x) },
      "losses" => ->(x, d) { f.mse_loss(x, x * 0.5) + f.cross_entropy(x, Kiln.tensor([0, 2]).to(d)) },
      "pad" => ->(x, _d) { f.pad(x, [1, 1]) },
      "modules" => lambda do |x, d|
        Kiln.manual_seed(7)
        h = Kiln::NN::LayerNorm.new(2).to(d).(Kiln::NN::Linear.new(3, 2).to(d).(x))
        m = Kiln::NN::MultiheadAttention.new(2, 1).to(d)
        m.(h.unsqueeze(0), h.unsqueeze(0), h.unsqueeze(0))[0]
      end,
      "adam step" => lambda do |x, d|
        Kiln.manual_seed(8)
        l = Kiln::NN::Linear.new(3, 1).to(d)
        opt = Kiln::Optim::Adam.new(l.parameters, lr: 0.1)
        2.times do
          opt.zero_grad
          l.(x).sum.backward
          Kiln::NN::Utils.clip_grad_norm!(l.parameters, 0.5)
          opt.step
        end
        l.weight
      end
    }
    x = Kiln.tensor([[1.0, -2.5, 0.1], [3.0, 0.3, -7.75]])
    calls.each do |name, fn|
      want = [fn.(x, :cpu).to_a].flatten
      got = fn.(x.cuda, :cuda)
      assert_equal :cuda, got.device, name
      [got.cpu.to_a].flatten.zip(want).each { |g, w| assert_in_delta w, g, 1e-5 * [w.abs, 1].max, name }
    end
  end

  # attention on the device is the attention primitive (issue 40): the
  # CPU's values and gradients; written the long way (a triu mask through
  # masked_fill, softmax) it is recorded as the causal op, with its bits
  def test_attention_on_cuda
    skip "no CUDA device here" unless Kiln::CUDA.available?
    f = Kiln::NN::Functional
    Kiln.manual_seed(3)
    qkv = Array.new(3) { Kiln.randn(2, 3, 20, 16) }
    w = Kiln.randn(2, 3, 20, 16)
    outs = %i[cpu cuda].map do |dev|
      q, k, v = qkv.map { |t| t.to(dev).requires_grad! }
      o = f.scaled_dot_product_attention(q, k, v, is_causal: true)
      assert_equal dev, o.device
      (o * w.to(dev)).sum.backward
      [o, q.grad, k.grad, v.grad].map { |t| t.cpu.to_a.flatten }
    end
    outs[0].zip(outs[1]).each do |c, g|
      g.zip(c).each { |gv, cv| assert_in_delta cv, gv, 2e-5 * [cv.abs, 1].max }
    end
    q, k, v = qkv.map(&:cuda)
    before = Kiln.stats[:attention_rewrites]
    mask = Kiln.ones(20, 20, dtype: :bool).cuda.triu(1)
    long = q.matmul(k.transpose(-2, -1)).*(0.25).masked_fill(mask, -Float::INFINITY).softmax(-1).matmul(v)
    assert_equal 1, Kiln.stats[:attention_rewrites] - before
    assert_equal f.scaled_dot_product_attention(q, k, v, is_causal: true).cpu.to_a, long.cpu.to_a
  end

  # a GRU cell called in an `each` over the time steps, on CUDA: rolled
  # there as on the CPU (issue #39), forward and backward, the weights'
  # sums over the steps one GEMM after the loop; the CPU's losses and
  # gradients
  def test_a_ruby_loop_rolls_on_cuda
    skip "no CUDA device here" unless Kiln::CUDA.available?
    Kiln.manual_seed(5)
    b, i, h = 4, 6, 8
    init = [Kiln.randn(i, 3 * h) * 0.3, Kiln.randn(h, 3 * h) * 0.3, Kiln.zeros(3 * h)]
    xs = Kiln.randn(7, b, i)
    runs = %i[cpu cuda].map do |dev|
      wx, wh, bias = init.map { |t| t.to(dev).detach.requires_grad! }
      x = xs.to(dev)
      before = Kiln.stats
      state = Kiln.zeros(b, h).to(dev)
      outs = (0...7).map do |t|
        g = x[t].matmul(wx) + bias
        u = state.matmul(wh)
        r = (g[0.., 0...h] + u[0.., 0...h]).sigmoid
        z = (g[0.., h...2 * h] + u[0.., h...2 * h]).sigmoid
        n = (g[0.., 2 * h..] + r * u[0.., 2 * h..]).tanh
        state = n + z * (state - n)
      end
      loss = (Kiln.stack(outs, 0) ** 2).mean
      assert_equal dev, loss.device
      value = loss.item
      loss.backward
      grads = [wx, wh, bias].map { |p| p.grad.cpu.to_a.flatten }
      after = Kiln.stats
      [value, grads, after[:loops_rolled] - before[:loops_rolled], after[:loop_sums] - before[:loop_sums]]
    end
    cpu, cuda = runs
    assert_operator cuda[2], :>=, 2, "forward and backward rolled on the device"
    assert_operator cuda[3], :>=, 2, "the weights' sums left the loop"
    assert_in_delta cpu[0], cuda[0], 1e-5 * [cpu[0].abs, 1].max
    cpu[1].flatten.zip(cuda[1].flatten).each { |c, g| assert_in_delta c, g, 1e-5 * [c.abs, 1].max }
  end
end
