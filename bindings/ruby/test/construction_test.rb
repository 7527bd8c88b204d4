# frozen_string_literal: true

require_relative "test_helper"
require "objspace"

class ConstructionTest < Minitest::Test
  def test_tensor_infers_dtype
    assert_tensor [[1.0, 2.0], [3.0, 4.0]], Kiln.tensor([[1.0, 2.0], [3.0, 4.0]]), dtype: :float32
    assert_tensor [1, 2, 3], Kiln.tensor([1, 2, 3]), dtype: :int64
    assert_tensor [true, false], Kiln.tensor([true, false]), dtype: :bool
    assert_tensor [1.0, 2.5], Kiln.tensor([1, 2.5]), dtype: :float32      # mixed Integer/Float
    assert_tensor [1, 0, 7], Kiln.tensor([true, false, 7]), dtype: :int64 # bool < int64
    assert_tensor [1.0, 0.5], Kiln.tensor([true, 0.5]), dtype: :float32
  end

  def test_tensor_explicit_dtype
    assert_tensor [1.0, 2.0], Kiln.tensor([1, 2], dtype: :float64), dtype: :float64
    assert_tensor [1, -2], Kiln.tensor([1.9, -2.9], dtype: :int32), dtype: :int32 # toward zero
    assert_tensor [true, false, true], Kiln.tensor([2, 0, -1], dtype: :bool), dtype: :bool
    assert_tensor [1], Kiln.tensor([1], dtype: "int64"), dtype: :int64
    assert_equal :float32, Kiln.tensor([1], dtype: :float).dtype
    assert_equal :float64, Kiln.tensor([1], dtype: :double).dtype
    assert_equal :int32, Kiln.tensor([1], dtype: :int).dtype
    assert_equal :int64, Kiln.tensor([1], dtype: :long).dtype
  end

  def test_scalars_and_empty
    t = Kiln.tensor(3.5)
    assert_equal [], t.shape
    assert_equal 0, t.ndim
    assert_equal 1, t.numel
    assert_in_delta 3.5, t.item
    assert_equal 7, Kiln.tensor(7).item
    assert_equal true, Kiln.tensor(true).item
    e = Kiln.tensor([])
    assert_equal [0], e.shape
    assert_equal :float32, e.dtype
    assert_equal [], e.to_a
    assert_equal [2, 0], Kiln.tensor([[], []]).shape
  end

  def test_int64_range
    big = 2**62 + 1
    assert_equal [big, -big], Kiln.tensor([big, -big]).to_a
    assert_equal [2**63 - 1, -2**63], Kiln.tensor([2**63 - 1, -2**63]).to_a
    e = assert_raises(RangeError) { Kiln.tensor([2**70]) }
    assert_equal "Kiln.tensor: #{2**70} does not fit in int64", e.message
    e = assert_raises(RangeError) { Kiln.tensor([2**63]) }
    assert_includes e.message, "#{2**63} does not fit in int64"
    e = assert_raises(RangeError) { Kiln.tensor([2**40], dtype: :int32) }
    assert_includes e.message, "#{2**40} does not fit in int32"
    assert_raises(RangeError) { Kiln.tensor([Float::NAN], dtype: :int64) }
  end

  def test_ragged_and_bad_elements
    assert_kiln_error(Kiln::ShapeError, /ragged.*depth 1 has 1 elements, expected 2/) do
      Kiln.tensor([[1, 2], [3]])
    end
    assert_kiln_error(Kiln::ShapeError, /ragged/) { Kiln.tensor([[1, 2], 3]) }
    assert_kiln_error(Kiln::ShapeError, /ragged/) { Kiln.tensor([1, [2]]) }
    assert_kiln_error(Kiln::ShapeError, /deeper than 8/) { Kiln.tensor([[[[[[[[[1]]]]]]]]]) }
    assert_kiln_error(TypeError, /"a" \(String\) is not a number/) { Kiln.tensor([1, "a"]) }
    assert_kiln_error(TypeError, /nil/) { Kiln.tensor([nil]) }
    assert_kiln_error(Kiln::DTypeError, /unknown dtype :complex64/) { Kiln.tensor([1], dtype: :complex64) }
  end

  def test_tensor_from_tensor
    a = Kiln.tensor([1.0, 2.0], requires_grad: true)
    b = Kiln.tensor(a)
    refute b.requires_grad
    assert_tensor [1.0, 2.0], b
    c = Kiln.tensor(a, dtype: :float64, requires_grad: true)
    assert_equal :float64, c.dtype
    assert c.requires_grad
    assert_tensor [1.0, 2.0], Kiln::Tensor.new([1.0, 2.0])
  end

  def test_zeros_ones_full
    assert_tensor [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], Kiln.zeros(2, 3), dtype: :float32
    assert_tensor [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], Kiln.ones([2, 3], dtype: :float64), dtype: :float64
    assert_equal [], Kiln.zeros.shape
    assert_equal [], Kiln.zeros([]).shape
    assert_tensor [[7, 7], [7, 7]], Kiln.full([2, 2], 7), dtype: :int64
    assert_tensor [0.5, 0.5], Kiln.full(2, 0.5), dtype: :float32
    assert_tensor [true], Kiln.full([1], true), dtype: :bool
    assert_tensor [3.0], Kiln.full([1], 3, dtype: :float64), dtype: :float64
    x = Kiln.tensor([[1, 2]], dtype: :int32)
    assert_tensor [[0, 0]], Kiln.zeros_like(x), dtype: :int32
    assert_tensor [[1.0, 1.0]], Kiln.ones_like(x, dtype: :float32), dtype: :float32
    assert_tensor [[9, 9]], Kiln.full_like(x, 9), dtype: :int32
    assert Kiln.zeros(2, requires_grad: true).requires_grad
    assert_kiln_error(Kiln::ShapeError, /\Akiln_zeros: negative size -1 in shape \[-1\]\z/) { Kiln.zeros(-1) }
    assert_kiln_error(Kiln::ShapeError, /\Akiln_ones: negative size -2/) { Kiln.ones([2, -2]) }
    assert_kiln_error(Kiln::ShapeError, /\Akiln_full: negative size -3/) { Kiln.full([-3], 1.0) }
    assert_kiln_error(Kiln::ShapeError, /ndim 9 is out of range/) { Kiln.zeros([1] * 9) }
    assert_raises(TypeError) { Kiln.zeros(2.5) }
  end

  def test_arange
    assert_tensor [0, 2, 4, 6, 8], Kiln.arange(0, 10, 2), dtype: :int64
    assert_tensor [0, 1, 2], Kiln.arange(3), dtype: :int64
    assert_tensor [0.0, 0.25, 0.5, 0.75], Kiln.arange(0, 1, 0.25), dtype: :float32
    assert_tensor [5.0, 4.0], Kiln.arange(5, 3, -1, dtype: :float64), dtype: :float64
    assert_kiln_error(Kiln::Error, /kiln_arange: bad range/) { Kiln.arange(0, 1, 0) }
  end

  def test_rand_randn_manual_seed
    Kiln.manual_seed(42)
    a = Kiln.rand(100).to_a
    Kiln.manual_seed(42)
    b = Kiln.rand(100).to_a
    assert_equal a, b
    assert(a.all? { |v| v >= 0.0 && v < 1.0 })
    refute_equal a, Kiln.rand(100).to_a
    n = Kiln.randn(2, 2, dtype: :float64)
    assert_equal [2, 2], n.shape
    assert_equal :float64, n.dtype
    big = Kiln.randn(10_000)
    assert_in_delta 0.0, big.mean.item, 0.05
    assert_in_delta 1.0, (big * big).mean.item, 0.05
    assert_kiln_error(Kiln::DTypeError, /kiln_rand: dtype int32 is not a float dtype/) do
      Kiln.rand(4, dtype: :int32)
    end
  end

  def test_memsize_and_gc_accounting
    t = Kiln.zeros(1000, dtype: :float64)
    assert_operator ObjectSpace.memsize_of(t), :>=, 8000
    data = Array.new(100_000, 1.5)
    GC.start
    before = Kiln.gc_held_bytes
    u = Kiln.tensor(data)
    # the 400 kB Kiln copied into count for the GC pacer, and memsize_of says so
    assert_operator Kiln.gc_held_bytes - before, :>=, 400_000
    assert_operator ObjectSpace.memsize_of(u), :>=, 400_000
    u = nil # rubocop:disable Lint/UselessAssignment
    GC.start
    assert_operator Kiln.gc_held_bytes, :<, before + 400_000
  end

  # The pacer runs a GC when the handles hold twice what they held after the
  # last one (64 MiB at least), not for every large op as Ruby's malloc limit
  # would (W1 from Ruby: 8 GCs per evaluation before, 40 of 240 major).
  def test_gc_pacer_collects_never_read_results_without_a_gc_per_op
    x = Kiln.rand(1 << 20) # 4 MiB
    Kiln.sync
    GC.start
    gcs = GC.count
    held = []
    100.times do
      x * 2.0 # 4 MiB nobody reads
      held << Kiln.gc_held_bytes
    end
    ran = GC.count - gcs
    assert_operator ran, :>=, 2, "400 MiB of never-read results ran no GC"
    assert_operator ran, :<=, 20, "a GC for (nearly) every op: #{ran} for 100"
    assert_operator held.max, :<, 200 << 20, "the handles held #{held.max >> 20} MiB at most"
  end
end
