# frozen_string_literal: true

require_relative "test_helper"

class OpsTest < Minitest::Test
  def setup
    @x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    @i = Kiln.tensor([1, 2, 3])
    @i32 = Kiln.tensor([1, 2, 3], dtype: :int32)
    @b = Kiln.tensor([true, false, true])
  end

  def test_operators_with_tensors
    y = Kiln.tensor([[10.0, 20.0], [30.0, 40.0]])
    assert_tensor [[11.0, 22.0], [33.0, 44.0]], @x + y
    assert_tensor [[9.0, 18.0], [27.0, 36.0]], y - @x
    assert_tensor [[10.0, 40.0], [90.0, 160.0]], @x * y
    assert_tensor [[10.0, 10.0], [10.0, 10.0]], y / @x
    assert_tensor [[1.0, 4.0], [27.0, 256.0]], @x**@x
    assert_tensor [[-1.0, -2.0], [-3.0, -4.0]], -@x
    assert_same @x, +@x
    assert_tensor [[11.0, 12.0], [13.0, 14.0]], @x + Kiln.tensor([10.0]) # broadcasting
    assert_tensor [[2.0, 4.0], [4.0, 6.0]], @x + [1, 2] # an Array becomes a tensor
    assert_tensor [[2.0, 4.0], [6.0, 8.0]], @x.add(@x)
    assert_tensor [[0.0, 0.0], [0.0, 0.0]], @x.sub(@x)
    assert_tensor [[1.0, 4.0], [9.0, 16.0]], @x.mul(@x)
    assert_tensor [[1.0, 1.0], [1.0, 1.0]], @x.div(@x)
    assert_tensor [[1.0, 4.0], [9.0, 16.0]], @x.pow(2)
  end

  def test_operators_with_ruby_numbers_both_sides
    assert_tensor [[3.0, 5.0], [7.0, 9.0]], @x * 2 + 1, dtype: :float32
    assert_tensor [[2.0, 4.0], [6.0, 8.0]], 2 * @x, dtype: :float32
    assert_tensor [[0.0, -1.0], [-2.0, -3.0]], 1 - @x, dtype: :float32
    assert_tensor [[1.0, 0.5], [1 / 3.0, 0.25]], 1 / @x, dtype: :float32
    assert_tensor [[2.0, 4.0], [8.0, 16.0]], 2**@x, dtype: :float32
    assert_tensor [[1.5, 2.5], [3.5, 4.5]], 0.5 + @x
    assert_tensor [[0.5, 1.0], [1.5, 2.0]], @x / 2
    assert_tensor [[1.0, 4.0], [9.0, 16.0]], @x**2
    assert_equal :float64, (Kiln.ones(2, dtype: :float64) * 2.5).dtype
    assert_equal :float32, (@x * 2.5).dtype # a Ruby Float never widens float32
  end

  def test_integer_dtype_rules
    assert_tensor [2, 4, 6], @i * 2, dtype: :int64
    assert_tensor [2, 4, 6], 2 * @i32, dtype: :int32
    assert_tensor [2, 3, 4], @i32 + 1, dtype: :int32
    assert_tensor [0, -1, -2], 1 - @i32, dtype: :int32
    assert_tensor [1, 4, 9], @i**2, dtype: :int64
    assert_tensor [2, 4, 8], 2**@i, dtype: :int64
    assert_tensor [2.5, 5.0, 7.5], @i * 2.5, dtype: :float32
    assert_tensor [2.5, 5.0, 7.5], 2.5 * @i, dtype: :float32
    assert_tensor [0.5, -0.5, -1.5], 1.5 - @i, dtype: :float32
    assert_tensor [0.5, 1.0, 1.5], @i / 2, dtype: :float32 # true division
    assert_tensor [1.0, 0.5, 1 / 3.0], 1 / @i, dtype: :float32
    assert_tensor [2, 1, 2], @b + 1, dtype: :int64
    assert_tensor [2.0, 4.0, 6.0], @i32 * Kiln.tensor([2.0]), dtype: :float32
  end

  def test_comparisons
    assert_tensor [false, true, true], @i >= 2, dtype: :bool
    assert_tensor [false, false, true], @i > 2
    assert_tensor [true, true, false], @i <= 2
    assert_tensor [true, false, false], @i < 2
    assert_tensor [false, true, true], 1 < @i
    assert_tensor [true, true, false], 2 >= @i
    assert_tensor [true, false, false], 2 > @i
    assert_tensor [false, true, true], 2 <= @i
    assert_tensor [true, true, true], 0.5 < @i
    assert_match(/Kiln::Scalar 2/, @i.coerce(2).first.inspect)
    assert_tensor [false, true, false], @i.eq(2)
    assert_tensor [true, false, true], @i.ne(2)
    assert_tensor [true, false, false], @i.lt(2)
    assert_tensor [true, true, false], @i.le(2)
    assert_tensor [false, false, true], @i.gt(2)
    assert_tensor [false, true, true], @i.ge(2)
    assert_tensor [false, true, true], @i.gt(1.5) # compared as float
    assert_tensor [[false, true], [false, false]], @x.eq(Kiln.tensor([[0.0, 2.0], [0.0, 0.0]]))
  end

  def test_equality_is_elementwise_like_torch_rb
    assert_tensor [[true, true], [true, false]], @x == Kiln.tensor([[1, 2], [3, 5]])
    assert_tensor [[false, true], [false, false]], @x == 2
    assert_tensor [[true, false], [true, true]], @x != 2
    assert_tensor [[true, true], [true, true]], @x == [[1.0, 2.0], [3.0, 4.0]]
    assert_equal false, @x == nil # not a tensor-like: plain false
    assert_equal true, @x != "x"
    # torch.equal: the whole tensor
    assert @x.equal(Kiln.tensor([[1, 2], [3, 4]])) # values after promotion
    refute @x.equal(Kiln.tensor([[1.0, 2.0], [3.0, 5.0]]))
    refute @x.equal(Kiln.tensor([1.0, 2.0, 3.0, 4.0])) # shape differs
    # eql?/hash stay identity: tensors are Hash keys by object
    refute @x.eql?(Kiln.tensor([[1.0, 2.0], [3.0, 4.0]]))
    h = { @x => 1 }
    assert_equal 1, h[@x]
    assert_nil h[Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])]
  end

  def test_logical
    c = Kiln.tensor([true, true, false])
    assert_tensor [true, false, false], @b.logical_and(c)
    assert_tensor [true, true, true], @b.logical_or(c)
    assert_tensor [true, false, false], @b & c
    assert_tensor [true, true, true], @b | c
    assert_tensor [false, true, false], @b.logical_not
    assert (@x > 0).all?
    refute (@x > 1).all?
    assert (@x > 3).any?
    refute (@x > 4).any?
    assert_tensor true, (@x > 0).all
    assert_tensor false, (@x > 4).any
    assert Kiln.tensor([]).all?
  end

  def test_unary_math
    v = [0.5, 1.0, 2.0]
    t = Kiln.tensor(v)
    {
      exp: ->(a) { Math.exp(a) }, log: ->(a) { Math.log(a) }, sqrt: ->(a) { Math.sqrt(a) },
      rsqrt: ->(a) { 1 / Math.sqrt(a) }, sin: ->(a) { Math.sin(a) }, cos: ->(a) { Math.cos(a) },
      tanh: ->(a) { Math.tanh(a) }, sigmoid: ->(a) { 1 / (1 + Math.exp(-a)) },
      erf: ->(a) { Math.erf(a) }, log1p: ->(a) { Math.log(1 + a) }, expm1: ->(a) { Math.exp(a) - 1 },
      gelu: ->(a) { 0.5 * a * (1 + Math.erf(a / Math.sqrt(2))) }
    }.each do |name, f|
      assert_tensor v.map(&f), t.public_send(name), dtype: :float32, tol: 1e-5
    end
    s = Kiln.tensor([-1.5, -0.5, 0.0, 0.5, 2.5])
    assert_tensor [1.5, 0.5, 0.0, 0.5, 2.5], s.abs
    assert_tensor [1.5, 0.5, 0.0, -0.5, -2.5], s.neg
    assert_tensor [0.0, 0.0, 0.0, 0.5, 2.5], s.relu
    assert_tensor [-2.0, -1.0, 0.0, 0.0, 2.0], s.floor
    assert_tensor [-1.0, 0.0, 0.0, 1.0, 3.0], s.ceil
    assert_tensor [-2.0, 0.0, 0.0, 0.0, 2.0], s.round # half to even
    assert_tensor [-1.0, -1.0, 0.0, 1.0, 1.0], s.sign
    assert_tensor [Math.exp(1)], Kiln.tensor([1]).exp, dtype: :float32 # integers -> float32
  end

  def test_maximum_minimum_clamp_where_cast
    a = Kiln.tensor([1.0, 5.0, 3.0])
    b = Kiln.tensor([4.0, 2.0, 3.0])
    assert_tensor [4.0, 5.0, 3.0], a.maximum(b)
    assert_tensor [1.0, 2.0, 3.0], a.minimum(b)
    assert_tensor [4.0, 5.0, 3.0], Kiln.maximum(a, b)
    assert_tensor [1.0, 2.0, 3.0], Kiln.minimum(a, b)
    assert_tensor [4.0, 5.0, 3.0], a.max(b)
    assert_tensor [1.0, 2.0, 3.0], a.min(b)
    assert_tensor [2.0, 5.0, 3.0], a.maximum(2)
    assert_tensor [2.0, 4.0, 3.0], a.clamp(2, 4)
    assert_tensor [2.0, 5.0, 3.0], a.clamp(min: 2)
    assert_tensor [1.0, 2.5, 2.5], a.clamp(max: 2.5)
    assert_tensor [2.0, 4.0, 3.0], a.clip(2, 4)
    assert_tensor [2, 2, 3], @i.clamp(min: 2), dtype: :int64
    assert_raises(ArgumentError) { a.clamp }
    assert_tensor [4.0, 5.0, 3.0], Kiln.where(a > b, a, b)
    assert_tensor [0.0, 5.0, 3.0], Kiln.where(a > 2, a, 0)
    assert_tensor [0.0, 1.0, 1.0], Kiln.where(a > 2, 1.0, 0.0)
    assert_tensor [4.0, 5.0, 3.0], a.where(a > b, b)
    assert_tensor [1, 5, 3], a.cast(:int32), dtype: :int32
    assert_tensor [1.0, 5.0, 3.0], a.to(:float64), dtype: :float64
    assert_equal :float32, @i.float.dtype
    assert_equal :float64, @i.double.dtype
    assert_equal :int32, a.int.dtype
    assert_equal :int64, a.long.dtype
    assert_equal :bool, a.bool.dtype
    assert a.floating_point?
    refute @i.floating_point?
  end

  def test_reductions
    assert_tensor 10.0, @x.sum, dtype: :float32
    assert_tensor [4.0, 6.0], @x.sum(dim: 0)
    assert_tensor [[3.0], [7.0]], @x.sum(dim: 1, keepdim: true)
    assert_tensor [[3.0], [7.0]], @x.sum(axis: 1, keepdims: true)
    assert_tensor [3.0, 7.0], @x.sum(1)
    assert_tensor [3.0, 7.0], @x.sum(-1)
    assert_tensor 10.0, @x.sum(dim: [0, 1])
    assert_tensor [[10.0]], @x.sum(0, 1, keepdim: true)
    assert_tensor 2.5, @x.mean
    assert_tensor [1.5, 3.5], @x.mean(dim: 1)
    assert_tensor 4.0, @x.max
    values, indices = @x.max(dim: 0)
    assert_tensor [3.0, 4.0], values
    assert_tensor [1, 1], indices, dtype: :int64
    values, indices = @x.min(1)
    assert_tensor [1.0, 3.0], values
    assert_tensor [0, 0], indices
    assert_tensor [3.0, 4.0], @x.amax(dim: 0)
    assert_tensor 4.0, @x.max(dim: [0, 1]) # a list of axes: the values
    assert_tensor 1.0, @x.min
    assert_tensor 24.0, @x.prod
    assert_tensor [2.0, 12.0], @x.prod(dim: 1)
    assert_tensor 6, @i.sum, dtype: :int64
    assert_tensor 2.0, @i.mean, dtype: :float32
    assert_tensor [1, 1], @x.argmax(dim: 1), dtype: :int64
    assert_tensor [0, 0], @x.argmin(dim: 0)
    assert_tensor 3, @x.argmax
    assert_tensor 0, @x.argmin
    assert_tensor [[3]], @x.argmax(keepdim: true)
    assert_tensor [[1], [1]], @x.argmax(dim: 1, keepdim: true)
    assert_raises(ArgumentError) { @x.sum(0, dim: 1) }
    assert_raises(ArgumentError) { @x.sum(keepdim: true, keepdims: true) }
    assert_kiln_error(Kiln::Error, /kiln_sum: axis 2 is out of range/) { @x.sum(dim: 2) }
    assert_kiln_error(Kiln::Error, /kiln_sum: .*repeated|kiln_sum: .*axis/) { @x.sum(dim: [0, 0]) }
  end

  def test_matmul
    assert_tensor [[7.0, 10.0], [15.0, 22.0]], @x.matmul(@x)
    assert_tensor [5.0, 11.0], @x.matmul(Kiln.tensor([1.0, 2.0]))
    assert_tensor [[7.0, 10.0], [15.0, 22.0]], Kiln.matmul(@x, @x)
    assert_tensor [[7, 10], [15, 22]], Kiln.tensor([[1, 2], [3, 4]]).matmul(Kiln.tensor([[1, 2], [3, 4]])),
                  dtype: :int64
    assert_equal [5, 2, 4], Kiln.ones(5, 2, 3).matmul(Kiln.ones(3, 4)).shape
    assert_kiln_error(Kiln::ShapeError, /kiln_matmul/) { @x.matmul(Kiln.ones(3, 2)) }
  end

  def test_nn_composites
    sm = @x.softmax(dim: 1)
    e = Math.exp(1)
    assert_tensor [[1 / (1 + e), e / (1 + e)]] * 2, sm
    assert_tensor [[1 / (1 + e), e / (1 + e)]] * 2, Kiln.softmax(@x, dim: 1)
    assert_tensor [[0.5, 0.5], [0.5, 0.5]], Kiln.ones(2, 2).softmax(0)
    ls = @x.log_softmax(dim: -1)
    assert_tensor [[Math.log(1 / (1 + e)), Math.log(e / (1 + e))]] * 2, ls
    assert_tensor ls.to_a, Kiln.log_softmax(@x, axis: 1)
    assert_tensor [Math.log(Math.exp(1) + Math.exp(2)), Math.log(Math.exp(3) + Math.exp(4))], @x.logsumexp(dim: 1)
    assert_tensor [[Math.log(Math.exp(1) + Math.exp(3)), Math.log(Math.exp(2) + Math.exp(4))]],
                  @x.logsumexp(dim: 0, keepdim: true)
    ce = Kiln.cross_entropy(@x, Kiln.tensor([0, 1]))
    expect = -(Math.log(1 / (1 + e)) + Math.log(e / (1 + e))) / 2
    assert_tensor expect, ce
    assert_tensor expect, @x.cross_entropy([0, 1])
    assert_tensor 7.5, Kiln.mse_loss(@x, Kiln.zeros(2, 2))
    assert_tensor 7.5, @x.mse_loss([[0, 0], [0, 0]])
    assert_tensor [[-1.0, 1.0], [-1.0, 1.0]], @x.layer_norm, tol: 1e-4
    w = Kiln.tensor([2.0, 3.0])
    bias = Kiln.tensor([1.0, 0.0])
    assert_tensor [[-1.0, 3.0], [-1.0, 3.0]], Kiln.layer_norm(@x, w, bias), tol: 1e-4
    n = 0.5 / Math.sqrt(0.25 + 1e-3)
    assert_tensor [[-n, n], [-n, n]], @x.layer_norm(eps: 1e-3), tol: 1e-5
    assert_kiln_error(Kiln::DTypeError, /kiln_cross_entropy/) { Kiln.cross_entropy(@x, Kiln.tensor([0.0, 1.0])) }
  end

  def test_bad_operands
    assert_raises(TypeError) { @x + "a" }
    assert_raises(TypeError) { @x * nil }
    assert_raises(TypeError) { "a" * 0 + @x }
    assert_raises(TypeError) { [1] + @x }
    assert_raises(TypeError) { @x.coerce("a") }
    assert_kiln_error(Kiln::ShapeError, /kiln_add: shapes \[2,2\] and \[3\] cannot broadcast/) { @x + Kiln.ones(3) }
    assert_kiln_error(Kiln::Error, /kiln_sub/) { @b - @b }
  end
end
