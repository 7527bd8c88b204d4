# frozen_string_literal: true

require_relative "test_helper"

class ShapeTest < Minitest::Test
  def setup
    @a = Kiln.arange(6).reshape(2, 3) # [[0, 1, 2], [3, 4, 5]]
    @v = Kiln.arange(10)
  end

  def test_reshape_view_flatten
    assert_tensor [[0, 1], [2, 3], [4, 5]], @a.reshape(3, 2)
    assert_tensor [[0, 1], [2, 3], [4, 5]], @a.reshape([3, 2])
    assert_tensor [[0, 1, 2, 3, 4, 5]], @a.reshape(1, -1)
    assert_tensor [0, 1, 2, 3, 4, 5], @a.view(6)
    assert_tensor [0, 1, 2, 3, 4, 5], @a.flatten
    assert_equal [2, 12], Kiln.zeros(2, 3, 4).flatten(1).shape
    assert_equal [6, 4], Kiln.zeros(2, 3, 4).flatten(0, 1).shape
    assert_equal [1], Kiln.tensor(1.0).flatten.shape
    assert_raises(Kiln::ShapeError) { @a.flatten(2) }
    assert_kiln_error(Kiln::ShapeError, /kiln_reshape/) { @a.reshape(4, 2) }
  end

  def test_transpose_permute_t_expand
    assert_tensor [[0, 3], [1, 4], [2, 5]], @a.transpose(0, 1)
    assert_tensor [[0, 3], [1, 4], [2, 5]], @a.transpose(-1, -2)
    assert_tensor [[0, 3], [1, 4], [2, 5]], @a.t
    assert_tensor [0, 1], Kiln.tensor([0, 1]).t
    assert_tensor [[0, 3], [1, 4], [2, 5]], @a.permute(1, 0)
    assert_equal [4, 2, 3], Kiln.zeros(2, 3, 4).permute([2, 0, 1]).shape
    assert_kiln_error(Kiln::ShapeError, /kiln_permute: 2 dims given for a tensor of 3 dimensions/) do
      Kiln.zeros(2, 3, 4).permute(2, 0)
    end
    assert_tensor [[1, 2], [1, 2], [1, 2]], Kiln.tensor([1, 2]).expand(3, 2)
    assert_tensor [[1, 1], [2, 2]], Kiln.tensor([[1], [2]]).expand([2, 2])
    assert_kiln_error(Kiln::Error, /kiln_transpose: axis 2 is out of range/) { @a.transpose(0, 2) }
    assert_kiln_error(Kiln::ShapeError, /kiln_expand/) { Kiln.tensor([1, 2]).expand(3, 3) }
  end

  def test_squeeze_unsqueeze
    z = Kiln.zeros(1, 2, 1)
    assert_equal [2, 1], z.squeeze(0).shape
    assert_equal [1, 2], z.squeeze(-1).shape
    assert_equal [2], z.squeeze.shape
    assert_equal [1, 2, 3], @a.unsqueeze(0).shape
    assert_equal [2, 3, 1], @a.unsqueeze(-1).shape
    assert_equal [2, 3], @a.squeeze(0).shape # an axis not of size 1: as it is (torch's)
    assert_kiln_error(Kiln::Error, /kiln_squeeze: axis 2 is out of range/) { @a.squeeze(2) }
  end

  def test_indexing_with_integers
    assert_tensor [0, 1, 2], @a[0]
    assert_tensor [3, 4, 5], @a[-1]
    assert_tensor 4, @a[1, 1]
    assert_tensor 5, @a[-1, -1]
    assert_equal [], @a[1, 2].shape
    e = assert_raises(IndexError) { @a[2] }
    assert_match(/index 2 is out of range for dimension 0 of size 2/, e.message)
    assert_raises(IndexError) { @a[0, -4] }
    assert_raises(IndexError) { @a[0, 0, 0] }
    assert_raises(ArgumentError) { @a[] }
    assert_raises(TypeError) { @a["x"] }
  end

  def test_indexing_with_ranges
    assert_tensor [2, 3, 4], @v[2..4]
    assert_tensor [2, 3], @v[2...4]
    assert_tensor [7, 8, 9], @v[7..]
    assert_tensor [7, 8, 9], @v[-3..]
    assert_tensor [0, 1, 2], @v[..2]
    assert_tensor [0, 1], @v[...2]
    assert_tensor [1, 2, 3, 4, 5, 6, 7, 8], @v[1...-1]
    assert_tensor [8], @v[-2..-2]
    assert_tensor [], @v[5..2]
    assert_tensor [], @v[20..]
    assert_tensor [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], @v[-20..]
    assert_tensor [[1, 2], [4, 5]], @a[0.., 1..]
    assert_tensor [1, 4], @a[(0..), 1]
    assert_tensor [[3, 4]], @a[1..1, 0...2]
  end

  def test_indexing_with_steps
    assert_tensor [0, 3, 6, 9], @v[(0..).step(3)]
    assert_tensor [1, 3, 5], @v[(1...7).step(2)]
    assert_tensor [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], @v[9.step(0, -1)]
    assert_tensor [5, 3, 1], @v[5.step(1, -2)]
    assert_tensor [[2, 1, 0], [5, 4, 3]], @a[0.., 2.step(0, -1)]
  end

  def test_indexing_with_a_tensor_and_index_ops
    assert_tensor [[3, 4, 5], [0, 1, 2], [3, 4, 5]], @a[Kiln.tensor([1, 0, 1])]
    assert_tensor [[2, 0], [5, 3]], @a.index_select(1, Kiln.tensor([2, 0]))
    assert_tensor [[2, 0], [5, 3]], @a.index_select(1, [2, 0])
    assert_tensor [[1], [5]], @a.gather(1, Kiln.tensor([[1], [2]]))
    z = Kiln.zeros(2, 3)
    s = z.scatter_add(1, Kiln.tensor([[0, 0], [2, 1]]), Kiln.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert_tensor [[3.0, 0.0, 0.0], [0.0, 4.0, 3.0]], s
    # Index values are data: a bad one is reported when the result is evaluated.
    # In a thread of its own: the failed node stays in its thread's pending
    # graph (making Kiln.sync there fail) until Ruby's GC releases it.
    Thread.new do
      bad = @a.index_select(0, Kiln.tensor([5]))
      assert_equal [1, 3], bad.shape
      assert_kiln_error(Kiln::Error, /kiln_index_select: index 5 is out of range for axis 0 of size 2/) { bad.to_a }
      assert_kiln_error(Kiln::Error, /kiln_gather: index 7/) { @a.gather(1, Kiln.tensor([[7], [0]])).to_a }
    end.join
  end

  def test_cat_stack
    assert_tensor [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]], Kiln.cat([@a, @a])
    assert_tensor [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]], Kiln.cat([@a, @a], dim: 1)
    assert_tensor [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]], Kiln.concat([@a, @a], axis: -1)
    assert_equal [2, 2, 3], Kiln.stack([@a, @a]).shape
    assert_equal [2, 3, 2], Kiln.stack([@a, @a], dim: 2).shape
    assert_kiln_error(Kiln::Error, /kiln_concat: needs at least one tensor/) { Kiln.cat([]) }
    assert_raises(TypeError) { Kiln.cat([@a, 1]) }
  end

  def test_views_do_not_change_the_base
    base = Kiln.tensor([1.0, 2.0, 3.0])
    view = base[0..1]
    base.assign!(Kiln.tensor([7.0, 8.0, 9.0]))
    assert_tensor [1.0, 2.0], view # views taken before keep the old value
    assert_tensor [7.0, 8.0, 9.0], base
    d = base.dup
    assert_tensor [7.0, 8.0, 9.0], d
    c = base.clone
    base.assign!(Kiln.zeros(3))
    assert_tensor [7.0, 8.0, 9.0], c # a copy is a new handle: assign! on base does not touch it
  end
end
