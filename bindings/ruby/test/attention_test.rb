# frozen_string_literal: true

require_relative "test_helper"

# F.scaled_dot_product_attention against its definition in plain Ruby (bool,
# float and causal masks), and MultiheadAttention's forms and errors; the
# modules against PyTorch's own outputs are in torch_nn_test.rb.
class AttentionTest < Minitest::Test
  include KilnAssertions

  # softmax(q k^T * scale + mask) v for one [L, D] x [S, D] x [S, Dv] item;
  # masked[l][s] true: excluded
  def sdpa_ref(q, k, v, scale, masked: nil, add: nil)
    q.each_with_index.map do |qi, l|
      scores = k.each_with_index.map do |kj, s|
        next -Float::INFINITY if masked && masked[l][s]

        qi.zip(kj).sum { |a, b| a * b } * scale + (add ? add[l][s] : 0.0)
      end
      m = scores.max
      e = scores.map { |x| Math.exp(x - m) }
      z = e.sum
      (0...v[0].size).map { |d| e.each_with_index.sum { |w, s| w / z * v[s][d] } }
    end
  end

  def test_sdpa_matches_its_definition
    Kiln.manual_seed(2)
    q = Kiln.randn(4, 3, dtype: :float64)
    k = Kiln.randn(5, 3, dtype: :float64)
    v = Kiln.randn(5, 2, dtype: :float64)
    s = 1 / Math.sqrt(3)
    f = Kiln::NN::F
    assert_tensor sdpa_ref(q.to_a, k.to_a, v.to_a, s), f.scaled_dot_product_attention(q, k, v), tol: 1e-12
    causal = Array.new(4) { |l| Array.new(5) { |j| j > l } }
    assert_tensor sdpa_ref(q.to_a, k.to_a, v.to_a, s, masked: causal),
                  f.scaled_dot_product_attention(q, k, v, is_causal: true), tol: 1e-12
    keep = [[true, false, true, true, false]] * 4 # bool: true may attend
    assert_tensor sdpa_ref(q.to_a, k.to_a, v.to_a, 0.5, masked: keep.map { |r| r.map(&:!) }),
                  f.scaled_dot_product_attention(q, k, v, attn_mask: Kiln.tensor(keep, dtype: :bool), scale: 0.5),
                  tol: 1e-12
    add = Array.new(4) { |l| Array.new(5) { |j| 0.1 * (l - j) } }
    assert_tensor sdpa_ref(q.to_a, k.to_a, v.to_a, s, add: add),
                  f.scaled_dot_product_attention(q, k, v, attn_mask: Kiln.tensor(add, dtype: :float64)), tol: 1e-12
    assert_raises(ArgumentError) do
      f.scaled_dot_product_attention(q, k, v, attn_mask: Kiln.tensor(add, dtype: :float64), is_causal: true)
    end
  end

  # the fused op (no weights asked for) and the composite that returns the
  # weights agree, values and gradients, with a key padding mask and causal
  def test_fused_attention_matches_the_weights_path
    Kiln.manual_seed(11)
    m = Kiln::NN::MultiheadAttention.new(8, 2)
    x = Kiln.randn(5, 3, 8, dtype: :float64)
    m.load_state_dict(m.state_dict.transform_values { |t| t._cast(:float64) })
    pad = Kiln.tensor([[false] * 5, [false, false, false, true, true], [false] * 4 + [true]], dtype: :bool)
    grads = [true, false].map do |weights|
      x.requires_grad = true
      out, = m.(x, x, x, key_padding_mask: pad, need_weights: weights, is_causal: true)
      loss = (out * out).sum
      loss.backward
      g = [out.to_a, x.grad.to_a, m.in_proj_weight.grad.to_a]
      x.grad = nil
      m.zero_grad
      x = x.detach
      g
    end
    grads[0].zip(grads[1]).each { |a, b| assert_tensor a, Kiln.tensor(b, dtype: :float64), tol: 1e-12 }
  end

  # a query whose every key is masked out gets 0 (PyTorch 2.5+), no NaN
  def test_sdpa_fully_masked_query_is_zero
    q = Kiln.ones(2, 3)
    k = Kiln.ones(4, 3)
    v = Kiln.arange(8).reshape(4, 2)._cast(:float32)
    keep = Kiln.tensor([[true, true, false, false], [false] * 4], dtype: :bool)
    out = Kiln::NN::F.scaled_dot_product_attention(q, k, v, attn_mask: keep)
    assert_tensor [[1.0, 2.0], [0.0, 0.0]], out, tol: 1e-6
  end

  def test_multihead_attention_forms_and_errors
    Kiln.manual_seed(8)
    m = Kiln::NN::MultiheadAttention.new(6, 3)
    assert_equal %w[in_proj_weight in_proj_bias out_proj.weight out_proj.bias], m.state_dict.keys
    assert_tensor [0.0] * 18, m.in_proj_bias
    x = Kiln.randn(4, 2, 6)
    out, w = m.(x, x, x)
    assert_equal [4, 2, 6], out.shape
    assert_equal [2, 4, 4], w.shape
    assert_tensor [[1.0] * 4] * 2, w.sum(-1), tol: 1e-6 # each query's weights add up to 1
    _, per_head = m.(x, x, x, average_attn_weights: false)
    assert_equal [2, 3, 4, 4], per_head.shape
    assert_nil m.(x, x, x, need_weights: false)[1]
    bf = Kiln::NN::MultiheadAttention.new(6, 3, batch_first: true)
    bf.load_state_dict(m.state_dict)
    out_bf, = bf.(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
    assert_tensor out.transpose(0, 1).to_a, out_bf, tol: 1e-6
    one, = m.(x[0..-1, 0], x[0..-1, 0], x[0..-1, 0]) # unbatched [L, E]
    assert_tensor out.to_a.map { |r| r[0] }, one, tol: 1e-6
    # causal: the first query sees only the first key
    _, wc = m.(x, x, x, is_causal: true)
    assert_tensor [1.0, 0.0, 0.0, 0.0], wc[0][0], tol: 1e-7
    assert_raises(ArgumentError) { Kiln::NN::MultiheadAttention.new(7, 3) }
    assert_raises(ArgumentError) { Kiln::NN::MultiheadAttention.new(6, 3, kdim: 4) }
    assert_raises(Kiln::ShapeError) { m.(x, Kiln.randn(4, 2, 5), Kiln.randn(4, 2, 5)) }
    err = assert_raises(Kiln::ShapeError) { m.(x, x, x, key_padding_mask: Kiln.zeros(2, 3, dtype: :bool)) }
    assert_match(/key_padding_mask must be \[2, 4\]/, err.message)
  end

  def test_an_encoder_trains
    Kiln.manual_seed(5)
    layer = Kiln::NN::TransformerEncoderLayer.new(8, 2, dim_feedforward: 16, dropout: 0.1, batch_first: true)
    enc = Kiln::NN::TransformerEncoder.new(layer, 2)
    head = Kiln::NN::Linear.new(8, 1)
    params = enc.parameters + head.parameters
    opt = Kiln::Optim::Adam.new(params, lr: 1e-2)
    x = Kiln.randn(16, 6, 8)
    y = x.sum(-1).mean(-1, keepdim: true) # a function of the whole sequence
    losses = 60.times.map do
      opt.zero_grad
      loss = (head.(enc.(x)).mean(1) - y).pow(2).mean
      loss.backward
      Kiln::NN::Utils.clip_grad_norm!(params, 1.0)
      opt.step
      loss.item
    end
    assert_operator losses.last, :<, losses.first * 0.5, losses.values_at(0, 20, 40, 59).inspect
  end
end
