# frozen_string_literal: true

require_relative "test_helper"

# Issue 42: the everyday torch-rb calls users reached for that failed —
# masked_fill, nonzero, norm, repeat, contiguous, type, data, layout,
# device: on creation, Kiln.empty, tolist, Marshal, module functions beside
# the methods, and indexing with true.
class EverydayTest < Minitest::Test
  def setup
    @x = Kiln.tensor([[1.0, -2.0, 0.0], [0.0, 5.0, -6.0]])
  end

  def test_masked_fill
    assert_tensor [[1.0, 9.0, 0.0], [0.0, 5.0, 9.0]], @x.masked_fill(@x < 0, 9)
    # a mask broadcast over rows; a 0-d tensor value; the dtype stays self's
    assert_tensor [[7.0, 7.0, 7.0], [0.0, 5.0, -6.0]], @x.masked_fill(Kiln.tensor([[true], [false]]), Kiln.tensor(7))
    i = Kiln.tensor([1, 2, 3])
    r = i.masked_fill(i > 1, 2.7)
    assert_tensor [1, 2, 2], r, dtype: :int64
    assert_tensor [[1.0, 0.0, 0.0], [0.0, 5.0, 0.0]], Kiln.masked_fill(@x, @x < 0, 0.0)
    y = @x.dup
    y.masked_fill!(y > 0, -1)
    assert_tensor [[-1.0, -2.0, 0.0], [0.0, -1.0, -6.0]], y
    assert_tensor [[1.0, -2.0, 0.0], [0.0, 5.0, -6.0]], @x # untouched
    # gradient flows to self where the mask is false
    w = Kiln.tensor([1.0, 2.0, 3.0], requires_grad: true)
    (w.masked_fill(Kiln.tensor([false, true, false]), 0) * 2).sum.backward
    assert_tensor [2.0, 0.0, 2.0], w.grad
    assert_kiln_error(Kiln::DTypeError, /Kiln::Tensor#masked_fill: mask must be a :bool tensor, not float32/) do
      @x.masked_fill(@x, 1)
    end
    assert_kiln_error(Kiln::ShapeError, /masked_fill: value must be a number or a 0-d tensor/) do
      @x.masked_fill(@x > 0, Kiln.ones(3))
    end
    assert_kiln_error(TypeError, /Kiln::Tensor#masked_fill: mask must be a Kiln::Tensor/) { @x.masked_fill([true], 1) }
  end

  def test_nonzero
    assert_tensor [[0, 0], [0, 1], [1, 1], [1, 2]], @x.nonzero, dtype: :int64
    rows, cols = @x.nonzero(as_tuple: true)
    assert_tensor [0, 0, 1, 1], rows, dtype: :int64
    assert_tensor [0, 1, 1, 2], cols, dtype: :int64
    assert_tensor [[0], [2]], Kiln.tensor([1, 0, 2]).nonzero
    assert_tensor [[1]], Kiln.tensor([false, true]).nonzero
    assert_equal [0, 2], Kiln.zeros(3, 4).reshape(3, 4)[0...0].nonzero.shape
    assert_equal [0, 3], Kiln.zeros(2, 2, 2).nonzero.shape
    assert_equal [1, 0], Kiln.tensor(3.0).nonzero.shape
    assert_equal [0, 0], Kiln.tensor(0.0).nonzero.shape
    # NaN is nonzero; -0.0 is zero
    assert_tensor [[0], [2]], Kiln.tensor([Float::NAN, -0.0, 1.0]).nonzero
    # a larger one: the same as Ruby's own scan
    r = Kiln.randint(0, 3, [37, 29])
    expected = []
    r.to_a.each_with_index { |row, i| row.each_with_index { |v, j| expected << [i, j] unless v.zero? } }
    assert_equal expected, r.nonzero.to_a
    assert_equal values_of(r.nonzero), values_of(Kiln.nonzero(r))
  end

  def values_of(t)
    [t.shape, t.dtype, t.to_a]
  end

  def test_norm
    v = [1.0, -2.0, 0.0, 0.0, 5.0, -6.0]
    assert_in_delta Math.sqrt(v.sum { |e| e * e }), @x.norm.item, 1e-5
    assert_in_delta Math.sqrt(v.sum { |e| e * e }), @x.norm("fro").item, 1e-5
    assert_in_delta 14.0, @x.norm(1).item, 1e-6
    assert_in_delta 6.0, @x.norm(Float::INFINITY).item, 1e-6
    assert_in_delta 0.0, @x.norm(-Float::INFINITY).item, 1e-6
    assert_in_delta 4.0, @x.norm(0).item, 1e-6
    assert_in_delta v.sum { |e| e.abs**3 }**(1.0 / 3), @x.norm(3).item, 1e-4
    assert_tensor [Math.sqrt(5), Math.sqrt(61)], @x.norm(dim: 1)
    assert_tensor [[3.0], [11.0]], @x.norm(1, 1, true)
    assert_tensor [1.0, 7.0, 6.0], @x.norm(p: 1, dim: 0)
    assert_equal :float64, @x.norm(dtype: :float64).dtype
    assert_in_delta 5.0, Kiln.tensor([3, 4]).norm(dtype: :float32).item, 1e-6
    assert_in_delta 5.0, Kiln.norm(Kiln.tensor([3.0, 4.0])).item, 1e-6
    w = Kiln.tensor([3.0, 4.0], requires_grad: true)
    w.norm.backward
    assert_tensor [0.6, 0.8], w.grad
    assert_kiln_error(Kiln::DTypeError, /Kiln::Tensor#norm: a floating-point tensor is needed, not int64/) do
      Kiln.tensor([3, 4]).norm
    end
    assert_kiln_error(ArgumentError, /Kiln::Tensor#norm: p must be/) { @x.norm("nuc") }
  end

  def test_repeat
    a = Kiln.tensor([[1, 2], [3, 4]])
    assert_tensor [[1, 2, 1, 2, 1, 2], [3, 4, 3, 4, 3, 4], [1, 2, 1, 2, 1, 2], [3, 4, 3, 4, 3, 4]], a.repeat(2, 3)
    assert_tensor [[[1, 2], [3, 4]], [[1, 2], [3, 4]]], a.repeat(2, 1, 1)
    assert_tensor [1, 2, 3, 1, 2, 3], Kiln.tensor([1, 2, 3]).repeat(2)
    assert_tensor [[1, 2, 3], [1, 2, 3]], Kiln.tensor([1, 2, 3]).repeat([2, 1])
    assert_equal [0, 2], a.repeat(0, 1).shape
    assert_tensor [[5.0, 5.0, 5.0]], Kiln.tensor(5.0).repeat(1, 3)
    assert_equal a.repeat(2, 3).to_a, Kiln.repeat(a, 2, 3).to_a
    w = Kiln.tensor([1.0, 2.0], requires_grad: true)
    (w.repeat(3) * Kiln.arange(6).float).sum.backward
    assert_tensor [6.0, 9.0], w.grad # 0+2+4, 1+3+5
    assert_kiln_error(ArgumentError, /Kiln::Tensor#repeat: 1 sizes for a tensor of 2 dimensions/) { a.repeat(2) }
    assert_kiln_error(ArgumentError, /Kiln::Tensor#repeat: sizes must not be negative/) { a.repeat(-1, 2) }
  end

  def test_contiguous_type_layout_tolist
    assert_same @x, @x.contiguous
    assert @x.contiguous?
    assert_equal :strided, @x.layout
    assert_equal :float64, @x.type(:float64).dtype
    assert_equal :int64, @x.type("int64").dtype
    assert_tensor [[1, -2, 0], [0, 5, -6]], @x.type(:long)
    assert_tensor [[1, 0, 0], [0, 5, 0]], @x.type(:uint8), dtype: :uint8 # floats saturate into [0, 255]
    assert_tensor [[1, -2, 0], [0, 5, -6]], @x.type(:int8), dtype: :int8
    assert_kiln_error(Kiln::DTypeError, /unknown dtype :complex64/) { @x.type(:complex64) }
    assert_equal [[1.0, -2.0, 0.0], [0.0, 5.0, -6.0]], @x.tolist
    assert_equal 3, Kiln.tensor(3).tolist
    assert_equal [true, false], Kiln.tensor([true, false]).tolist
    assert_equal [], Kiln.zeros(0).tolist
  end

  def test_data_updates_the_tensor_it_came_from
    w = Kiln.ones(3, requires_grad: true)
    d = w.data
    refute d.requires_grad
    d.sub!(Kiln.tensor([0.5, 1.0, 1.5]))
    assert_tensor [0.5, 0.0, -0.5], w
    assert w.requires_grad
    # torch-rb's README loop
    (w * w).sum.backward
    w.data.sub!(w.grad.data * 0.1)
    assert_tensor [0.4, 0.0, -0.4], w
    w.data[0] = 7
    assert_tensor [7.0, 0.0, -0.4], w
    w.data.copy!(Kiln.zeros(3))
    assert_tensor [0.0, 0.0, 0.0], w
  end

  def test_device_layout_and_empty_on_creation
    [:cpu, "cpu", Kiln.device("cpu")].each do |dev|
      t = Kiln.zeros(2, 3, device: dev)
      assert_equal :cpu, t.device
      assert_equal [2, 3], t.shape
    end
    assert_equal :cpu, Kiln.tensor([1.0], device: "cpu").device
    assert_equal :cpu, Kiln.rand(2, dtype: :float64, layout: :strided, device: "cpu", requires_grad: true).device
    assert_equal :cuda, Kiln.device("cuda:0")
    assert_kiln_error(ArgumentError, /Kiln.device: unknown device "tpu"/) { Kiln.zeros(2, device: "tpu") }
    assert_kiln_error(ArgumentError, /layout :sparse is not supported/) { Kiln.ones(2, layout: :sparse) }
    unless Kiln::CUDA.available?
      e = assert_raises(Kiln::Error) { Kiln.ones(2, device: :cuda) }
      assert_equal :device, e.status
    end
    e = Kiln.empty(2, 3)
    assert_tensor [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], e, dtype: :float32
    assert_equal :int64, Kiln.empty([4], dtype: :int64).dtype
    assert_equal [2, 3], Kiln.empty_like(@x).shape
    assert_equal [], Kiln.empty.shape
  end

  def test_marshal_round_trip_is_bit_exact
    [
      Kiln.tensor([[1.5, Float::NAN, -0.0], [Float::INFINITY, 1e-40, -3.25]]),
      Kiln.tensor([0.1, 1.0 / 3], dtype: :float64),
      Kiln.tensor([[2**62, -7], [0, 1]]),
      Kiln.tensor([1, -2], dtype: :int32),
      Kiln.tensor([true, false, true]),
      Kiln.tensor(2.5),
      Kiln.zeros(0, 3),
      Kiln.randn(5, 4, 3)
    ].each do |t|
      u = Marshal.load(Marshal.dump(t))
      assert_kind_of Kiln::Tensor, u
      assert_equal t.dtype, u.dtype
      assert_equal t.shape, u.shape
      assert_equal t.to_binary, u.to_binary
    end
    w = Kiln.ones(2, requires_grad: true)
    assert Marshal.load(Marshal.dump(w)).requires_grad
    # inside other objects
    h = Marshal.load(Marshal.dump({ "w" => @x, "list" => [@x, 1] }))
    assert_equal @x.to_binary, h["w"].to_binary
    assert_kiln_error(ArgumentError, /not a dumped Kiln::Tensor/) { Kiln::Tensor._load(Marshal.dump(["x"])) }
  end

  def test_module_functions_beside_the_methods
    a = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = Kiln.tensor([[0.5, -1.0], [2.0, 0.0]])
    same = lambda do |expected, actual|
      assert_equal [expected.shape, expected.dtype, expected.to_a], [actual.shape, actual.dtype, actual.to_a]
    end
    same.call(a + b, Kiln.add(a, b))
    same.call(a + b * 2, Kiln.add(a, b, alpha: 2))
    same.call(a - b, Kiln.sub(a, b))
    same.call(a * b, Kiln.mul(a, b))
    same.call(a / b, Kiln.div(a, b))
    same.call(a**2, Kiln.pow(a, 2))
    same.call(a.matmul(b), Kiln.mm(a, b))
    a3 = a.reshape(1, 2, 2)
    same.call(a3.matmul(b.reshape(1, 2, 2)), Kiln.bmm(a3, b.reshape(1, 2, 2)))
    same.call(a.reshape(-1), Kiln.flatten(a))
    same.call(a3.flatten(1), Kiln.flatten(a3, 1))
    same.call(a.exp, Kiln.exp(a))
    same.call(a.sum(1), Kiln.sum(a, 1))
    same.call(a.mean, Kiln.mean(a))
    same.call(a.max, Kiln.max(a))
    same.call(a.maximum(b), Kiln.max(a, b))
    same.call(a.argmax(1), Kiln.argmax(a, dim: 1))
    same.call(a.transpose(0, 1), Kiln.transpose(a, 0, 1))
    same.call(a.unsqueeze(0), Kiln.unsqueeze(a, 0))
    same.call(a.relu, Kiln.relu(a))
    same.call(a.sigmoid, Kiln.sigmoid(a))
    same.call(a.tanh, Kiln.tanh(a))
    same.call(a.t, Kiln.t(a))
    same.call(a.clamp(min: 2), Kiln.clamp(a, min: 2))
    same.call(a.eq(b), Kiln.eq(a, b))
    same.call(a.index_select(0, Kiln.tensor([1])), Kiln.index_select(a, 0, Kiln.tensor([1])))
    same.call(Kiln.tensor([1.0, 2.0]).dot(Kiln.tensor([3.0, 4.0])), Kiln.dot([1.0, 2.0], Kiln.tensor([3.0, 4.0])))
    assert_equal 4, Kiln.numel(a)
    assert_equal [[1.0, 2.0], [3.0, 4.0]], Kiln.chunk(a, 2, dim: 0).map(&:to_a).flatten(1)
    assert_kiln_error(TypeError, /Kiln.add: input must be a Kiln::Tensor, not nil/) { Kiln.add(nil, a) }
    assert_kiln_error(TypeError, /Kiln.mm: mat2 must be a Kiln::Tensor, not \[1\]/) { Kiln.mm(a, [1]) }
  end

  def test_logspace_like_constructors_length_t_bang_and_out
    assert_equal [1.0, 10.0, 100.0, 1000.0], Kiln.logspace(0, 3, 4, dtype: :float64).to_a
    assert_equal [1.0, 2.0, 4.0, 8.0, 16.0], Kiln.logspace(0, 4, 5, base: 2).to_a
    assert_equal :float32, Kiln.logspace(0, 1, 3).dtype
    assert_in_delta 10**0.5, Kiln.logspace(0, 1, 3, dtype: :float64).to_a[1], 1e-12
    r = Kiln.rand_like(Kiln.tensor([[1, 2], [3, 4]]), dtype: :float)
    assert_equal [[2, 2], :float32], [r.shape, r.dtype]
    assert(r.to_a.flatten.all? { |v| v >= 0 && v < 1 })
    Kiln.manual_seed(3)
    a = Kiln.randn_like(@x)
    Kiln.manual_seed(3)
    assert_equal Kiln.randn(2, 3).to_a, a.to_a
    assert_equal 2, @x.length
    assert_equal 0, Kiln.zeros(0, 3).length
    assert_kiln_error(TypeError, /Kiln::Tensor#length: a 0-d tensor has no length/) { Kiln.tensor(1).length }
    m = Kiln.tensor([[1, 2], [3, 4]])
    view = m
    m.t!
    assert_tensor [[1, 3], [2, 4]], m
    assert_same view, m
    assert_kiln_error(Kiln::ShapeError, /Kiln::Tensor#t!: .* use t/) { Kiln.zeros(2, 3).t! }
    out = Kiln.empty(2, 3)
    r = Kiln.add(@x, 1, out: out)
    assert_same out, r
    assert_tensor [[2.0, -1.0, 1.0], [1.0, 6.0, -5.0]], out
    out64 = Kiln.zeros(3, dtype: :float64)
    Kiln.sum(@x, 0, out: out64)
    assert_tensor [1.0, 3.0, -6.0], out64, dtype: :float64
    assert_kiln_error(Kiln::ShapeError, /Kiln.mul: out has shape \[4\], the result \[2, 3\]/) { Kiln.mul(@x, 2, out: Kiln.zeros(4)) }
    assert_kiln_error(TypeError, /Kiln.mul: out must be a Kiln::Tensor/) { Kiln.mul(@x, 2, out: [1]) }
  end

  def test_indexing_with_true_for_a_whole_axis
    t = Kiln.tensor([[1, 2, 3], [4, 5, 6]])
    assert_tensor [1, 4], t[true, 0]
    assert_tensor [[2, 3], [5, 6]], t[true, 1..]
    assert_tensor [4, 5, 6], t[1, true]
    assert_tensor [[1, 2, 3], [4, 5, 6]], t[true, true]
    assert_tensor [[1, 2, 3], [4, 5, 6]], t[true]
    t[true, 0] = 0
    assert_tensor [[0, 2, 3], [0, 5, 6]], t
    assert_kiln_error(TypeError, /Kiln::Tensor#\[\]: false is not an index/) { t[false] }
  end
end
