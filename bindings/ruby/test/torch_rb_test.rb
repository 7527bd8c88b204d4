# frozen_string_literal: true

require_relative "test_helper"

# The traps a torch-rb user fell into (issue 17, item 2): each behaves as in torch-rb now.
class TorchRbTest < Minitest::Test
  def setup
    @x = Kiln.tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
  end

  def test_size_is_the_shape_and_size_dim_one_extent
    assert_equal [2, 3], @x.size
    assert_equal 2, @x.size(0)
    assert_equal 3, @x.size(1)
    assert_equal 3, @x.size(-1)
    assert_equal 2, @x.size(-2)
    assert_raises(IndexError) { @x.size(2) }
    assert_raises(IndexError) { @x.size(-3) }
    assert_equal 2, @x.dim
    assert_equal 6, @x.numel
    assert_equal [], Kiln.tensor(1.0).size
    assert_equal 0, Kiln.tensor(1.0).dim
  end

  def test_max_min_over_a_dim_give_values_and_indices
    values, indices = @x.max(1)
    assert_tensor [5.0, 6.0], values
    assert_tensor [1, 2], indices, dtype: :int64
    values, indices = @x.max(dim: 0, keepdim: true)
    assert_tensor [[4.0, 5.0, 6.0]], values
    assert_tensor [[1, 0, 1]], indices
    values, indices = @x.min(-1)
    assert_tensor [1.0, 2.0], values
    assert_tensor [0, 1], indices
    m = @x.max # no dim: a 0-d tensor
    assert_kind_of Kiln::Tensor, m
    assert_equal [], m.shape
    assert_equal 6.0, m.item
    assert_equal 1.0, @x.min.item
    _, idx = @x.max(1)
    refute_nil idx
  end

  def test_cat_positional_dim_and_one_axis_only
    assert_tensor [[1.0, 5.0, 3.0, 1.0, 5.0, 3.0], [4.0, 2.0, 6.0, 4.0, 2.0, 6.0]], Kiln.cat([@x, @x], 1)
    assert_equal [4, 3], Kiln.cat([@x, @x], 0).shape
    assert_equal [4, 3], Kiln.cat([@x, @x]).shape
    assert_equal [2, 6], Kiln.cat([@x, @x], dim: 1).shape
    assert_equal [2, 6], Kiln.cat([@x, @x], axis: -1).shape
    assert_equal [2, 2, 3], Kiln.stack([@x, @x], 1).shape
    assert_raises(ArgumentError) { Kiln.cat([@x, @x], dim: 0, axis: 1) }
    assert_raises(ArgumentError) { Kiln.cat([@x, @x], 0, dim: 0) }
    assert_raises(ArgumentError) { Kiln.stack([@x, @x], dim: 0, axis: 0) }
  end

  def test_integer_results_never_require_grad
    w = Kiln.tensor([1.0, 2.0, 3.0], requires_grad: true)
    assert w.requires_grad
    refute w.long.requires_grad
    refute w.argmax.requires_grad
    refute (w > 1).requires_grad
    refute w.max(0)[1].requires_grad
    assert w.max(0)[0].requires_grad
    # a float made from an integer result is a constant: no silent nil grad
    y = (w.long * 2).float.sum
    refute y.requires_grad
    assert_raises(Kiln::Error) { y.backward }
    assert_raises(Kiln::DTypeError) { Kiln.tensor([1, 2]).requires_grad = true }
    assert_raises(Kiln::DTypeError) { Kiln.tensor([1, 2], requires_grad: true) }
    # the float path still differentiates
    (w * w).sum.backward
    assert_tensor [2.0, 4.0, 6.0], w.grad
  end

  def test_in_place_ops_on_a_frozen_tensor_raise_frozen_error
    w = Kiln.ones(3).freeze
    assert_raises(FrozenError) { w.sub_scaled!(Kiln.ones(3), 0.1) }
    assert_raises(FrozenError) { w.assign!(Kiln.zeros(3)) }
    assert_raises(FrozenError) { w.add!(Kiln.ones(3)) }
    assert_raises(FrozenError) { w.mul!(2) }
    assert_raises(FrozenError) { w.zero! }
    assert_raises(FrozenError) { w[0] = 5 }
    assert_tensor [1.0, 1.0, 1.0], w
  end

  def test_non_numbers_in_tensor_data_raise_type_error
    e = assert_raises(TypeError) { Kiln.tensor(["a"]) }
    assert_match(/Kiln.tensor: "a" \(String\) is not a number/, e.message)
    assert_raises(TypeError) { Kiln.tensor([[1.0], [nil]]) }
  end

  def test_errors_name_the_ruby_level_op
    e = assert_raises(TypeError) { Kiln.where(nil, 1, 2) }
    assert_match(/\AKiln.where: cond/, e.message)
    e = assert_raises(TypeError) { Kiln.where(Kiln.tensor([true]), "a", 2) }
    assert_match(/\AKiln.where/, e.message)
    e = assert_raises(Kiln::Error) { Kiln.cross_entropy(Kiln.zeros(2, 3), [0, 5]) }
    assert_match(/\AKiln.cross_entropy: label 5 is out of range for 3 classes/, e.message)
    assert_equal :arg, e.status
    e = assert_raises(Kiln::Error) { Kiln.zeros(2, 3).cross_entropy([-1, 0]) }
    assert_match(/Kiln.cross_entropy: label -1/, e.message)
    assert_in_delta Math.log(3), Kiln.cross_entropy(Kiln.zeros(2, 3), [0, 2]).item, 1e-6
  end

  def test_where_still_takes_numbers_and_arrays
    c = Kiln.tensor([true, false])
    assert_tensor [1, 2], Kiln.where(c, 1, 2)
    assert_tensor [1.0, 9.0], Kiln.where([true, false], Kiln.tensor([1.0, 2.0]), 9)
    assert_tensor [1.0, 4.0], Kiln.where(c, [1.0, 2.0], [3.0, 4.0])
  end

  def test_enumerable_over_the_first_axis
    rows = @x.to_enum.map(&:to_a)
    assert_equal [[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], rows
    assert_equal 2, @x.count
    assert_equal [[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], @x.map(&:to_a)
    n = 0
    @x.each { |r| n += r.sum.item }
    assert_in_delta 21.0, n
    assert_raises(TypeError) { Kiln.tensor(1.0).each { nil } }
  end
end
