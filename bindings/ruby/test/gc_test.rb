# frozen_string_literal: true

require_relative "test_helper"

# Every allocation runs a full GC here: a wrapper that is not yet reachable,
# a C buffer held without an owner, or a tensor released too early shows up
# as a crash or a wrong value.  Small sizes: GC.stress is slow.
class GCStressTest < Minitest::Test
  def stress
    GC.stress = true
    yield
  ensure
    GC.stress = false
  end

  def test_creation
    stress do
      a = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
      b = Kiln.tensor([1, 2, 3], dtype: :int32)
      c = Kiln.zeros(2, 3)
      d = Kiln.full([2], 7)
      e = Kiln.arange(5)
      Kiln.manual_seed(1)
      f = Kiln.randn(3)
      g = Kiln.tensor([[true, false]])
      assert_equal [[1.0, 2.0], [3.0, 4.0]], a.to_a
      assert_equal [1, 2, 3], b.to_a
      assert_equal [[0.0] * 3] * 2, c.to_a
      assert_equal [7, 7], d.to_a
      assert_equal [0, 1, 2, 3, 4], e.to_a
      assert_equal 3, f.to_a.size
      assert_equal [[true, false]], g.to_a
    end
  end

  def test_ops
    stress do
      x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad: true)
      y = ((x * 2 + 1).tanh * x.matmul(x)).sum(dim: 1) - 1
      z = (2 * x - 1).softmax(dim: 1)[0, 1..]
      l = Kiln.cross_entropy(x, [0, 1]) + y.mean + z.sum
      l.backward
      g = x.grad
      Kiln.no_grad { x.sub_scaled!(g, 0.1) }
      c = Kiln.cat([x.detach, x.detach.reshape(2, 2)], dim: 0).transpose(0, 1)
      assert_equal [2, 4], c.shape
      assert_equal [2, 2], g.shape
      assert_kind_of Float, l.item
      assert_equal :int64, (1 - Kiln.tensor([1, 2])).dtype
      assert_equal :float32, (1.0 - Kiln.tensor([1, 2])).dtype
    end
  end

  def test_conversion_and_errors
    stress do
      t = Kiln.tensor(Array.new(3) { |i| Array.new(4) { |j| i * 4 + j + 0.5 } })
      assert_equal 12, t.to_a.flatten.size
      assert_equal 6.5, t[1, 2].item
      assert_match(/\Atensor\(\[\[/, t.inspect)
      assert_raises(Kiln::ShapeError) { Kiln.tensor([[1, 2], [3]]) }
      assert_raises(RangeError) { Kiln.tensor([1, 2**80]) }
      assert_raises(Kiln::ShapeError) { t + Kiln.ones(5) }
      assert_raises(Kiln::ShapeError) { t.item }
      assert_raises(TypeError) { t * "x" }
      assert_equal [3, 4], t.shape
    end
  end

  def test_many_short_lived_tensors_are_released
    GC.start
    base = Kiln.stats[:ops_recorded]
    2000.times { |i| (Kiln.tensor([i.to_f]) * 2 + 1).sum }
    GC.start
    assert_operator Kiln.stats[:ops_recorded] - base, :>=, 6000
    # nothing to assert about memory directly: ASan-free, this at least runs the dfree path
  end
end
