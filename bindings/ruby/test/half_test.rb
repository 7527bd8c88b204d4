# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"

# bfloat16, float16 and uint8 from Ruby (issue #41): the names torch-rb
# users write, values rounded once from Ruby's Floats, promotion, autograd
# in the parameter's dtype, and checkpoints of them.
class HalfTest < Minitest::Test
  def test_dtype_names_and_rounding
    a = Kiln.tensor([1, 2.5, 3.14159], dtype: :bfloat16)
    assert_equal :bfloat16, a.dtype
    assert_equal [1.0, 2.5, 3.140625], a.to_a # 3.14159 rounded to 8 significant bits
    h = Kiln.tensor([65504, 65520, 1e-8], dtype: :half)
    assert_equal :float16, h.dtype
    assert_equal [65504.0, Float::INFINITY, 0.0], h.to_a # past the largest: Inf; below half the least: 0
    assert_equal :float16, Kiln.ones(2, dtype: :float16).dtype
    assert_equal :bfloat16, Kiln.zeros(2).bfloat16.dtype
    assert_equal :float16, Kiln.zeros(2).half.dtype
    assert_equal :uint8, Kiln.zeros(2).byte.dtype
    assert Kiln.ones(1, dtype: :bfloat16).floating_point?
    refute Kiln.ones(1, dtype: :uint8).floating_point?
    assert_match(/dtype=bfloat16/, a.inspect)
    assert_match(/dtype=uint8/, Kiln.tensor([1, 2], dtype: :uint8).inspect)
  end

  def test_uint8_wraps_and_refuses_out_of_range_values
    u = Kiln.tensor([1, 2, 255], dtype: :uint8)
    assert_equal [2, 4, 254], (u + u).to_a
    assert_equal :int64, u.sum.dtype
    assert_equal 258, u.sum.item
    assert_equal [255, 254, 1], (-u).to_a
    assert_raises(RangeError) { Kiln.tensor([300], dtype: :uint8) }
    assert_raises(RangeError) { Kiln.tensor([-1], dtype: :uint8) }
    assert_equal [0, 255, 7], Kiln.tensor([-3.5, 1e9, 7.9]).to(:uint8).to_a # floats saturate
  end

  def test_int8_and_int16_as_torch_rb_names_them
    c = Kiln.tensor([127, -128, -3], dtype: :int8)
    assert_equal :int8, c.dtype
    assert_equal [-128, -127, -2], (c + Kiln.ones(3, dtype: :int8)).to_a # wraps
    assert_equal [-127, -128, 3], (-c).to_a
    assert_equal :int64, c.sum.dtype
    assert_equal(-4, c.sum.item)
    assert_equal :int16, Kiln.tensor([1], dtype: :short).dtype
    assert_equal :int8, Kiln.tensor([1], dtype: :char).dtype
    assert_equal :int8, Kiln.zeros(2).char.dtype
    assert_equal :int16, Kiln.zeros(2).short.dtype
    s = Kiln.tensor([32767, -32768], dtype: :int16)
    assert_equal [-32768, 32767], (s + Kiln.tensor([1, -1], dtype: :int16)).to_a
    assert_equal :int16, (c + Kiln.ones(3, dtype: :uint8)).dtype # neither holds the other
    assert_equal :int32, (s + Kiln.ones(2, dtype: :int32)).dtype
    assert_equal [127, -128, 0], Kiln.tensor([1e9, -1e9, Float::NAN]).to(:int8).to_a # saturates
    assert_raises(RangeError) { Kiln.tensor([128], dtype: :int8) }
    assert_raises(RangeError) { Kiln.tensor([-32769], dtype: :int16) }
    assert_equal [[44]], Kiln.tensor([[100, 100]], dtype: :int8).matmul(Kiln.tensor([[2], [1]], dtype: :int8)).to_a
    assert_match(/dtype=int8/, c.inspect)
    refute c.floating_point?
  end

  def test_promotion_as_pytorch
    b = Kiln.ones(2, dtype: :bfloat16)
    f = Kiln.ones(2, dtype: :float16)
    assert_equal :float32, (b + f).dtype
    assert_equal :float32, (b + Kiln.ones(2)).dtype
    assert_equal :bfloat16, (b * 0.1).dtype # a Ruby Float keeps the tensor's dtype
    assert_equal :bfloat16, (b + Kiln.tensor([1, 2])).dtype
    assert_equal :int32, (Kiln.ones(2, dtype: :uint8) + Kiln.ones(2, dtype: :int32)).dtype
  end

  def test_ops_compute_in_float32_and_round_once
    x = Kiln.randn(64, dtype: :float32)
    [:bfloat16, :float16].each do |dt|
      h = x.to(dt)
      [[:exp, []], [:tanh, []], [:sigmoid, []], [:softmax, [0]]].each do |name, args|
        want = h.float.public_send(name, *args).to(dt).to_a
        assert_equal want, h.public_send(name, *args).to_a, "#{dt} #{name}"
      end
      assert_equal h.float.sum.to(dt).item, h.sum.item
    end
  end

  def test_gradients_in_the_parameters_dtype
    w = Kiln.randn(3, 4, dtype: :bfloat16, requires_grad: true)
    loss = (w * w).sum
    loss.backward
    assert_equal :bfloat16, w.grad.dtype
    assert_equal (w.detach * 2).to_a, w.grad.to_a
    # an f32 parameter used in bf16 gets an f32 gradient
    p32 = Kiln.randn(3, dtype: :float32, requires_grad: true)
    (p32.bfloat16 * 3).sum.backward
    assert_equal :float32, p32.grad.dtype
    assert_equal [3.0, 3.0, 3.0], p32.grad.to_a
  end

  def test_checkpoints_of_halves_and_bytes_round_trip
    Dir.mktmpdir do |dir|
      path = File.join(dir, "half.safetensors")
      t = { "b" => Kiln.tensor([1.5, -2.25], dtype: :bfloat16),
            "h" => Kiln.tensor([0.1, 65504], dtype: :float16),
            "u" => Kiln.tensor([0, 255], dtype: :uint8),
            "c" => Kiln.tensor([-128, 127], dtype: :int8),
            "s" => Kiln.tensor([-32768, 32767], dtype: :int16) }
      Kiln.save(t, path)
      back = Kiln.load(path)
      t.each do |name, v|
        assert_equal v.dtype, back[name].dtype
        assert_equal v.to_a, back[name].to_a
      end
      # a bf16 checkpoint loads into float32 parameters in one call
      lin = Kiln::NN::Linear.new(2, 1)
      state = { "weight" => Kiln.tensor([[0.5, -1.25]], dtype: :bfloat16),
                "bias" => Kiln.tensor([2.0], dtype: :bfloat16) }
      Kiln.save(state, path)
      lin.load_state_dict(Kiln.load(path))
      assert_equal :float32, lin.weight.dtype
      assert_equal [[0.5, -1.25]], lin.weight.to_a
    end
  end
end
