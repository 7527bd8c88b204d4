# frozen_string_literal: true

require_relative "test_helper"
require "pp"

class ConversionTest < Minitest::Test
  def test_to_a_every_dtype
    assert_equal [[1.0, 2.0], [3.0, 4.0]], Kiln.tensor([[1.0, 2.0], [3.0, 4.0]]).to_a
    assert_equal [1.5, -2.25], Kiln.tensor([1.5, -2.25], dtype: :float64).to_a
    assert_equal [1, -2], Kiln.tensor([1, -2], dtype: :int32).to_a
    assert_equal [2**40, -3], Kiln.tensor([2**40, -3]).to_a
    assert_equal [[true], [false]], Kiln.tensor([[true], [false]]).to_a
    assert_equal 2.0, Kiln.tensor(2.0).to_a # 0-d: the number
    assert_equal [[], []], Kiln.zeros(2, 0).to_a
    assert_in_delta 0.1, Kiln.tensor([0.1]).to_a[0], 1e-7 # float32 precision
    assert_equal [0, 2, 4], Kiln.arange(0, 6, 2).to_a # evaluates a pending op
  end

  def test_item_to_f_to_i
    assert_kind_of Float, Kiln.tensor([[2.5]]).item
    assert_equal 2.5, Kiln.tensor([[2.5]]).item
    assert_equal 7, Kiln.tensor([7]).item
    assert_kind_of Integer, Kiln.tensor([7], dtype: :int32).item
    assert_equal false, Kiln.tensor(false).item
    assert_equal 3.0, Kiln.tensor([3]).to_f
    assert_equal 3, Kiln.tensor([3.9]).to_i
    assert_equal 1, Kiln.tensor(true).to_i
    assert_equal 0.0, Kiln.tensor(false).to_f
    assert Kiln.tensor(Float::NAN).item.nan? # a NaN value is not an error
    assert_kiln_error(Kiln::ShapeError, /kiln_item: a tensor of shape \[2\] has 2 elements, not 1/) do
      Kiln.tensor([1.0, 2.0]).item
    end
    assert_raises(Kiln::ShapeError) { Kiln.tensor([1, 2]).to_i }
  end

  def test_shape_dtype_ndim_numel_size_device
    x = Kiln.zeros(2, 3, 4, dtype: :float64)
    assert_equal [2, 3, 4], x.shape
    assert_equal :float64, x.dtype
    assert_equal 3, x.ndim
    assert_equal 24, x.numel
    assert_equal [2, 3, 4], x.size
    assert_equal :cpu, x.device
    ops_before = Kiln.stats[:flushes]
    y = (x * 2).sum(dim: 1)
    assert_equal [2, 4], y.shape # inspection never evaluates
    assert_equal ops_before, Kiln.stats[:flushes]
  end

  def test_inspect_pytorch_format
    x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert_equal "tensor([[1., 2.],\n        [3., 4.]])", x.inspect
    assert_equal x.inspect, x.to_s
    x.requires_grad = true
    assert_equal "tensor([[1., 2.],\n        [3., 4.]], requires_grad: true)", x.inspect
    assert_equal "tensor([1.5000, 2.0000])", Kiln.tensor([1.5, 2.0]).inspect
    assert_equal "tensor([1, 2], dtype=int32)", Kiln.tensor([1, 2], dtype: :int32).inspect
    assert_equal "tensor([ True, False])", Kiln.tensor([true, false]).inspect
    assert_equal "tensor(3)", Kiln.tensor(3).inspect
    assert_equal "tensor([], size=(2, 0))", Kiln.zeros(2, 0).inspect
    assert_equal "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])", Kiln.arange(2000).inspect
    assert_equal "tensor([[1., 2.],\n        [3., 4.]], requires_grad: true)\n", PP.pp(x, +"")
    assert_equal "[tensor(1.)]\n", PP.pp([Kiln.tensor(1.0)], +"")
  end
end
