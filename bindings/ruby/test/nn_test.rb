# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/digits"

# Kiln::NN (issue 17, item 4): modules, parameters, state dicts, the
# functional API, and the torch-rb MLP example ported (Linear + Adam).
class NNTest < Minitest::Test
  NN = Kiln::NN
  F = Kiln::NN::F

  class Block < NN::Module
    def initialize(shared)
      super()
      @fc = NN::Linear.new(4, 4)
      @shared = shared
      @norm = NN::LayerNorm.new(4)
    end

    def forward(x)
      @norm.call(@shared.call(@fc.call(x)).relu)
    end
  end

  class Net < NN::Module
    attr_reader :shared

    def initialize
      super()
      @shared = NN::Linear.new(4, 4, bias: false)
      @blocks = [Block.new(@shared), Block.new(@shared)]
      @head = NN::Linear.new(4, 2)
      @scale = Kiln.ones(2) # no requires_grad: not a parameter
    end

    def forward(x)
      @head.call(@blocks.reduce(x) { |h, b| b.call(h) }) * @scale
    end
  end

  def test_parameters_are_recursive_ordered_and_deduplicated
    Kiln.manual_seed(1)
    net = Net.new
    names = net.named_parameters.map(&:first)
    assert_equal %w[shared.weight blocks.0.fc.weight blocks.0.fc.bias blocks.0.norm.weight blocks.0.norm.bias
                    blocks.1.fc.weight blocks.1.fc.bias blocks.1.norm.weight blocks.1.norm.bias head.weight head.bias], names
    assert_equal names.size, net.parameters.size
    assert_same net.shared.weight, net.parameters.first
    assert_equal %w[shared blocks.0 blocks.1 head], net.named_children.map(&:first)
    assert_equal 4, net.children.size
    assert_equal 9, net.modules.size # self, shared, 2 x (block, fc, norm), head: shared once
    assert_equal [:float32], net.parameters.map(&:dtype).uniq
    assert net.parameters.all?(&:requires_grad)
  end

  def test_train_eval_and_zero_grad
    net = Net.new
    assert net.training?
    assert_same net, net.eval
    refute net.training?
    refute net.children[1].children[0].training?
    net.train
    assert net.modules.all?(&:training?)
    net.call(Kiln.randn(3, 4)).sum.backward
    refute_nil net.shared.weight.grad
    net.zero_grad
    assert net.parameters.all? { |p| p.grad.nil? }
  end

  def test_linear_init_is_torch_rb_like_and_seeded
    Kiln.manual_seed(42)
    a = NN::Linear.new(16, 8)
    Kiln.manual_seed(42)
    b = NN::Linear.new(16, 8)
    assert_equal [8, 16], a.weight.shape
    assert_equal [8], a.bias.shape
    assert a.weight.equal(b.weight)
    assert a.bias.equal(b.bias)
    bound = 1.0 / Math.sqrt(16)
    assert_operator a.weight.abs.max.item, :<=, bound
    assert_operator a.weight.abs.max.item, :>, bound * 0.8
    assert_operator a.weight.mean.item.abs, :<, 0.05
    x = Kiln.randn(3, 16)
    assert_tensor (x.matmul(a.weight.t) + a.bias).to_a, a.call(x)
    assert_nil NN::Linear.new(2, 3, bias: false).bias
  end

  def test_state_dict_round_trip
    Kiln.manual_seed(5)
    a = Net.new
    b = Net.new
    x = Kiln.randn(2, 4)
    refute a.call(x).equal(b.call(x))
    sd = a.state_dict
    assert_equal a.named_parameters.map(&:first), sd.keys
    refute sd.values.any?(&:requires_grad)
    b.load_state_dict(sd)
    assert b.call(x).equal(a.call(x))
    assert b.parameters.all?(&:requires_grad)
    assert_raises(KeyError) { b.load_state_dict(sd.except("head.bias")) }
    b.load_state_dict(sd.except("head.bias"), strict: false)
    assert_raises(Kiln::ShapeError) { b.load_state_dict(sd.merge("head.bias" => Kiln.zeros(3))) }
    # a snapshot: training on does not change a state_dict taken before
    before = sd["head.bias"].to_a
    Kiln.no_grad { a.parameters.last.add!(1.0) }
    assert_equal before, sd["head.bias"].to_a
  end

  def test_layers_and_losses
    x = Kiln.tensor([[-1.0, 0.0, 2.0]])
    assert_tensor [[0.0, 0.0, 2.0]], NN::ReLU.new.call(x)
    assert_tensor x.gelu.to_a, NN::GELU.new.call(x)
    assert_tensor x.tanh.to_a, NN::Tanh.new.call(x)
    seq = NN::Sequential.new(NN::Identity.new, NN::ReLU.new)
    assert_tensor [[0.0, 0.0, 2.0]], seq.call(x)
    assert_equal 2, seq.size
    assert_kind_of NN::ReLU, seq[1]
    ln = NN::LayerNorm.new(3)
    assert_tensor x.layer_norm.to_a, ln.call(x)
    assert_raises(ArgumentError) { NN::LayerNorm.new([2, 3]) }
    logits = Kiln.tensor([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]])
    target = Kiln.tensor([0, 1])
    assert_in_delta Kiln.cross_entropy(logits, target).item, NN::CrossEntropyLoss.new.call(logits, target).item, 1e-6
    a = Kiln.tensor([1.0, 2.0])
    b = Kiln.tensor([2.0, 4.0])
    assert_in_delta 2.5, NN::MSELoss.new.call(a, b).item, 1e-6
    assert_in_delta 5.0, NN::MSELoss.new(reduction: "sum").call(a, b).item, 1e-6
    assert_tensor [1.0, 4.0], F.mse_loss(a, b, reduction: "none")
    assert_tensor [[-1.0, 0.0, 2.0]], NN::Flatten.new.call(Kiln.tensor([[[-1.0], [0.0], [2.0]]]))
  end

  def test_functional
    x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    w = Kiln.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    assert_tensor [[1.0, 3.0, 4.0], [3.0, 7.0, 8.0]], F.linear(x, w)
    assert_tensor [[2.0, 4.0, 5.0], [4.0, 8.0, 9.0]], F.linear(x, w, Kiln.ones(3))
    assert_tensor x.softmax(1).to_a, F.softmax(x, dim: 1)
    assert_tensor x.log_softmax(0).to_a, F.log_softmax(x, dim: 0)
    assert_tensor x.relu.to_a, F.relu(x)
    assert_tensor x.gelu.to_a, F.gelu(x)
    assert_tensor x.layer_norm.to_a, F.layer_norm(x, [2])
    assert_raises(Kiln::ShapeError) { F.layer_norm(x, 3) }
    assert_in_delta x.cross_entropy([1, 0]).item, F.cross_entropy(x, Kiln.tensor([1, 0])).item, 1e-6
    assert_same NN::Functional, NN::F
  end

  # the torch-rb MLP example on digits, with Kiln::NN and Kiln::Optim::Adam;
  # its state_dict loaded into a fresh model predicts identically
  class MLP < NN::Module
    def initialize
      super()
      @fc1 = NN::Linear.new(64, 64)
      @fc2 = NN::Linear.new(64, 10)
    end

    def forward(x)
      @fc2.call(F.relu(@fc1.call(x)))
    end
  end

  def test_digits_mlp_with_adam_and_state_dict
    skip "#{Digits::PATH} not found" unless Digits.available?
    xtr, ytr, xte, yte = Digits.split
    Kiln.manual_seed(0)
    model = MLP.new
    opt = Kiln::Optim::Adam.new(model.parameters, lr: 0.01)
    loss_fn = NN::CrossEntropyLoss.new
    n = xtr.shape[0]
    order = (0...n).to_a
    rng = Random.new(1)
    15.times do
      order.shuffle!(random: rng)
      (0...n).step(64) do |s|
        idx = Kiln.tensor(order[s, 64])
        opt.zero_grad
        loss = loss_fn.call(model.call(xtr[idx]), ytr[idx])
        loss.backward
        opt.step
      end
    end
    model.eval
    pred = Kiln.no_grad { model.call(xte).argmax(dim: 1) }
    acc = (pred == yte).float.mean.item
    assert_operator acc, :>=, 0.95, "test accuracy #{acc}"
    fresh = MLP.new
    fresh.load_state_dict(model.state_dict)
    assert_equal pred.to_a, Kiln.no_grad { fresh.call(xte).argmax(dim: 1) }.to_a
    assert_equal model.call(xte).to_binary, fresh.call(xte).to_binary
  end

  # every allocation runs the GC over a whole training step
  def test_gc_stress_over_a_training_step
    Kiln.manual_seed(2)
    model = NN::Sequential.new(NN::Linear.new(4, 8), NN::GELU.new, NN::LayerNorm.new(8), NN::Linear.new(8, 3))
    opt = Kiln::Optim::AdamW.new(model.parameters, lr: 0.01)
    x = Kiln.randn(6, 4)
    y = Kiln.tensor([0, 1, 2, 0, 1, 2])
    losses = []
    GC.stress = true
    begin
      3.times do
        opt.zero_grad
        loss = F.cross_entropy(model.call(x), y)
        loss.backward
        opt.step
        losses << loss.item
      end
    ensure
      GC.stress = false
    end
    assert_operator losses.last, :<, losses.first
  end
end
