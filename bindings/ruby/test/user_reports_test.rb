# frozen_string_literal: true

require_relative "test_helper"

# What a user trying torch-rb programs on Kiln ran into (expected values
# from PyTorch 1.13 on the same inputs).
class UserReportsTest < Minitest::Test
  NN = Kiln::NN
  F = Kiln::NN::F

  def assert_close(expected, actual, tol = 1e-6)
    assert_equal expected.flatten.size, actual.flatten.size
    expected.flatten.zip(actual.flatten).each { |e, a| assert_in_delta e, a, tol * [1, e.abs].max }
  end

  # LogSoftmax.new recursed until SystemStackError, whatever its arguments
  def test_log_softmax_module_builds_and_runs
    out = NN::LogSoftmax.new(dim: 1).call(Kiln.tensor([[1.0, 2.0]]))
    assert_close [[-1.3132616, -0.3132617]], out.to_a
    assert_close [[-1.3132616, -0.3132617]], NN::LogSoftmax.new(1).call(Kiln.tensor([[1.0, 2.0]])).to_a
    net = NN::Sequential.new(NN::Linear.new(2, 3), NN::LogSoftmax.new(dim: 1))
    assert_close [1.0, 1.0], net.call(Kiln.ones(2, 2)).exp.sum(1).to_a
  end

  # the gradient of a norm at a zero vector is 0, as torch's, not NaN
  def test_norm_gradient_at_zero_is_zero
    x = Kiln.tensor([0.0, 0.0], requires_grad: true)
    x.norm.backward
    assert_equal [0.0, 0.0], x.grad.to_a
    x = Kiln.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad: true)
    x.norm(dim: 1).sum.backward
    assert_close [[0.0, 0.0], [0.6, 0.8]], x.grad.to_a
    x = Kiln.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad: true)
    F.normalize(x, dim: 1).sum.backward # torch: [[1e12, 1e12], [0.032, -0.024]]
    assert_close [[1e12, 1e12], [0.032, -0.024]], x.grad.to_a, 1e-5
    assert_equal [5.0], Kiln.tensor([[3.0, 4.0]]).norm(dim: 1).to_a
  end

  def test_dropout_of_one_is_zeros
    assert_equal [0.0, 0.0, 0.0], NN::Dropout.new(p: 1.0).call(Kiln.ones(3)).to_a
    assert_equal [1.0, 1.0], NN::Dropout.new(p: 1.0).tap(&:eval).call(Kiln.ones(2)).to_a
  end

  # squeeze(dim) of an axis whose size is not 1 leaves the tensor as it is
  def test_squeeze_of_an_axis_not_of_size_one_is_the_tensor
    assert_equal [1, 2], Kiln.tensor([[1.0, 2.0]]).squeeze(1).shape
    assert_equal [2], Kiln.tensor([[1.0, 2.0]]).squeeze(0).shape
    assert_equal [2], Kiln.tensor([[1.0], [2.0]]).squeeze(-1).shape
    assert_raises(Kiln::Error) { Kiln.tensor([[1.0, 2.0]]).squeeze(2) }
  end

  def test_cross_entropy_and_nll_sum_and_none
    l = Kiln.tensor([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]])
    y = Kiln.tensor([1, 2])
    assert_close [0.46436879, 0.10960147], F.cross_entropy(l, y, reduction: "none").to_a
    assert_in_delta 0.57397026, F.cross_entropy(l, y, reduction: "sum").item, 1e-6
    assert_in_delta 0.57397026, NN::CrossEntropyLoss.new(reduction: "sum").call(l, y).item, 1e-6
    assert_close [0.46436879, 0.10960147], NN::NLLLoss.new(reduction: "none").call(l.log_softmax(1), y).to_a
    e = assert_raises(ArgumentError) { NN::BCEWithLogitsLoss.new(reduction: "sum") }
    assert_equal 'Kiln::NN::BCEWithLogitsLoss.new: reduction must be "mean", not "sum"', e.message
    e = assert_raises(ArgumentError) { F.cross_entropy(l, y, reduction: "avg") }
    assert_match(/\AKiln::NN::Functional.cross_entropy: reduction must be/, e.message)
  end

  # zero_grad(set_to_none: false) zeroes the gradients there are
  def test_zero_grad_set_to_none_false_zeroes
    m = NN::Linear.new(2, 2)
    opt = Kiln::Optim::SGD.new(m.parameters, lr: 0.1)
    m.call(Kiln.ones(1, 2)).sum.backward
    opt.zero_grad(set_to_none: false)
    assert_equal [[0.0, 0.0], [0.0, 0.0]], m.weight.grad.to_a
    opt.zero_grad
    assert_nil m.weight.grad
    m.zero_grad(set_to_none: false)
    assert_nil m.weight.grad # none before: none after (torch's)
  end

  # t[idx] = v with a repeated index: the last write lands (torch's CPU
  # t[idx] = v), not the sum of all of them
  def test_index_assignment_with_repeats_keeps_the_last_write
    t = Kiln.zeros(5)
    t[Kiln.tensor([0, 0])] = Kiln.tensor([1.0, 2.0])
    assert_equal [2.0, 0.0, 0.0, 0.0, 0.0], t.to_a
    t = Kiln.zeros(5)
    t[Kiln.tensor([3, 0, 3, 1, 3])] = Kiln.tensor([1.0, 2.0, 5.0, 7.0, 9.0])
    assert_equal [2.0, 7.0, 0.0, 9.0, 0.0], t.to_a
    t = Kiln.zeros(3, 2)
    t[Kiln.tensor([2, 0, 2])] = Kiln.tensor([[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]])
    assert_equal [[2.0, 2.5], [0.0, 0.0], [3.0, 3.5]], t.to_a
    t = Kiln.zeros(3)
    t[Kiln.tensor([1, 1])] = Kiln.tensor([Float::NAN, 2.0]) # an overwritten NaN leaves no trace
    assert_equal [0.0, 2.0, 0.0], t.to_a
    t = Kiln.zeros(4, dtype: :int64)
    t[Kiln.tensor([1, 1])] = 7
    assert_equal [0, 7, 0, 0], t.to_a
  end

  # integer results that have no value are errors, as in torch
  def test_integer_ops_without_a_value_raise
    assert_raises(ArgumentError) { Kiln.tensor([2]) ** -1 }
    assert_raises(ZeroDivisionError) { Kiln.tensor([5]).floor_divide(0) }
    assert_raises(ZeroDivisionError) { Kiln.tensor([5]) % 0 }
    assert_raises(ZeroDivisionError) { Kiln.tensor([5]).fmod(0) }
    e = assert_raises(Kiln::DTypeError) { Kiln.tensor([5]).add!(1.5) }
    assert_match(/add!: its result is float32/, e.message)
    assert_raises(Kiln::DTypeError) { Kiln.tensor([5]).div!(2) }
    assert_equal [4], (Kiln.tensor([2]) ** 2).to_a
    assert_equal [0.5], (Kiln.tensor([2]) ** -1.0).to_a
    assert_equal [2], Kiln.tensor([5]).floor_divide(2).to_a
    assert_equal [2], (Kiln.tensor([5]) % 3).to_a
    assert_equal [7], Kiln.tensor([5]).add!(2).to_a
    assert Kiln.tensor([5.0]).fmod(0).to_a[0].nan?
  end

  # The same training run, three times in one process, and on two threads
  # at once: the same bits every time.  The first run once trained to other
  # bits than the ones after it: Adam's moments were rebound as plain Ruby
  # values, so each step recomputed the last one's; the cache learned to
  # keep them after the first run, whose flushes (and, with the GRU's loop
  # rolled, sums) were cut otherwise.  Also the depth cap rose once a
  # thread had rolled a loop.
  def train_gru_mlp(seed, optimizer)
    Kiln.manual_seed(seed)
    m = NN::Sequential.new(NN::Linear.new(32, 64), NN::Tanh.new, NN::Linear.new(64, 4))
    gru = NN::GRU.new(4, 8)
    ps = m.parameters + gru.parameters
    opt = optimizer == :adam ? Kiln::Optim::Adam.new(ps, lr: 1e-2) : Kiln::Optim::SGD.new(ps, lr: 1e-2, momentum: 0.9)
    x = Kiln.randn(128, 32)
    y = Kiln.randint(0, 4, [128])
    12.times do
      opt.zero_grad
      o = m.call(x)
      s, = gru.call(o.reshape(8, 16, 4))
      (F.cross_entropy(o, y) + s.pow(2).mean).backward
      opt.step
    end
    ps.map(&:to_binary)
  end

  def test_a_training_run_gives_the_same_bits_every_time
    %i[adam sgd].each do |optimizer|
      runs = Array.new(3) { train_gru_mlp(1, optimizer) }
      assert_equal runs[0], runs[1], "#{optimizer}: the first run differs from the second"
      assert_equal runs[1], runs[2], optimizer.to_s
    end
    alone = [train_gru_mlp(1, :adam), train_gru_mlp(2, :adam)]
    together = [Thread.new { train_gru_mlp(1, :adam) }, Thread.new { train_gru_mlp(2, :adam) }].map(&:value)
    assert_equal alone, together, "two threads train as one after the other"
  end

  class Custom < NN::Module
    def initialize
      super()
      @scale = NN::Parameter.new(Kiln.ones(3))
      register_parameter("shift", Kiln.zeros(3))
      add_module("inner", NN::Linear.new(3, 2))
    end

    def forward(x)
      @inner.call(x * @scale + @shift)
    end
  end

  # torch-rb's Parameter, register_parameter, add_module; named_* are Hashes
  def test_custom_module_parameters_as_torch_rb_writes_them
    m = Custom.new
    names = m.named_parameters
    assert_kind_of Hash, names
    assert_equal %w[scale shift inner.weight inner.bias], names.keys
    assert names["shift"].requires_grad
    assert_equal %w[inner], m.named_children.keys
    assert_equal ["", "inner"], m.named_modules.keys
    m.call(Kiln.ones(1, 3)).sum.backward
    assert_equal [3], names["scale"].grad.shape
    p = NN::Parameter.new(Kiln.ones(2), requires_grad: false)
    refute p.requires_grad
    assert_equal [1.0, 2.0], NN::Parameter.new([1.0, 2.0]).to_a
    assert_raises(TypeError) { m.add_module("x", 3) }
  end

  def adam_model
    Kiln.manual_seed(3)
    m = NN::Sequential.new(NN::Linear.new(4, 8), NN::Tanh.new, NN::Linear.new(8, 2))
    [m, Kiln::Optim::Adam.new(m.parameters, lr: 1e-2, amsgrad: true)]
  end

  def adam_steps(m, opt, n)
    x = Kiln.tensor([[0.5, -1.0, 2.0, 0.25], [1.0, 0.0, -0.5, 3.0]])
    n.times do
      opt.zero_grad
      m.call(x).pow(2).sum.backward
      opt.step
    end
  end

  # an optimizer's state_dict through Marshal resumes training to the bits
  # of a run that never stopped
  def test_optimizer_state_dict_resumes_training_exactly
    m, opt = adam_model
    adam_steps(m, opt, 3)
    saved_model = Marshal.dump(m.state_dict)
    saved_opt = Marshal.dump(opt.state_dict)
    adam_steps(m, opt, 2)

    m2, opt2 = adam_model
    m2.load_state_dict(Marshal.load(saved_model))
    opt2.load_state_dict(Marshal.load(saved_opt))
    assert_equal 3, opt2.state[m2.parameters.first][:step]
    adam_steps(m2, opt2, 2)
    assert_equal m.parameters.map(&:to_binary), m2.parameters.map(&:to_binary)

    sd = opt.state_dict
    assert_equal [[0, 1, 2, 3]], sd[:param_groups].map { |g| g[:params] }
    assert_equal 1e-2, sd[:param_groups][0][:lr]
    small, small_opt = adam_model
    small_opt2 = Kiln::Optim::Adam.new(small.parameters.first(2))
    e = assert_raises(ArgumentError) { small_opt2.load_state_dict(sd) }
    assert_match(/parameter groups/, e.message)
    refute_nil small_opt
  end

  # A step whose labels are out of range raises at the read, names the op
  # that failed, and leaves the model and the optimizer as they were: the
  # next step trains (the parameters failed for good, and every later step
  # raised "kiln_backward: index 4 is out of range")
  def test_a_bad_batch_does_not_poison_the_model
    [Kiln::Optim::SGD, Kiln::Optim::Adam].each do |optimizer|
      Kiln.manual_seed(5)
      m = NN::Linear.new(2, 2)
      opt = optimizer.new(m.parameters, lr: 0.1)
      x = Kiln.ones(3, 2)
      step = lambda do |labels|
        opt.zero_grad
        l = F.cross_entropy(m.call(x), labels)
        l.backward
        opt.step
        l.item
      end
      step.call(Kiln.tensor([0, 1, 0]))
      before = m.weight.to_a
      e = assert_raises(Kiln::Error) { step.call(Kiln.tensor([0, 1, 0]) + 4) }
      assert_match(/kiln_cross_entropy: index 4 is out of range/, e.message)
      assert_equal before, m.weight.to_a, optimizer.name
      assert step.call(Kiln.tensor([0, 1, 0])).finite?
      refute_equal before, m.weight.to_a
    end
  end

  # torch-rb's in-place unary forms and eye(n, m)
  def test_in_place_forms_and_eye_n_m
    t = Kiln.tensor([-1.0, 2.0, -3.0])
    view = t[0..]
    assert_same t, t.relu!
    assert_equal [0.0, 2.0, 0.0], t.to_a
    assert_equal [-1.0, 2.0, -3.0], view.to_a # taken before: the old value
    t = Kiln.tensor([-1.0, 2.0, 9.0])
    t.clamp!(-0.5, 3.0)
    assert_equal [-0.5, 2.0, 3.0], t.to_a
    t.clamp!(min: 2.5)
    assert_equal [2.5, 2.5, 3.0], t.to_a
    t = Kiln.tensor([1.0, 2.0])
    t.pow!(2)
    t.sqrt!
    t.neg!
    assert_equal [-1.0, -2.0], t.to_a
    t = Kiln.tensor([1, -2])
    assert_equal [1, 2], t.abs!.to_a
    assert_raises(Kiln::DTypeError) { Kiln.tensor([1, 4]).sqrt! }
    assert_equal [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], Kiln.eye(2, 3).to_a
    assert_equal [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], Kiln.eye(3, 2).to_a
    assert_equal [[1.0, 0.0], [0.0, 1.0]], Kiln.eye(2).to_a
  end
end
