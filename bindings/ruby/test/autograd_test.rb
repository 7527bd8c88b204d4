# frozen_string_literal: true

require_relative "test_helper"

class AutogradTest < Minitest::Test
  def test_backward_and_grad
    x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad: true)
    assert x.requires_grad
    assert x.requires_grad?
    assert_nil x.grad
    y = (x * 2 + 1).tanh.sum
    assert y.requires_grad
    y.backward
    g = x.grad
    assert_kind_of Kiln::Tensor, g
    expect = x.to_a.map { |r| r.map { |v| 2 * (1 - Math.tanh(2 * v + 1)**2) } }
    assert_tensor expect, g, tol: 1e-4
  end

  def test_gradients_accumulate_until_zero_grad
    w = Kiln.tensor([1.0, 2.0], requires_grad: true)
    (w * w).sum.backward
    (w * 3).sum.backward
    assert_tensor [5.0, 7.0], w.grad # 2w + 3
    w.zero_grad!
    assert_nil w.grad
    (w * 3).sum.backward
    assert_tensor [3.0, 3.0], w.grad
    w.grad = nil
    assert_nil w.grad
    w.grad = Kiln.zeros(2) # as torch: a tensor of the same shape and dtype
    assert_tensor [0.0, 0.0], w.grad
  end

  def test_backward_with_gradient_argument
    x = Kiln.tensor([1.0, 2.0, 3.0], requires_grad: true)
    (x * x).backward(Kiln.tensor([1.0, 0.0, 2.0]))
    assert_tensor [2.0, 0.0, 12.0], x.grad
    x.zero_grad!
    (x * 2).backward([1.0, 1.0, 1.0])
    assert_tensor [2.0, 2.0, 2.0], x.grad
    assert_kiln_error(Kiln::ShapeError, /kiln_backward: .*pass its gradient/) { (x * 2).backward }
  end

  def test_requires_grad_setters
    x = Kiln.ones(2)
    refute x.requires_grad
    x.requires_grad = true
    assert x.requires_grad
    assert_same x, x.requires_grad!(false)
    refute x.requires_grad
    e = assert_kiln_error(Kiln::DTypeError, /only float tensors can require gradients, not int64/) do
      Kiln.tensor([1], requires_grad: true)
    end
    assert_equal :dtype, e.status
    y = Kiln.ones(2, requires_grad: true) * 2
    e = assert_kiln_error(Kiln::Error, /only leaf tensors/) { y.requires_grad = true }
    assert_equal :state, e.status
  end

  def test_detach_and_no_grad
    x = Kiln.tensor([1.0, 2.0], requires_grad: true)
    d = (x * 2).detach
    refute d.requires_grad
    assert_tensor [2.0, 4.0], d
    r = Kiln.no_grad { x * 2 }
    refute r.requires_grad
    inner = Kiln.no_grad { Kiln.no_grad { x + 1 } }
    refute inner.requires_grad
    assert (x * 2).requires_grad # the scope ended
    assert_raises(RuntimeError) { Kiln.no_grad { raise "boom" } }
    assert (x * 2).requires_grad # popped in ensure
    assert_equal 42, Kiln.no_grad { 42 }
  end

  # torch.enable_grad inside no_grad, nested both ways, restored on raise
  def test_enable_grad_inside_no_grad
    x = Kiln.tensor([1.0, 2.0], requires_grad: true)
    assert Kiln.grad_enabled?
    y = nil
    Kiln.no_grad do
      Kiln.no_grad do
        refute Kiln.grad_enabled?
        y = Kiln.enable_grad do
          assert Kiln.grad_enabled?
          refute Kiln.no_grad { x * 3 }.requires_grad
          assert Kiln.grad_enabled?
          (x * x).sum
        end
        assert y.requires_grad
        refute Kiln.grad_enabled?
        assert_raises(RuntimeError) { Kiln.enable_grad { raise "boom" } }
        refute((x * 2).requires_grad) # both no_grad levels back
      end
      refute Kiln.grad_enabled?
    end
    assert Kiln.grad_enabled?
    y.backward
    assert_tensor [2.0, 4.0], x.grad
  end

  def test_functional_grad
    a = Kiln.tensor([1.0, 2.0], requires_grad: true)
    b = Kiln.tensor([3.0, 4.0], requires_grad: true)
    c = Kiln.tensor([5.0], requires_grad: true)
    ga, gb, gc = Kiln.grad((a * b).sum, [a, b, c])
    assert_tensor [3.0, 4.0], ga
    assert_tensor [1.0, 2.0], gb
    assert(gc.nil? || gc.to_a == [0.0], "an input the output does not use: #{gc.inspect}")
    assert_nil a.grad # functional: nothing accumulated
    (g2,) = Kiln.grad(a * a, a, grad_outputs: Kiln.tensor([1.0, 1.0]), create_graph: true)
    assert_tensor [2.0, 4.0], g2
    assert g2.requires_grad
    (h,) = Kiln.grad(g2.sum, [a])
    assert_tensor [2.0, 2.0], h
  end

  def test_sub_scaled_and_assign
    w = Kiln.tensor([1.0, 2.0], requires_grad: true)
    (w * w).sum.backward
    Kiln.no_grad { assert_same w, w.sub_scaled!(w.grad, 0.5) }
    assert_tensor [0.0, 0.0], w # w -= 0.5 * 2w
    assert w.requires_grad
    old = w.detach
    w.assign!(Kiln.tensor([5.0, 6.0]))
    assert_tensor [5.0, 6.0], w
    assert_tensor [0.0, 0.0], old
    assert_kiln_error(Kiln::ShapeError, /kiln_assign/) { w.assign!(Kiln.zeros(3)) }
    assert_kiln_error(Kiln::ShapeError, /kiln_sub_scaled_/) { w.sub_scaled!(Kiln.zeros(3), 1.0) }
  end

  def test_gradient_through_many_ops
    x = Kiln.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad: true)
    w = Kiln.tensor([[1.0, 0.5], [-0.5, 2.0]], requires_grad: true)
    loss = Kiln.cross_entropy(x.matmul(w).relu + x.sigmoid, Kiln.tensor([1, 0])) +
           (x.exp.mean - x.layer_norm.sum * 0.1) + x.softmax(dim: 1).max
    loss.backward
    # finite differences on x
    base = x.to_a
    f = lambda do |arr|
      xx = Kiln.tensor(arr)
      ww = w.detach
      (Kiln.cross_entropy(xx.matmul(ww).relu + xx.sigmoid, Kiln.tensor([1, 0])) +
        (xx.exp.mean - xx.layer_norm.sum * 0.1) + xx.softmax(dim: 1).max).item
    end
    g = x.grad.to_a
    h = 1e-2
    2.times do |i|
      2.times do |j|
        up = base.map(&:dup)
        dn = base.map(&:dup)
        up[i][j] += h
        dn[i][j] -= h
        assert_in_delta (f.(up) - f.(dn)) / (2 * h), g[i][j], 2e-2
      end
    end
  end
end
