# frozen_string_literal: true

# finetune.rb — a BERT encoder whose weights come from a checkpoint written
# by Hugging Face transformers (save_pretrained's model.safetensors), built
# from Kiln::NN modules under transformers' parameter names, checked
# against transformers' own output, then fine-tuned with a classification
# head on a small task — the way a Ruby user brings a pretrained model in.
#
#   ruby -Ibindings/ruby/lib examples/ruby/finetune.rb [options]
#   (from the repo after `cd bindings/ruby && rake compile`, or with the gem)
#
#   --checkpoint DIR  a save_pretrained directory (config.json, model.safetensors)
#                     and its expect.safetensors (input_ids, attention_mask,
#                     last_hidden_state); by default one is made here: a small
#                     random-initialized BertModel saved by transformers, with the
#                     Python in KILN_PYTHON, build/peers-venv or python3.  Where none
#                     has transformers, the checkpoint transformers wrote for the
#                     tests (tests/fixtures/bert_tiny*.safetensors) is used.
#   --fixture         use the tests' checkpoint even where transformers is installed
#   --steps N         fine-tuning steps (150), --batch N (32), --lr X (2e-3), --seed N (1)
#
# The task: is the token after the first (the [CLS] position) a low one
# (id < vocab/2)?  A linear head on the pooled [CLS] state (as
# BertForSequenceClassification's) learns it through attention; every
# weight of the encoder is fine-tuned with it.
require "kiln"
require "json"
require "optparse"
require "tmpdir"

ROOT = File.expand_path("../..", __dir__)
opts = { checkpoint: nil, fixture: false, steps: 150, batch: 32, lr: 2e-3, seed: 1 }
OptionParser.new do |o|
  o.banner = "usage: finetune.rb [options]"
  o.on("--checkpoint DIR", String) { |v| opts[:checkpoint] = v }
  o.on("--fixture") { opts[:fixture] = true }
  %i[steps batch seed].each { |k| o.on("--#{k} N", Integer) { |v| opts[k] = v } }
  o.on("--lr X", Float) { |v| opts[:lr] = v }
end.parse!

# --- the checkpoint: written by transformers --------------------------------

MAKE_CHECKPOINT = <<~PY
  import sys, torch
  from safetensors.torch import save_file
  from transformers import BertConfig, BertModel
  torch.manual_seed(7)
  config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=64, hidden_act="gelu",
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = BertModel(config).eval()
  model.save_pretrained(sys.argv[1], safe_serialization=True)
  ids = torch.randint(0, 120, (4, 16))
  mask = torch.ones(4, 16)
  mask[1, 11:] = 0
  mask[3, 6:] = 0
  with torch.no_grad():
      out = model(input_ids=ids, attention_mask=mask).last_hidden_state
  save_file({"input_ids": ids, "attention_mask": mask, "last_hidden_state": out.contiguous()},
            sys.argv[1] + "/expect.safetensors")
PY

def python_with_transformers
  candidates = [ENV["KILN_PYTHON"], File.join(ROOT, "build", "peers-venv", "bin", "python"), "python3"]
  candidates.compact.find do |py|
    system(py, "-c", "import transformers, safetensors", out: File::NULL, err: File::NULL)
  rescue SystemCallError
    false
  end
end

# [model.safetensors, expect.safetensors, config, where it came from]
def checkpoint(dir, tmp, fixture)
  if dir
    return [File.join(dir, "model.safetensors"), File.join(dir, "expect.safetensors"),
            JSON.parse(File.read(File.join(dir, "config.json"))), dir]
  end
  py = !fixture && python_with_transformers
  if py && system(py, "-c", MAKE_CHECKPOINT, tmp, err: File::NULL)
    return [File.join(tmp, "model.safetensors"), File.join(tmp, "expect.safetensors"),
            JSON.parse(File.read(File.join(tmp, "config.json"))), "made now by transformers (#{py})"]
  end
  fixtures = File.join(ROOT, "tests", "fixtures")
  config = { "vocab_size" => 99, "hidden_size" => 32, "num_hidden_layers" => 2, "num_attention_heads" => 4,
             "intermediate_size" => 64, "max_position_embeddings" => 40, "type_vocab_size" => 2,
             "layer_norm_eps" => 1e-12 } # tests/fixtures/make_bert.py's BertConfig
  [File.join(fixtures, "bert_tiny.safetensors"), File.join(fixtures, "bert_tiny_expect.safetensors"), config,
   "tests/fixtures/bert_tiny.safetensors (written by transformers for the tests)"]
end

# --- BERT from Kiln::NN, under transformers' names ---------------------------

# a module holding named children (the dotted names of the checkpoint)
class Part < Kiln::NN::Module
  def initialize(**children)
    super()
    children.each { |name, child| instance_variable_set("@#{name}", child) }
  end

  def [](name) = instance_variable_get("@#{name}")
end

