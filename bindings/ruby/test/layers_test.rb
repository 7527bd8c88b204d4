# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/digits"
require "tmpdir"

# The ops real models need, from Ruby: layers (Kiln::NN, NN::Functional),
# sort/topk/var/std/cumsum, constructors, Kiln.save/Kiln.load, and
# Kiln::Utils::Data; values checked by hand.
class LayersTest < Minitest::Test
  include KilnAssertions
  NN = Kiln::NN
  F = Kiln::NN::F
  Data = Kiln::Utils::Data

  def grid
    Kiln.arange(16.0).reshape(1, 1, 4, 4) # 0..15 row by row
  end

  def test_conv2d_by_hand
    w = Kiln.tensor([[[[1.0, 0.0], [0.0, -1.0]]]]) # x[i,j] - x[i+1,j+1] = -5 everywhere
    assert_tensor [[[[-5.0] * 3] * 3]], F.conv2d(grid, w)
    b = Kiln.tensor([2.0])
    assert_tensor [[[[-3.0] * 2] * 2]], F.conv2d(grid, w, b, stride: 2)
    # padding 1 with a 1x1 kernel of 2: the border is zeros
    out = F.conv2d(grid, Kiln.full([1, 1, 1, 1], 2.0), padding: 1)
    assert_equal [1, 1, 6, 6], out.shape
    assert_in_delta 240.0, out.sum.item, 1e-4
    assert_raises(Kiln::ShapeError) { F.conv2d(grid, Kiln.ones(1, 2, 2, 2)) }
    assert_raises(ArgumentError) { F.conv2d(grid, w, stride: [1, 2, 3]) }
  end

  def test_conv2d_module_shapes_groups_and_init
    Kiln.manual_seed(3)
    conv = NN::Conv2d.new(4, 6, 3, padding: 1, groups: 2)
    assert_equal [6, 2, 3, 3], conv.weight.shape
    assert_equal [6], conv.bias.shape
    bound = 1.0 / Math.sqrt(2 * 9)
    assert_operator conv.weight.abs.max.item, :<=, bound
    assert_equal [2, 6, 5, 5], conv.call(Kiln.randn(2, 4, 5, 5)).shape
    assert_equal 2, conv.parameters.size
    assert_raises(ArgumentError) { NN::Conv2d.new(3, 4, 3, groups: 2) }
    assert_match(/Conv2d\(4, 6, kernel_size: \[3, 3\]/, conv.inspect)
  end

  def test_pooling_by_hand
    assert_tensor [[[[5.0, 7.0], [13.0, 15.0]]]], F.max_pool2d(grid, 2)
    assert_tensor [[[[2.5, 4.5], [10.5, 12.5]]]], NN::AvgPool2d.new(2).call(grid)
    assert_tensor [[[[10.0, 11.0], [14.0, 15.0]]]], NN::MaxPool2d.new(3, stride: 1).call(grid)
  end

  def test_batch_norm_training_updates_running_stats_and_eval_uses_them
    bn = NN::BatchNorm2d.new(1)
    y = bn.call(grid)
    assert_in_delta 0.0, y.mean.item, 1e-5
    assert_in_delta 1.0, y.var(unbiased: false).item, 1e-3 # eps
    assert_tensor [0.75], bn.running_mean                   # 0.9 * 0 + 0.1 * 7.5
    assert_tensor [0.9 + 0.1 * (340.0 / 15)], bn.running_var # the unbiased variance, as torch
    bn.eval
    z = bn.call(grid)
    expect = (0...16).map { |v| (v - 0.75) / Math.sqrt(0.9 + 0.1 * (340.0 / 15) + 1e-5) }
    assert_tensor [[expect.each_slice(4).to_a]], z, tol: 1e-4
    assert_tensor [0.75], bn.running_mean # eval leaves them
    assert_equal %w[weight bias running_mean running_var], bn.state_dict.keys
    assert_raises(Kiln::ShapeError) { bn.call(Kiln.ones(2, 1)) }
  end

  def test_dropout_in_training_and_eval
    Kiln.manual_seed(5)
    drop = NN::Dropout.new(p: 0.25)
    v = drop.call(Kiln.ones(4000)).to_a
    assert(v.all? { |e| e.zero? || (e - 1 / 0.75).abs < 1e-6 })
    assert_in_delta 0.25, v.count(0.0) / 4000.0, 0.03
    drop.eval
    assert_equal [1.0] * 10, drop.call(Kiln.ones(10)).to_a
    assert_raises(ArgumentError) { NN::Dropout.new(p: 1.5) }
  end

  def test_embedding_one_hot_and_losses
    Kiln.manual_seed(7)
    emb = NN::Embedding.new(5, 3)
    rows = emb.weight.to_a
    out = emb.call(Kiln.tensor([[4, 0], [1, 1]]))
    assert_equal [2, 2, 3], out.shape
    assert_tensor [[rows[4], rows[0]], [rows[1], rows[1]]], out
    out.sum.backward
    assert_tensor [[1.0] * 3, [2.0] * 3, [0.0] * 3, [0.0] * 3, [1.0] * 3], emb.weight.grad
    assert_tensor [[0, 1, 0], [0, 0, 1]], Kiln.tensor([1, 2]).one_hot(3)
    assert_tensor [[1, 0], [0, 1]], F.one_hot(Kiln.tensor([0, 1]))
    logits = Kiln.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    target = Kiln.tensor([1, 2])
    assert_in_delta F.cross_entropy(logits, target).item, F.nll_loss(logits.log_softmax(1), target).item, 1e-6
    assert_in_delta F.cross_entropy(logits, target).item, NN::NLLLoss.new.call(logits.log_softmax(1), target).item, 1e-6
    x = Kiln.tensor([0.5, -1.0])
    t = Kiln.tensor([1.0, 0.0])
    expect = (Math.log(1 + Math.exp(-0.5)) + Math.log(1 + Math.exp(-1.0))) / 2
    assert_in_delta expect, NN::BCEWithLogitsLoss.new.call(x, t).item, 1e-6
    # sum and none for the class losses (test/user_reports_test.rb); BCE is mean only
    assert_kiln_error(ArgumentError, /BCEWithLogitsLoss.new: reduction must be "mean", not "sum"/) do
      NN::BCEWithLogitsLoss.new(reduction: "sum")
    end
    assert_kiln_error(ArgumentError, /nll_loss: reduction must be "mean", "sum" or "none"/) { F.nll_loss(logits, target, reduction: :avg) }
    assert_in_delta F.nll_loss(logits, target).item * target.numel, F.nll_loss(logits, target, reduction: :sum).item, 1e-5
  end

  def test_sort_topk_var_std_cumsum
    a = Kiln.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    v, i = a.sort(1)
    assert_tensor [[1.0, 2.0, 3.0], [0.0, 4.0, 5.0]], v
    assert_tensor [[1, 2, 0], [0, 2, 1]], i
    v, i = a.sort(dim: 0, descending: true)
    assert_tensor [[3.0, 5.0, 4.0], [0.0, 1.0, 2.0]], v
    assert_tensor [[0, 1, 1], [1, 0, 0]], i
    assert_tensor [[1, 2, 0], [0, 2, 1]], a.argsort(1)
    v, i = a.topk(2)
    assert_tensor [[3.0, 2.0], [5.0, 4.0]], v
    assert_tensor [[0, 2], [1, 2]], i
    v, = a.topk(1, dim: 1, largest: false)
    assert_tensor [[1.0], [0.0]], v
    b = Kiln.tensor([1.0, 2.0, 3.0, 4.0])
    assert_in_delta 5.0 / 3, b.var.item, 1e-6
    assert_in_delta 1.25, b.var(unbiased: false).item, 1e-6
    assert_in_delta Math.sqrt(1.25), b.std(correction: 0).item, 1e-6
    assert_tensor [[4.5, 8.0, 2.0]], a.var(0, keepdim: true)
    assert_raises(ArgumentError) { b.var(unbiased: true, correction: 1) }
    assert_tensor [[3.0, 4.0, 6.0], [0.0, 5.0, 9.0]], a.cumsum(1)
    assert_tensor [1, 3, 6], Kiln.tensor([1, 2, 3]).cumsum(0), dtype: :int64
    assert_raises(ArgumentError) { a.cumsum }
    c = a.clone
    assert_equal a.to_a, c.to_a
    refute_same a, c
  end

  def test_constructors
    assert_tensor [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], Kiln.eye(3)
    assert_equal :float64, Kiln.eye(2, dtype: :float64).dtype
    assert_tensor [0.0, 0.25, 0.5, 0.75, 1.0], Kiln.linspace(0, 1, 5)
    Kiln.manual_seed(11)
    r = Kiln.randint(3, 7, [200])
    assert_equal :int64, r.dtype
    assert_equal [3, 4, 5, 6], r.to_a.uniq.sort
    assert_equal [5], Kiln.randint(10, 5).shape
    p = Kiln.randperm(50).to_a
    assert_equal (0...50).to_a, p.sort
    refute_equal (0...50).to_a, p
    Kiln.manual_seed(11)
    assert_equal r.to_a, Kiln.randint(3, 7, [200]).to_a
  end

  def test_save_and_load
    Dir.mktmpdir do |dir|
      path = File.join(dir, "t.safetensors")
      x = Kiln.tensor([[1.5, -2.0], [3.0, 4.25]]) * 2 # pending: saved evaluated
      Kiln.save(x, path)
      y = Kiln.load(path)
      assert_equal x.to_binary, y.to_binary
      state = { "w" => Kiln.arange(6.0).reshape(2, 3), "n" => Kiln.tensor([1, 2, 3]), :b => Kiln.tensor([true, false]) }
      Kiln.save(state, path)
      back = Kiln.load(path)
      assert_equal %w[w n b], back.keys
      assert_equal :int64, back["n"].dtype
      assert_equal :bool, back["b"].dtype
      assert_equal state["w"].to_a, back["w"].to_a
      Kiln.save([Kiln.ones(2), Kiln.zeros(1)], path)
      assert_equal %w[0 1], Kiln.load(path).keys
      assert_raises(TypeError) { Kiln.save(3, path) }
      assert_raises(TypeError) { Kiln.save({ "a" => [1, 2] }, path) }
      assert_raises(Kiln::Error) { Kiln.load(File.join(dir, "missing.safetensors")) }
      File.binwrite(path, "\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
      assert_raises(Kiln::Error) { Kiln.load(path) }
    end
  end

  def test_data_loader
    x = Kiln.arange(20.0).reshape(10, 2)
    y = Kiln.arange(10)
    ds = Data::TensorDataset.new(x, y)
    assert_equal 10, ds.size
    assert_equal [[2.0, 3.0], 1], ds[1].map { |t| t.to_a }
    loader = Data::DataLoader.new(ds, batch_size: 4)
    assert_equal 3, loader.size
    batches = loader.to_a
    assert_equal [[4, 2], [4, 2], [2, 2]], batches.map { |xb, _| xb.shape }
    assert_equal (0...10).to_a, batches.flat_map { |_, yb| yb.to_a }
    Kiln.manual_seed(4)
    shuffled = Data::DataLoader.new(ds, batch_size: 3, shuffle: true, drop_last: true)
    assert_equal 3, shuffled.size
    seen = shuffled.flat_map { |xb, yb| xb.to_a.zip(yb.to_a) }
    assert_equal 9, seen.size
    seen.each { |row, label| assert_equal [2.0 * label, 2.0 * label + 1], row }
    assert_equal seen.map(&:last).uniq.size, 9
    Kiln.manual_seed(4)
    assert_equal seen, shuffled.flat_map { |xb, yb| xb.to_a.zip(yb.to_a) }
    # any object with size and []: items stacked
    list = Class.new do
      def size = 3
      def [](i) = [Kiln.tensor([i * 1.0]), i]
    end.new
    xb, yb = Data::DataLoader.new(list, batch_size: 2).first
    assert_equal [[0.0], [1.0]], xb.to_a
    assert_equal [0, 1], yb.to_a
    assert_raises(ArgumentError) { Data::DataLoader.new(ds, batch_size: 0) }
    assert_raises(Kiln::ShapeError) { Data::TensorDataset.new(x, Kiln.arange(3)) }
  end

  # a small CNN on digits (8x8 images) with Kiln::NN, Kiln::Optim::Adam and
  # the DataLoader; saved with Kiln.save and loaded into a fresh model, it
  # predicts identically
  class CNN < NN::Module
    def initialize
      super()
      @conv = NN::Conv2d.new(1, 8, 3, padding: 1)
      @bn = NN::BatchNorm2d.new(8)
      @pool = NN::MaxPool2d.new(2)
      @drop = NN::Dropout.new(p: 0.1)
      @fc = NN::Linear.new(8 * 4 * 4, 10)
    end

    def forward(x)
      h = @pool.call(F.relu(@bn.call(@conv.call(x.reshape(-1, 1, 8, 8)))))
      @fc.call(@drop.call(h.reshape(-1, 8 * 4 * 4)))
    end
  end

  def test_digits_cnn_trains_saves_and_loads
    skip "#{Digits::PATH} not found" unless Digits.available?
    xtr, ytr, xte, yte = Digits.split
    Kiln.manual_seed(0)
    model = CNN.new
    opt = Kiln::Optim::Adam.new(model.parameters, lr: 0.01)
    loader = Data::DataLoader.new(Data::TensorDataset.new(xtr, ytr), batch_size: 64, shuffle: true)
    losses = []
    6.times do
      loader.each do |xb, yb|
        opt.zero_grad
        loss = F.cross_entropy(model.call(xb), yb)
        loss.backward
        opt.step
        losses << loss.item
      end
    end
    assert_operator losses.last(5).sum / 5, :<, losses.first(5).sum / 5 / 4
    model.eval
    logits = Kiln.no_grad { model.call(xte) }
    acc = (logits.argmax(dim: 1) == yte).float.mean.item
    assert_operator acc, :>=, 0.93, "test accuracy #{acc}"
    warn format("digits CNN: accuracy %.4f, loss %.3f -> %.3f over %d steps", acc, losses.first, losses.last, losses.size) if ENV["KILN_VERBOSE"]
    Dir.mktmpdir do |dir|
      path = File.join(dir, "cnn.safetensors")
      Kiln.save(model.state_dict, path)
      fresh = CNN.new
      fresh.load_state_dict(Kiln.load(path))
      fresh.eval
      assert_equal logits.to_binary, Kiln.no_grad { fresh.call(xte) }.to_binary
    end
  end
end
