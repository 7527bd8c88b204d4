# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "tmpdir"

# Kiln's RNN, GRU, LSTM, MultiheadAttention, TransformerEncoder and -Decoder given
# PyTorch's own weights and inputs (fixtures/torch_nn.json, written by
# PyTorch through fixtures/make_torch_nn.py) compute PyTorch's outputs: the
# state_dict names, gate orders, masks and norms are torch's (issue 42).
class TorchNNTest < Minitest::Test
  include KilnAssertions

  FIXTURE = JSON.parse(File.read(File.join(__dir__, "fixtures", "torch_nn.json")))
  CASES = FIXTURE["cases"]

  def t(v, dtype: :float32) = Kiln.tensor(v, dtype: dtype)

  def load(mod, params)
    mod.load_state_dict(params.transform_values { |v| t(v) })
    mod
  end

  def test_recurrent_modules_compute_pytorchs_outputs
    { "GRU" => Kiln::NN::GRU, "LSTM" => Kiln::NN::LSTM, "RNN" => Kiln::NN::RNN }.each do |name, cls|
      c = CASES.fetch(name)
      kw = c["kw"].transform_keys(&:to_sym)
      m = load(cls.new(3, 4, num_layers: 2, bidirectional: true, batch_first: true, **kw), c["params"])
      if name == "LSTM"
        out, (h, cell) = m.(t(c["x"]), [t(c["h0"]), t(c["c0"])])
        assert_tensor c["c_n"], cell, tol: 2e-6
      else
        out, h = m.(t(c["x"]), t(c["h0"]))
      end
      assert_tensor c["out"], out, tol: 2e-6
      assert_tensor c["h_n"], h, tol: 2e-6
    end
  end

  def test_multihead_attention_computes_pytorchs_outputs_and_weights
    c = CASES.fetch("MultiheadAttention")
    m = load(Kiln::NN::MultiheadAttention.new(8, 2), c["params"])
    x = t(c["x"])
    mask = Kiln::NN::Transformer.generate_square_subsequent_mask(5)
    out, w = m.(x, x, x, key_padding_mask: t(c["key_padding_mask"], dtype: :bool), attn_mask: mask)
    assert_tensor c["out"], out, tol: 2e-6
    assert_tensor c["weights"], w, tol: 2e-6
  end

  # a 2-layer stack (d_model 8, 2 heads, feed-forward 16) of the case's
  # options, holding PyTorch's weights, in eval mode
  def torch_stack(layer_class, stack_class, c)
    kw = c["kw"].transform_keys(&:to_sym)
    kw[:activation] = kw[:activation].to_sym if kw[:activation]
    layer = layer_class.new(8, 2, dim_feedforward: 16, dropout: 0.0, **kw)
    load(stack_class.new(layer, 2), c["params"]).tap(&:eval)
  end

  def test_transformer_encoders_compute_pytorchs_outputs
    %w[post_norm_relu pre_norm_gelu].each do |tag|
      c = CASES.fetch("TransformerEncoder_#{tag}")
      enc = torch_stack(Kiln::NN::TransformerEncoderLayer, Kiln::NN::TransformerEncoder, c)
      out = enc.(t(c["x"]), mask: Kiln::NN::Transformer.generate_square_subsequent_mask(5))
      assert_tensor c["out"], out, tol: 5e-6
    end
  end

  def test_transformer_decoder_computes_pytorchs_output
    %w[post_norm_relu pre_norm_gelu].each do |tag|
      c = CASES.fetch("TransformerDecoder_#{tag}")
      dec = torch_stack(Kiln::NN::TransformerDecoderLayer, Kiln::NN::TransformerDecoder, c)
      out = dec.(t(c["tgt"]), t(c["memory"]), tgt_mask: Kiln::NN::Transformer.generate_square_subsequent_mask(5),
                 memory_key_padding_mask: t(c["memory_key_padding_mask"], dtype: :bool))
      assert_tensor c["out"], out, tol: 5e-6
    end
    assert_raises(TypeError) { Kiln::NN::TransformerDecoder.new(Kiln::NN::Linear.new(2, 2), 2) }
    assert_raises(ArgumentError) { Kiln::NN::TransformerDecoderLayer.new(8, 2, activation: :tanh) }
  end

  # A checkpoint PyTorch saved (safetensors.torch.save_file of a state_dict,
  # fixtures/make_torch_checkpoint.py) loads into the same model written
  # with Kiln::NN, by name, strictly, and computes PyTorch's logits; saved
  # back by Kiln, it holds the same names, shapes and values
  class TinyLM < Kiln::NN::Module
    def initialize
      super()
      @embedding = Kiln::NN::Embedding.new(10, 6)
      @gru = Kiln::NN::GRU.new(6, 8, batch_first: true)
      @encoder = Kiln::NN::TransformerEncoderLayer.new(8, 2, dim_feedforward: 12, dropout: 0.0, batch_first: true)
      @head = Kiln::NN::Linear.new(8, 10)
    end

    def forward(tokens)
      h, = @gru.(@embedding.(tokens))
      @head.(@encoder.(h))
    end
  end

  def test_a_pytorch_checkpoint_loads_into_the_same_kiln_model
    dir = File.join(__dir__, "fixtures")
    want = JSON.parse(File.read(File.join(dir, "tiny_lm.json")))
    state = Kiln.load(File.join(dir, "tiny_lm.safetensors"))
    model = TinyLM.new
    assert_equal model.state_dict.keys.sort, state.keys.sort
    model.load_state_dict(state) # strict: every name and shape
    model.eval
    logits = model.(Kiln.tensor(want["tokens"], dtype: :int64))
    assert_tensor want["logits"], logits, tol: 5e-6
    Dir.mktmpdir do |tmp|
      path = File.join(tmp, "back.safetensors")
      Kiln.save(model.state_dict, path)
      again = Kiln.load(path)
      state.each { |k, v| assert_tensor v.to_a, again.fetch(k), tol: 0 }
    end
  end
end

