# frozen_string_literal: true

require_relative "test_helper"

begin
  require "numo/narray"
rescue LoadError
  nil
end

# Numo::NArray in and out (torch-rb's Torch.from_numo and Tensor#numo).
# numo-narray is a gem with no Debian package, so where it is not installed
# (CI) these skip, and only the error for a missing Numo is checked.
class NumoTest < Minitest::Test
  def setup
    skip "numo-narray is not installed (gem install numo-narray)" unless defined?(Numo::NArray)
  end

  def test_every_dtype_round_trips
    {
      Numo::DFloat => [:float64, [[1.5, -2.25], [1e300, 0.0]]],
      Numo::SFloat => [:float32, [[1.5, -2.25], [3.0, 0.0]]],
      Numo::Int64 => [:int64, [[2**62, -3], [0, 7]]],
      Numo::Int32 => [:int32, [[2**31 - 1, -3], [0, 7]]],
      Numo::Int16 => [:int16, [[-32_768, 3], [0, 7]]],
      Numo::Int8 => [:int8, [[-128, 127], [0, 7]]],
      Numo::UInt8 => [:uint8, [[255, 3], [0, 7]]]
    }.each do |klass, (dtype, values)|
      t = Kiln.from_numo(klass.cast(values))
      assert_equal dtype, t.dtype, klass.name
      assert_equal values, t.to_a, klass.name
      back = t.numo
      assert_instance_of klass, back
      assert_equal [2, 2], back.shape
      assert_equal values, back.to_a, klass.name
    end
  end

  def test_what_kiln_has_no_dtype_for
    assert_equal [true, false, true], Kiln.from_numo(Numo::Bit.cast([1, 0, 1])).to_a
    assert_instance_of Numo::Bit, Kiln.tensor([true, false]).numo
    assert_equal [1, 0], Kiln.tensor([true, false]).numo.to_a
    wide = Kiln.from_numo(Numo::UInt16.cast([65_535]))
    assert_equal [:int32, [65_535]], [wide.dtype, wide.to_a]
    assert_equal :int64, Kiln.from_numo(Numo::UInt32.cast([2**32 - 1])).dtype
    assert_equal [2**63 - 1], Kiln.from_numo(Numo::UInt64.cast([2**63 - 1])).to_a
    assert_raises(RangeError) { Kiln.from_numo(Numo::UInt64.cast([2**64 - 1])) }
    assert_raises(Kiln::DTypeError) { Kiln.from_numo(Numo::DComplex.cast([1])) }
    assert_raises(TypeError) { Kiln.from_numo([1, 2]) }
    h = Kiln.tensor([1.5, -2.25], dtype: :bfloat16).numo # Numo has no 16-bit floats
    assert_instance_of Numo::SFloat, h
    assert_equal [1.5, -2.25], h.to_a
  end

  def test_views_scalars_and_pending_values
    view = Numo::DFloat.new(3, 4).seq[1..2, 1..2] # a non-contiguous slice
    assert_equal [[5.0, 6.0], [9.0, 10.0]], Kiln.from_numo(view).to_a
    assert_equal [], Kiln.tensor(3.0).numo.shape
    x = Kiln.arange(6).reshape(2, 3).transpose(0, 1) * 2 # pending, transposed
    assert_equal [[0, 6], [2, 8], [4, 10]], x.numo.to_a
  end
end

# without numo-narray, Tensor#numo says what to install
class NumoMissingTest < Minitest::Test
  def test_numo_without_numo_narray_says_what_to_install
    skip "numo-narray is installed" if defined?(Numo::NArray)
    error = assert_raises(Kiln::Error) { Kiln.ones(2).numo }
    assert_match(/gem install numo-narray/, error.message)
    assert_raises(TypeError) { Kiln.from_numo([1, 2]) }
  end
end
