# frozen_string_literal: true

require_relative "test_helper"

# lib/kiln/tensor_more.rb: torch-rb's triangles, predicates, elementwise
# extras, flips and rolls, views by example and small products, each
# against values computed by hand, and as a Kiln.name module function
class TensorMoreTest < Minitest::Test
  def a
    Kiln.arange(12, dtype: :float64).reshape(3, 4)
  end

  def test_triu_and_tril
    assert_tensor [[0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 6.0, 7.0], [0.0, 0.0, 0.0, 11.0]], a.triu(1)
    assert_tensor [[0.0, 0.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0], [8.0, 9.0, 0.0, 0.0]], Kiln.tril(a, -1)
    assert_tensor [[0.0, 0.0, 0.0, 0.0], [4.0, 5.0, 0.0, 0.0], [8.0, 9.0, 10.0, 0.0]], a.tril
    assert_tensor [[0.0, 1.0, 2.0, 3.0], [0.0, 5.0, 6.0, 7.0], [0.0, 0.0, 10.0, 11.0]], a.triu(diagonal: 0)
    mask = Kiln.ones(3, 3, dtype: :bool).triu(1)
    assert_tensor [[false, true, true], [false, false, true], [false, false, false]], mask, dtype: :bool
    g = Kiln.randn(3, 3, requires_grad: true)
    (g.tril * 2).sum.backward
    assert_tensor [[2.0, 0.0, 0.0], [2.0, 2.0, 0.0], [2.0, 2.0, 2.0]], g.grad
    assert_raises(Kiln::ShapeError) { Kiln.ones(3).triu }
  end

  # attention with a causal mask built by triu runs as the causal op: the
  # same values as is_causal
  def test_a_triu_mask_is_causal_attention
    q = Kiln.randn(1, 2, 5, 4)
    k = Kiln.randn(1, 2, 5, 4)
    v = Kiln.randn(1, 2, 5, 4)
    keep = Kiln.ones(5, 5, dtype: :bool).triu(1).logical_not
    f = Kiln::NN::Functional
    assert_tensor f.scaled_dot_product_attention(q, k, v, is_causal: true).to_a,
                  f.scaled_dot_product_attention(q, k, v, attn_mask: keep), tol: 0
  end

  def test_float_predicates_and_nan_to_num
    t = Kiln.tensor([1.0, -0.0, Float::NAN, Float::INFINITY, -Float::INFINITY])
    assert_tensor [false, false, true, false, false], t.isnan, dtype: :bool
    assert_tensor [false, false, false, true, true], Kiln.isinf(t), dtype: :bool
    assert_tensor [true, true, false, false, false], t.isfinite, dtype: :bool
    assert_tensor [true, true], Kiln.tensor([1, 2]).isfinite, dtype: :bool
    assert_tensor [1.0, 0.0, 0.0, 3.4028234663852886e38, -3.4028234663852886e38], t.nan_to_num, tol: 0
    assert_tensor [1.0, 0.0, 1.0, 2.0, -2.0], t.nan_to_num(nan: 1.0, posinf: 2.0, neginf: -2.0)
  end

  def test_elementwise_extras
    x = Kiln.tensor([-2.5, -1.0, 0.5, 3.75], dtype: :float64)
    assert_tensor [-2.0, -1.0, 0.0, 3.0], x.trunc
    assert_tensor [-0.5, 0.0, 0.5, 0.75], x.frac
    assert_tensor [6.25, 1.0, 0.25, 14.0625], x.square
    assert_tensor [-0.4, -1.0, 2.0, 1 / 3.75], x.reciprocal, tol: 1e-12
    assert_tensor [0.5, 1.0, 4.0], Kiln.tensor([-1.0, 0.0, 2.0]).exp2
    assert_tensor [-1.0, 0.0, 2.0], Kiln.tensor([0.5, 1.0, 4.0]).log2
    assert_tensor [-1.0, 0.0, 2.0], Kiln.tensor([0.1, 1.0, 100.0], dtype: :float64).log10, tol: 1e-12
    assert_tensor [Math.tan(0.5), Math.tan(-1.0)], Kiln.tensor([0.5, -1.0], dtype: :float64).tan, tol: 1e-12
    assert_tensor [-2.0, -1.0, 0.0, 1.0], x.floor_divide(2)
    assert_tensor [-4, 3], Kiln.tensor([-7, 7]).floor_divide(2), dtype: :int64
    assert_tensor [-0.5, -1.0, 0.5, 1.75], x.fmod(2)
    assert_tensor [-1, 1], Kiln.tensor([-7, 7]).fmod(3), dtype: :int64
    assert_tensor [0.0, 0.0, 0.5, 3.75], x.clamp_min(0)
    assert_tensor [-2.5, -1.0, 0.0, 0.0], x.clamp_max(0)
    assert_tensor [-1.25, -0.5, 0.25, 1.875], x.lerp(Kiln.zeros(4, dtype: :float64), 0.5)
    assert_tensor [-1.5, 0.0, 1.5, 4.75], x.addcmul(Kiln.ones(4, dtype: :float64), Kiln.ones(4, dtype: :float64))
    assert_tensor [-1.5, 0.0, 1.5, 4.75], x.addcdiv(Kiln.full([4], 2.0), Kiln.full([4], 2.0))
    assert_tensor [false, true, true], Kiln.logical_xor(Kiln.tensor([true, false, true]), Kiln.tensor([true, true, false]))
    assert_tensor [true, false, true], x[0..2].isclose(Kiln.tensor([-2.5 + 1e-9, -1.1, Float::NAN]), equal_nan: false).logical_or(Kiln.tensor([false, false, true]))
    assert x.allclose(x + 1e-9)
    refute x.allclose(x + 1e-3)
  end

  def test_flip_roll_narrow_unbind
    assert_tensor [[8.0, 9.0, 10.0, 11.0], [4.0, 5.0, 6.0, 7.0], [0.0, 1.0, 2.0, 3.0]], a.flip(0)
    assert_tensor [[11.0, 10.0, 9.0, 8.0], [7.0, 6.0, 5.0, 4.0], [3.0, 2.0, 1.0, 0.0]], Kiln.flip(a, [0, 1])
    assert_tensor [[3.0, 0.0, 1.0, 2.0], [7.0, 4.0, 5.0, 6.0], [11.0, 8.0, 9.0, 10.0]], a.roll(1, 1)
    assert_tensor [[11.0, 0.0, 1.0, 2.0], [3.0, 4.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0]], Kiln.roll(a, 1)
    assert_tensor [[9.0, 10.0, 11.0, 8.0], [1.0, 2.0, 3.0, 0.0], [5.0, 6.0, 7.0, 4.0]], a.roll([1, -1], [0, 1])
    assert_tensor [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]], a.narrow(1, 1, 2)
    assert_raises(IndexError) { a.narrow(1, 3, 2) }
    assert_equal [[0.0, 4.0, 8.0], [3.0, 7.0, 11.0]], a.unbind(1).values_at(0, 3).map(&:to_a)
    assert_equal [4, 3], a.movedim(0, 1).shape
    assert_equal [4, 2, 3], Kiln.zeros(2, 3, 4).movedim(-1, 0).shape
    assert_equal [4, 3], a.swapaxes(0, 1).shape
    g = Kiln.arange(4, dtype: :float64).requires_grad!
    (g.flip(0) * Kiln.tensor([1.0, 2.0, 3.0, 4.0], dtype: :float64)).sum.backward
    assert_tensor [4.0, 3.0, 2.0, 1.0], g.grad
  end

  def test_diagonals_and_views_by_example
    assert_tensor [0.0, 5.0, 10.0], a.diagonal
    assert_tensor [1.0, 6.0, 11.0], a.diagonal(1)
    assert_tensor [4.0, 9.0], a.diagonal(-1)
    assert_tensor [0.0, 5.0, 10.0], Kiln.diag(a)
    assert_tensor [[1.0, 0.0], [0.0, 2.0]], Kiln.tensor([1.0, 2.0]).diag
    assert_tensor [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]], Kiln.tensor([1.0, 2.0]).diag(1)
    assert_tensor [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], Kiln.tensor([1.0, 2.0]).diag(-1)
    assert_equal [2, 3, 4], a.expand_as(Kiln.zeros(2, 3, 4)).shape
    assert_equal [2, 3, 4], a.broadcast_to([2, 3, 4]).shape
    assert_equal [4, 3], a.view_as(Kiln.zeros(4, 3)).shape
    assert_equal :float32, a.type_as(Kiln.zeros(1)).dtype
    assert_equal [3, 8], a.tile(2).shape
    assert_tensor [3, 3], a.new_full([2], 3), dtype: :float64
    assert_equal [:float64, [2, 2]], [a.new_zeros(2, 2).dtype, a.new_ones(2, 2).shape]
  end

  def test_products_and_statistics
    v = Kiln.tensor([1.0, 2.0])
    assert_tensor [[3.0, 4.0, 5.0], [6.0, 8.0, 10.0]], Kiln.outer(v, Kiln.tensor([3.0, 4.0, 5.0]))
    assert_tensor [6.0, 22.0, 38.0], a.mv(Kiln.ones(4, dtype: :float64))
    assert_tensor [[3.0, 3.0], [11.0, 11.0], [19.0, 19.0]],
                  Kiln.zeros(3, 2, dtype: :float64).addmm(a, Kiln.ones(4, 2, dtype: :float64), alpha: 0.5)
    assert_tensor [[[2.0]]], Kiln.ones(1, 1, 1).baddbmm(Kiln.ones(1, 1, 2), Kiln.ones(1, 2, 1), beta: 0)
    std, mean = a.std_mean(1)
    assert_tensor [1.2909944487358056] * 3, std, tol: 1e-12
    assert_tensor [1.5, 5.5, 9.5], mean
    var, = Kiln.var_mean(a, 1)
    assert_tensor [5.0 / 3] * 3, var, tol: 1e-12
  end

  def test_einsum
    x = Kiln.arange(6, dtype: :float64).reshape(2, 3)
    y = Kiln.arange(12, dtype: :float64).reshape(3, 4)
    assert_tensor x.matmul(y).to_a, Kiln.einsum("ij,jk->ik", x, y), tol: 0
    assert_tensor [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]], Kiln.einsum("ij->ji", x)
    assert_in_delta 15.0, Kiln.einsum("ij->", x).item
    assert_tensor [3.0, 5.0, 7.0], Kiln.einsum("ij->j", x)
    assert_in_delta 11.0, Kiln.einsum("i,i->", Kiln.tensor([1.0, 2.0]), Kiln.tensor([3.0, 4.0])).item
    assert_tensor [[3.0, 4.0, 5.0], [6.0, 8.0, 10.0]], Kiln.einsum("i,j", Kiln.tensor([1.0, 2.0]), Kiln.tensor([3.0, 4.0, 5.0]))
    z = Kiln.randn(4, 2, dtype: :float64)
    assert_tensor x.matmul(y).matmul(z).to_a, Kiln.einsum("ij,jk,kl->il", [x, y, z]), tol: 1e-12
    assert_tensor [[8.0] * 5] * 3, Kiln.einsum("ijk,ikl->jl", Kiln.ones(2, 3, 4), Kiln.ones(2, 4, 5))
    assert_raises(ArgumentError) { Kiln.einsum("ii->i", Kiln.ones(2, 2)) }
    assert_raises(ArgumentError) { Kiln.einsum("...ij->ij", Kiln.ones(2, 2)) }
    assert_raises(Kiln::ShapeError) { Kiln.einsum("ij,jk", Kiln.ones(2, 3), Kiln.ones(4, 2)) }
    w = Kiln.randn(3, 4, requires_grad: true)
    Kiln.einsum("ij,jk->ik", w, Kiln.ones(4, 2)).sum.backward
    assert_tensor [[2.0] * 4] * 3, w.grad
  end

  # attention written with einsum is recorded as the attention op
  def test_einsum_attention_is_the_attention_op
    q = Kiln.randn(2, 3, 5, 4)
    k = Kiln.randn(2, 3, 6, 4)
    v = Kiln.randn(2, 3, 6, 4)
    before = Kiln.stats[:attention_rewrites]
    p = (Kiln.einsum("bhqd,bhkd->bhqk", q, k) * 0.5).softmax(-1)
    o = Kiln.einsum("bhqk,bhkd->bhqd", p, v)
    assert_equal 1, Kiln.stats[:attention_rewrites] - before
    want = Kiln::NN::Functional.scaled_dot_product_attention(q, k, v, scale: 0.5)
    assert_tensor want.to_a, o, tol: 1e-6
  end

  def test_selection_scans_and_grids
    t = Kiln.arange(6, dtype: :float64).reshape(2, 3)
    assert_tensor [0.0, 2.0, 3.0, 5.0], t.masked_select(Kiln.tensor([true, false, true]))
    assert_tensor [[1, 1], [1, 2]], Kiln.argwhere(t > 3), dtype: :int64
    assert_tensor [1.0, -2.0, -0.0, -0.0], Kiln.tensor([1.0, -2.0, 0.0, 3.0]).cumprod(0)
    assert_tensor [[0.0, 0.0, 0.0], [3.0, 12.0, 60.0]], t.cumprod(1)
    g = Kiln.tensor([2.0, 3.0, 4.0], requires_grad: true)
    g.cumprod(0).sum.backward # d/dg of g0 + g0 g1 + g0 g1 g2
    assert_tensor [1 + 3 + 12, 2 + 8, 6].map(&:to_f), g.grad
    assert_tensor [[-1.0, 1.0, -1.0], [-1.0, 4.0, -1.0]], t.index_fill(1, Kiln.tensor([0, 2]), -1)
    assert_tensor [[0.0, 1.0, 2.0], [9.0, 9.0, 9.0]], t.index_fill(0, 1, 9)
    assert_equal [2, 3], Kiln.broadcast_shapes([2, 1], [3])
    assert_raises(Kiln::ShapeError) { Kiln.broadcast_shapes([2], [3]) }
    gx, gy = Kiln.meshgrid(Kiln.tensor([1, 2]), Kiln.tensor([3, 4, 5]))
    assert_equal [[[1, 1, 1], [2, 2, 2]], [[3, 4, 5], [3, 4, 5]]], [gx.to_a, gy.to_a]
    gx, gy = Kiln.meshgrid([Kiln.tensor([1, 2]), Kiln.tensor([3, 4, 5])], indexing: "xy")
    assert_equal [[[1, 2], [1, 2], [1, 2]], [[3, 3], [4, 4], [5, 5]]], [gx.to_a, gy.to_a]
    assert_tensor [[5.0], [Math.sqrt(13)]], Kiln.cdist(Kiln.tensor([[0.0, 0.0], [1.0, 1.0]]), Kiln.tensor([[3.0, 4.0]]))
  end
end