class Bert < Kiln::NN::Module
  def initialize(c)
    super()
    h = c["hidden_size"]
    eps = c.fetch("layer_norm_eps", 1e-12)
    ln = -> { Kiln::NN::LayerNorm.new(h, eps: eps) }
    @heads = c["num_attention_heads"]
    @embeddings = Part.new(word_embeddings: Kiln::NN::Embedding.new(c["vocab_size"], h),
                           position_embeddings: Kiln::NN::Embedding.new(c["max_position_embeddings"], h),
                           token_type_embeddings: Kiln::NN::Embedding.new(c.fetch("type_vocab_size", 2), h),
                           LayerNorm: ln.())
    layers = Array.new(c["num_hidden_layers"]) do
      Part.new(attention: Part.new(self: Part.new(query: Kiln::NN::Linear.new(h, h), key: Kiln::NN::Linear.new(h, h),
                                                  value: Kiln::NN::Linear.new(h, h)),
                                   output: Part.new(dense: Kiln::NN::Linear.new(h, h), LayerNorm: ln.())),
               intermediate: Part.new(dense: Kiln::NN::Linear.new(h, c["intermediate_size"])),
               output: Part.new(dense: Kiln::NN::Linear.new(c["intermediate_size"], h), LayerNorm: ln.()))
    end
    @encoder = Part.new(layer: Kiln::NN::ModuleList.new(layers))
    @pooler = Part.new(dense: Kiln::NN::Linear.new(h, h))
  end

  # BertModel's pooled output: tanh(dense(the [CLS] position's state)), what
  # BertForSequenceClassification puts its classifier on
  def pooled(states) = @pooler[:dense].(states[0.., 0, 0..]).tanh

  # ids [B, T] int64, mask [B, T] (1: a token, 0: padding) -> [B, T, H]
  def forward(ids, mask)
    b, t = ids.shape
    e = @embeddings
    x = e[:word_embeddings].(ids) + e[:position_embeddings].(Kiln.arange(t)) +
        e[:token_type_embeddings].(Kiln.zeros(b, t, dtype: :int64))
    x = e[:LayerNorm].(x)
    keep = mask.gt(0.5).reshape(b, 1, 1, t) # attend to the tokens, not the padding
    @encoder[:layer].each { |layer| x = encoder_layer(layer, x, keep) }
    x
  end

  private

  def encoder_layer(layer, x, keep)
    b, t, h = x.shape
    split = ->(y) { y.reshape(b, t, @heads, h / @heads).transpose(1, 2) }
    sa = layer[:attention][:self]
    ctx = Kiln::NN::Functional.scaled_dot_product_attention(split.(sa[:query].(x)), split.(sa[:key].(x)),
                                                            split.(sa[:value].(x)), attn_mask: keep)
    ctx = ctx.transpose(1, 2).reshape(b, t, h)
    ao = layer[:attention][:output]
    x = ao[:LayerNorm].(ao[:dense].(ctx) + x)
    inner = layer[:intermediate][:dense].(x).gelu
    layer[:output][:LayerNorm].(layer[:output][:dense].(inner) + x)
  end
end

Kiln.manual_seed(opts[:seed])
Dir.mktmpdir do |tmp|
  weights, expect_path, config, source = checkpoint(opts[:checkpoint], tmp, opts[:fixture])
  puts "checkpoint: #{source}"
  model = Bert.new(config)
  model.load_state_dict(Kiln.load(weights)) # strict: every name and shape must match
  model.eval
  expect = Kiln.load(expect_path)
  out = Kiln.no_grad { model.(expect["input_ids"], expect["attention_mask"]) }
  diff = (out - expect["last_hidden_state"]).abs.max.item
  puts format("BERT %d layers, hidden %d: last_hidden_state within %.2g of transformers' (max |difference|)",
              config["num_hidden_layers"], config["hidden_size"], diff)
  abort "finetune.rb: Kiln's output differs from transformers' by #{diff} (> 1e-4)" if diff > 1e-4

  # --- fine-tuning: a head on [CLS], every weight trained -------------------
  vocab = config["vocab_size"]
  seq = [16, config["max_position_embeddings"]].min
  head = Kiln::NN::Linear.new(config["hidden_size"], 2)
  params = model.parameters + head.parameters
  opt = Kiln::Optim::Adam.new(params, lr: opts[:lr])
  batch = lambda do |n|
    ids = Kiln.randint(0, vocab, [n, seq])
    [ids, Kiln.ones(n, seq), ids[0.., 1].lt(vocab / 2).long] # label 1: the token after [CLS] is low
  end
  accuracy = lambda do
    ids, mask, labels = batch.(512)
    logits = Kiln.no_grad { head.(model.pooled(model.(ids, mask))) }
    logits.argmax(1).eq(labels).float.mean.item
  end
  model.train
  before = accuracy.()
  opts[:steps].times do |step|
    ids, mask, labels = batch.(opts[:batch])
    loss = Kiln.cross_entropy(head.(model.pooled(model.(ids, mask))), labels)
    opt.zero_grad
    loss.backward
    opt.step
    puts format("step %3d  loss %.4f", step + 1, loss.item) if ((step + 1) % 25).zero? || step.zero?
  end
  puts format("held-out accuracy: %.1f%% before fine-tuning, %.1f%% after", 100 * before, 100 * accuracy.())
end
