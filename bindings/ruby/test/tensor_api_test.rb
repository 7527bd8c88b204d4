# frozen_string_literal: true

require_relative "test_helper"

# index assignment, mask indexing, in-place ops, %, dot/mm/bmm, chunk/split,
# to_binary / from_binary (issue 17, item 4)
class TensorApiTest < Minitest::Test
  def test_index_assignment
    t = Kiln.zeros(3, 4)
    t[1, 2] = 5
    t[0, 1..2] = Kiln.tensor([7.0, 8.0])
    t[2] = 1.5
    t[0.., 3] = -1
    assert_tensor [[0.0, 7.0, 8.0, -1.0], [0.0, 0.0, 5.0, -1.0], [1.5, 1.5, 1.5, -1.0]], t
    i = Kiln.arange(6)
    i[(0..).step(2)] = 0
    assert_tensor [0, 1, 0, 3, 0, 5], i, dtype: :int64
    b = Kiln.tensor([false, false, false])
    b[1] = true
    assert_tensor [false, true, false], b, dtype: :bool
    r = Kiln.zeros(3, 2)
    r[Kiln.tensor([0, 2])] = Kiln.tensor([1.0, 2.0])
    assert_tensor [[1.0, 2.0], [0.0, 0.0], [1.0, 2.0]], r
  end

  def test_index_assignment_rebinds_views_keep_old_value
    t = Kiln.zeros(2, 2)
    row = t[0]
    t[0, 0] = 3
    assert_tensor [0.0, 0.0], row
    assert_tensor [[3.0, 0.0], [0.0, 0.0]], t
  end

  def test_index_assignment_is_differentiable_in_the_value
    v = Kiln.tensor([2.0, 3.0], requires_grad: true)
    t = Kiln.zeros(2, 2)
    t[1] = v
    (t * t).sum.backward
    assert_tensor [4.0, 6.0], v.grad
  end

  def test_mask_indexing
    x = Kiln.tensor([[1.0, -2.0], [-3.0, 4.0]])
    assert_tensor [1.0, 4.0], x[x > 0]
    assert_tensor [[-3.0, 4.0]], x[Kiln.tensor([false, true])]
    x[x < 0] = 0
    assert_tensor [[1.0, 0.0], [0.0, 4.0]], x
    y = Kiln.ones(2, 3)
    y[Kiln.tensor([true, false])] = 7
    assert_tensor [[7.0, 7.0, 7.0], [1.0, 1.0, 1.0]], y
    assert_raises(Kiln::ShapeError) { x[Kiln.tensor([true, false, true])] }
  end

  def test_in_place_arithmetic
    w = Kiln.tensor([1.0, 2.0])
    same = w
    w.add!(Kiln.tensor([1.0, 1.0]))
    w.add!(Kiln.tensor([1.0, 1.0]), alpha: 2)
    w.add!(1)
    assert_tensor [5.0, 6.0], w
    w.mul!(2)
    assert_tensor [10.0, 12.0], w
    w.sub!(Kiln.tensor([10.0, 10.0]))
    w.div!(2)
    assert_tensor [0.0, 1.0], w
    w.zero!
    assert_tensor [0.0, 0.0], w
    w.fill!(3)
    w.copy!(Kiln.tensor([4, 5]))
    assert_tensor [4.0, 5.0], w, dtype: :float32
    big = Kiln.tensor([1, 2, 3], dtype: :int64).masked_fill(Kiln.tensor([true, false, true]), 2**60 + 1)
    assert_equal [2**60 + 1, 2, 2**60 + 1], big.to_a # exact past 2**53
    assert_raises(RangeError) { Kiln.tensor([1, 2]).masked_fill(Kiln.tensor([true, false]), 2**70) }
    w.copy!(Kiln.tensor(7.0)) # broadcast, as torch's copy_
    assert_tensor [7.0, 7.0], w, dtype: :float32
    assert_raises(Kiln::ShapeError) { w.copy!(Kiln.tensor([1.0, 2.0, 3.0])) }
    w.copy!(Kiln.tensor([4, 5]))
    assert_same same, w
    i = Kiln.tensor([1, 2])
    i.mul!(3)
    assert_tensor [3, 6], i, dtype: :int64
  end

  def test_remainder_has_the_sign_of_the_divisor
    x = Kiln.tensor([5.0, -5.0, 5.5, -0.5])
    assert_tensor [2.0, 1.0, 2.5, 2.5], x % 3
    assert_tensor [-1.0, -2.0, -0.5, -0.5], x % -3
    i = Kiln.tensor([7, -7, 6])
    assert_tensor [1, 2, 0], i % 3, dtype: :int64
    assert_tensor [-2, -1, 0], i.remainder(-3), dtype: :int64
    assert_tensor [1, 1, 0], i % Kiln.tensor([3, 2, 2]), dtype: :int64
    assert_tensor [1.0, 0.5, 0.0], i % 1.5, dtype: :float32
  end

  def test_dot_mm_bmm
    a = Kiln.tensor([1.0, 2.0, 3.0])
    assert_tensor 14.0, a.dot(a)
    m = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert_tensor [[7.0, 10.0], [15.0, 22.0]], m.mm(m)
    b = Kiln.stack([m, m * 2])
    assert_tensor [[[7.0, 10.0], [15.0, 22.0]], [[28.0, 40.0], [60.0, 88.0]]], b.bmm(b)
    assert_raises(Kiln::ShapeError) { m.dot(a) }
    assert_raises(Kiln::ShapeError) { a.mm(m) }
    assert_raises(Kiln::ShapeError) { m.bmm(m) }
  end

  def test_chunk_and_split
    x = Kiln.arange(10).reshape(5, 2)
    parts = x.chunk(2)
    assert_equal [[3, 2], [2, 2]], parts.map(&:shape)
    assert_tensor [[6, 7], [8, 9]], parts[1]
    assert_equal [[5, 1], [5, 1]], x.chunk(2, 1).map(&:shape)
    assert_equal [[2, 2], [2, 2], [1, 2]], x.split(2).map(&:shape)
    assert_equal [[1, 2], [4, 2]], x.split([1, 4]).map(&:shape)
    assert_tensor [[2, 3], [4, 5], [6, 7], [8, 9]], x.split([1, 4])[1]
    assert_raises(Kiln::ShapeError) { x.split([1, 2]) }
    assert_equal [[5, 1], [5, 1]], x.split(1, -1).map(&:shape)
  end

  def test_to_binary_and_from_binary
    x = Kiln.tensor([[1.5, -2.0], [3.25, 4.0]])
    bin = x.to_binary
    assert_equal Encoding::ASCII_8BIT, bin.encoding
    assert_equal [1.5, -2.0, 3.25, 4.0].pack("e*"), bin # little-endian float32
    y = Kiln.from_binary(bin, :float32, [2, 2])
    assert_tensor x.to_a, y
    i = Kiln.from_binary([1, -2, 3].pack("q<*"), :int64, 3)
    assert_tensor [1, -2, 3], i, dtype: :int64
    assert_equal [true, false].map { |v| v ? 1 : 0 }.pack("C*"), Kiln.tensor([true, false]).to_binary
    big = Kiln.arange(10_000).float # > 4 KiB: written straight into the String
    assert_equal (0...10_000).map(&:to_f).pack("e*"), (big * 1).to_binary
    assert_equal "", Kiln.zeros(0).to_binary
    assert_raises(ArgumentError) { Kiln.from_binary("abc", :float32, [1]) }
    assert_equal [1.5, -2.0], Kiln.from_binary([0x3fc0, 0xc000].pack("S<*"), :bfloat16, 2).to_a
    assert_equal [0x3fc0, 0xc000].pack("S<*"), Kiln.tensor([1.5, -2.0], dtype: :bfloat16).to_binary
    assert_raises(Kiln::DTypeError) { Kiln.from_binary("abcd", :complex64, [1]) }
  end
end
