# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/digits"

# Mixed precision from Ruby (issue #41): autocast, the f16 loss scaler, and
# optimizers keeping float32 master weights for half parameters; the
# digits MLP trained under bf16 autocast reaches its float32 accuracy.
class AmpTest < Minitest::Test
  def test_autocast_runs_linear_layers_in_the_half_dtype
    lin = Kiln::NN::Linear.new(8, 4)
    x = Kiln.randn(3, 8)
    assert_nil Kiln::AMP.autocast_dtype
    y = Kiln::AMP.autocast(:bfloat16) do
      assert_equal :bfloat16, Kiln::AMP.autocast_dtype
      x.matmul(lin.weight.t)
    end
    assert_nil Kiln::AMP.autocast_dtype # restored
    assert_equal :bfloat16, y.dtype
    assert_equal x.bfloat16.matmul(lin.weight.t.bfloat16).to_a, y.to_a
    out = Kiln::AMP.autocast(:bfloat16) { lin.(x) } # + the f32 bias: f32
    assert_equal :float32, out.dtype
    out.sum.backward
    assert_equal :float32, lin.weight.grad.dtype
    assert_equal :float32, Kiln::AMP.autocast(:float16, enabled: false) { x.matmul(lin.weight.t) }.dtype
    assert_raises(Kiln::DTypeError) { Kiln::AMP.autocast(:int32) { nil } }
  end

  def test_matmul_precision
    assert_equal :highest, Kiln.matmul_precision
    Kiln.matmul_precision = :tf32
    assert_equal :tf32, Kiln.matmul_precision
    assert_raises(Kiln::Error) { Kiln.matmul_precision = :fast }
    assert_equal :tf32, Kiln.matmul_precision
  ensure
    Kiln.matmul_precision = :highest
  end

  def test_grad_scaler_skips_a_step_with_an_inf_and_recovers
    w = Kiln.tensor([1.0, 2.0], requires_grad: true)
    opt = Kiln::Optim::SGD.new([w], lr: 0.5)
    scaler = Kiln::AMP::GradScaler.new(init_scale: 1024.0, growth_interval: 2)
    step = lambda do |inject|
      opt.zero_grad
      loss = (w * w).sum
      scaler.scale(loss).backward
      w.grad = Kiln.tensor([Float::INFINITY, 1.0]) if inject
      scaler.step(opt)
      scaler.update
    end
    step.(false) # grad 2w = [2, 4] after unscaling: w -> [0, 0]
    assert_equal [0.0, 0.0], w.to_a
    assert_equal 1024.0, scaler.get_scale
    w2 = w.detach.to_a
    step.(true) # overflow: no step, the scale backs off
    assert_equal w2, w.to_a
    assert_equal 512.0, scaler.get_scale
    step.(false)
    step.(false) # two good steps: the scale grows
    assert_equal 1024.0, scaler.get_scale
    assert_equal({ "scale" => 1024.0, "growth_factor" => 2.0, "backoff_factor" => 0.5, "growth_interval" => 2,
                   "_growth_tracker" => 0 }, scaler.state_dict)
  end

  def test_optimizers_keep_float32_master_weights_for_half_parameters
    # lr * grad far below a bf16 ulp of the weight: a bf16 update alone
    # would round back to the same value every step; the f32 master moves
    w = Kiln.tensor([1.0], dtype: :bfloat16, requires_grad: true)
    opt = Kiln::Optim::SGD.new([w], lr: 1e-3)
    10.times do
      opt.zero_grad
      (w * 1.0).sum.backward # grad 1
      opt.step
    end
    assert_equal :bfloat16, w.dtype
    master = opt.state[w][:master]
    assert_equal :float32, master.dtype
    assert_in_delta 0.99, master.item, 1e-6
    assert_equal Kiln.tensor([0.99]).bfloat16.to_a, w.to_a # the master rounded, not 1.0
  end

  def test_a_module_cast_to_bf16_trains_with_f32_master_weights
    Kiln.manual_seed(3)
    model = Kiln::NN::Sequential.new(Kiln::NN::Linear.new(4, 8), Kiln::NN::ReLU.new, Kiln::NN::Linear.new(8, 2))
    w32 = model.parameters.map { |p| p.detach.to_a }
    assert_same model, model.bfloat16
    model.parameters.each do |p|
      assert_equal :bfloat16, p.dtype
      assert p.requires_grad
    end
    assert_equal w32.map { |a| Kiln.tensor(a).bfloat16.to_a }, model.parameters.map(&:to_a)
    opt = Kiln::Optim::SGD.new(model.parameters, lr: 0.1)
    x = Kiln.randn(5, 4).bfloat16
    loss = model.(x).float.pow(2).mean
    loss.backward
    model.parameters.each { |p| assert_equal :bfloat16, p.grad.dtype }
    opt.step
    opt.state.each_value { |st| assert_equal :float32, st[:master].dtype }
    assert_equal :float32, model.float.parameters.first.dtype
    assert_equal({ "0.weight" => :float32 }, model.state_dict.slice("0.weight").transform_values(&:dtype))
  end

  HIDDEN = 64
  BATCH = 32
  EPOCHS = 25

  def train_digits(autocast, dtype: :bfloat16, scaler: nil, seed: 0)
    xtr, ytr, xte, yte = Digits.split
    Kiln.manual_seed(seed)
    params = [(Kiln.randn(64, HIDDEN) * Math.sqrt(2.0 / 64)).detach, Kiln.zeros(HIDDEN),
              (Kiln.randn(HIDDEN, 10) * Math.sqrt(2.0 / HIDDEN)).detach, Kiln.zeros(10)]
    params.each { |p| p.requires_grad = true }
    opt = Kiln::Optim::SGD.new(params, lr: 0.3)
    forward = lambda do |x|
      w1, b1, w2, b2 = params
      (x.matmul(w1) + b1).relu.matmul(w2) + b2
    end
    rng = Digits::Rng.new(7 + seed)
    order = (0...xtr.shape[0]).to_a
    EPOCHS.times do
      rng.shuffle!(order)
      (0...order.size).step(BATCH) do |start|
        idx = Kiln.tensor(order[start, BATCH])
        opt.zero_grad
        loss = Kiln::AMP.autocast(dtype, enabled: autocast) do
          Kiln.cross_entropy(forward.(xtr.index_select(0, idx)), ytr[idx])
        end
        if scaler
          scaler.scale(loss).backward
          scaler.step(opt)
          scaler.update
        else
          loss.backward
          opt.step
        end
      end
    end
    params.each { |p| assert_equal :float32, p.dtype }
    Kiln.no_grad { forward.(xte).argmax(dim: 1).eq(yte).float.mean.item }
  end

  # Over four seeds (initial weights and batch order): half a point of the
  # 360 test digits is 1.8 of them, finer than one run resolves.  Seed 0
  # alone ends 2 digits below f32 with bf16 matmuls on AMX tiles (1 with
  # vdpbf16ps); over 8 seeds the two differ by 0.07 points
  def test_digits_mlp_in_bf16_mixed_precision_reaches_the_float32_accuracy
    skip "#{Digits::PATH} not found" unless Digits.available?
    seeds = 0...4
    f32 = seeds.sum { |s| train_digits(false, seed: s) } / seeds.size
    bf16 = seeds.sum { |s| train_digits(true, seed: s) } / seeds.size
    puts format("\ndigits MLP: f32 %.2f%%, bf16 autocast %.2f%% (mean of %d seeds)", 100 * f32, 100 * bf16,
                seeds.size) if ENV["KILN_TEST_VERBOSE"]
    assert_operator f32, :>=, 0.95
    assert_operator bf16, :>=, f32 - 0.005, "bf16 #{bf16} against f32 #{f32}"
  end

  # the f16 recipe: autocast to float16 with the dynamic loss scaler.  It
  # trains as well as float32 to within a point (3.6 of the 360 test
  # digits; measured 97.22% against 97.78%: another trajectory, not a loss
  # of precision), and the scale settles at a finite power of two
  def test_digits_mlp_in_f16_with_a_grad_scaler_reaches_the_float32_accuracy
    skip "#{Digits::PATH} not found" unless Digits.available?
    f32 = train_digits(false)
    scaler = Kiln::AMP::GradScaler.new(init_scale: 2.0**16, growth_interval: 100)
    f16 = train_digits(true, dtype: :float16, scaler: scaler)
    puts format("\ndigits MLP: f32 %.2f%%, f16 autocast + GradScaler %.2f%% (scale %g)", 100 * f32, 100 * f16,
                scaler.get_scale) if ENV["KILN_TEST_VERBOSE"]
    assert_operator f16, :>=, f32 - 0.01, "f16 #{f16} against f32 #{f32}"
    assert_operator scaler.get_scale, :>=, 1.0
  end
end
