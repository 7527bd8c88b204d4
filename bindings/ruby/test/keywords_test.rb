# frozen_string_literal: true

require_relative "test_helper"

# Issue 42: every method that takes PyTorch's named arguments (dim, keepdim,
# dtype, ...) takes each positionally and as a keyword (as torch-rb does),
# through one parser (Kiln::Signature); a wrong argument's error names the
# method called and what it expected.
class KeywordsTest < Minitest::Test
  def setup
    @x = Kiln.tensor([[1.0, 5.0, 3.0, 2.0], [4.0, 2.0, 6.0, 0.5]])
  end

  # [method, positional args, the same as keywords]
  SAME = [
    [:size, [1], { dim: 1 }],
    [:sum, [1, true], { dim: 1, keepdim: true }],
    [:sum, [[0, 1]], { dim: [0, 1] }],
    [:mean, [0], { dim: 0 }],
    [:prod, [1, true], { axis: 1, keepdims: true }],
    [:amax, [1], { dim: 1 }],
    [:amin, [0, true], { dim: 0, keepdim: true }],
    [:argmax, [1, true], { dim: 1, keepdim: true }],
    [:argmin, [0], { dim: 0 }],
    [:max, [1, true], { dim: 1, keepdim: true }],
    [:min, [0], { dim: 0 }],
    [:all, [1], { dim: 1 }],
    [:any, [0, true], { dim: 0, keepdim: true }],
    [:softmax, [0], { dim: 0 }],
    [:log_softmax, [1], { dim: 1 }],
    [:logsumexp, [1, true], { dim: 1, keepdim: true }],
    [:sort, [1, true], { dim: 1, descending: true }],
    [:argsort, [0, true], { dim: 0, descending: true }],
    [:topk, [2, 1, false], { k: 2, dim: 1, largest: false }],
    [:var, [1, false, true], { dim: 1, unbiased: false, keepdim: true }],
    [:std, [0], { dim: 0 }],
    [:cumsum, [1], { dim: 1 }],
    [:chunk, [2, 1], { chunks: 2, dim: 1 }],
    [:split, [[1, 3], 1], { split_size_or_sections: [1, 3], dim: 1 }],
    [:split, [1, 0], { split_size: 1, dim: 0 }],
    [:transpose, [0, 1], { dim0: 0, dim1: 1 }],
    [:unsqueeze, [1], { dim: 1 }],
    [:squeeze, [0], { dim: 0 }],
    [:flatten, [0, 1], { start_dim: 0, end_dim: 1 }],
    [:index_select, [1, [0, 2]], { dim: 1, index: [0, 2] }],
    [:gather, [1, [[0, 1], [3, 2]]], { dim: 1, index: [[0, 1], [3, 2]] }],
    [:reshape, [4, 2], { shape: [4, 2] }],
    [:permute, [1, 0], { dims: [1, 0] }],
    [:expand, [[2, 2, 4]], { size: [2, 2, 4] }],
    [:repeat, [1, 2], { sizes: [1, 2] }],
    [:norm, [1, 1, true], { p: 1, dim: 1, keepdim: true }],
    [:clamp, [1.5, 4.5], { min: 1.5, max: 4.5 }]
  ].freeze

  def values(r)
    r.is_a?(Array) ? r.map { |t| values(t) } : r.is_a?(Kiln::Tensor) ? [r.shape, r.dtype, r.to_a] : r
  end

  def test_every_named_argument_works_positionally_and_as_a_keyword
    x = @x
    SAME.each do |name, args, kw|
      target = name == :squeeze ? x.unsqueeze(0) : x
      pos = target.public_send(name, *args)
      key = target.public_send(name, **kw)
      assert_equal values(pos), values(key), "#{name}(#{args.inspect}) vs #{name}(#{kw})"
      # half and half: the first positionally, the rest as keywords
      next if args.size < 2 || %i[reshape permute expand repeat].include?(name)

      mixed = target.public_send(name, args[0], **kw.drop(1).to_h)
      assert_equal values(pos), values(mixed), "#{name} mixed"
    end
  end

  def test_the_issue_s_gru_call
    h = Kiln.randn(16, 384)
    r, z, n = h.chunk(3, dim: 1)
    assert_equal [[16, 128]] * 3, [r.shape, z.shape, n.shape]
    assert_equal values(h.chunk(3, 1)), values(h.chunk(3, dim: 1))
  end

  def test_values_of_keyword_forms
    assert_tensor [[11.0], [12.5]], @x.sum(dim: 1, keepdim: true)
    assert_tensor [11.0, 12.5], @x.sum(1, dtype: :float64), dtype: :float64
    values, idx = @x.max(dim: 1)
    assert_tensor [5.0, 6.0], values
    assert_tensor [1, 2], idx, dtype: :int64
    assert_tensor [[1.0, 5.0], [4.0, 2.0]], @x.index_select(dim: 1, index: Kiln.tensor([0, 1]))
    assert_tensor [[1, 6, 9, 11], [4, 6, 12, 12]], Kiln.tensor([[1, 5, 3, 2], [4, 2, 6, 0]]).cumsum(dim: 1)
    assert_tensor [[1.0, 6.0, 9.0, 11.0], [4.0, 6.0, 12.0, 12.5]], @x.cumsum(1, dtype: :float64), dtype: :float64
    s = Kiln.zeros(2, 3).scatter_add(dim: 1, index: Kiln.tensor([[0, 0], [2, 1]]), src: Kiln.ones(2, 2))
    assert_tensor [[2.0, 0.0, 0.0], [0.0, 1.0, 1.0]], s
    assert_equal [2, 3], Kiln.cat([Kiln.ones(1, 3), Kiln.ones(1, 3)], dim: 0).shape
    assert_equal [2, 1, 3], Kiln.stack([Kiln.ones(3), Kiln.ones(3)], 0).unsqueeze(dim: 1).shape
  end

  def test_module_functions_and_nn_take_the_same_forms
    x = @x
    assert_equal values(x.sum(1)), values(Kiln.sum(x, 1))
    assert_equal values(x.sum(1)), values(Kiln.sum(x, dim: 1))
    assert_equal values(x.softmax(0)), values(Kiln.softmax(x, dim: 0))
    assert_equal values(x.softmax(0)), values(Kiln::NN::F.softmax(x, 0))
    assert_equal values(x.log_softmax(1)), values(Kiln::NN::F.log_softmax(x, dim: 1))
    assert_equal values(x.softmax(0)), values(Kiln::NN::Softmax.new(0).call(x))
    assert_equal values(x.softmax(0)), values(Kiln::NN::Softmax.new(dim: 0).call(x))
    assert_equal [8], Kiln::NN::Flatten.new(0).call(x).shape
    assert_equal [8], Kiln::NN::Flatten.new(start_dim: 0).call(x).shape
    assert_equal values(x.flatten(0)), values(Kiln.flatten(x, start_dim: 0))
    w = Kiln.randn(3, 4)
    assert_equal values(Kiln::NN::F.linear(x, w)), values(Kiln::NN::F.linear(x, weight: w, bias: nil))
    y = Kiln::NN::F.dropout(x, 0.5, false)
    assert_equal values(x), values(y)
    assert_equal values(x), values(Kiln::NN::F.dropout(x, p: 0.5, training: false))
    img = Kiln.randn(1, 1, 4, 4)
    assert_equal values(Kiln::NN::F.max_pool2d(img, 2, 2)), values(Kiln::NN::F.max_pool2d(img, kernel_size: 2, stride: 2))
  end

  def test_errors_name_the_method_and_what_it_expects
    e = assert_raises(TypeError) { @x.chunk(3, dim: "1") }
    assert_match(/Kiln::Tensor#chunk: dim must be an Integer, not "1"/, e.message)
    assert_match(/chunk\(chunks, dim=0\)/, e.message)
    e = assert_raises(ArgumentError) { @x.chunk(3, 1, dim: 1) }
    assert_match(/chunk.*dim given twice \(positionally and as dim:\)/, e.message)
    e = assert_raises(ArgumentError) { @x.chunk(3, dims: 1) }
    assert_match(/chunk.*unknown keyword dims: \(it takes chunks:, dim:\)/, e.message)
    e = assert_raises(ArgumentError) { @x.chunk }
    assert_match(/chunk.*missing chunks/, e.message)
    e = assert_raises(ArgumentError) { @x.transpose(0, 1, 2) }
    assert_match(/transpose\(dim0, dim1\): too many positional arguments \(3; it takes 2\)/, e.message)
    e = assert_raises(ArgumentError) { @x.sum(dim: 0, axis: 1) }
    assert_match(/sum.*dim given twice \(as dim: and as axis:\)/, e.message)
    e = assert_raises(TypeError) { @x.sum(1, keepdim: 1) }
    assert_match(/Kiln::Tensor#sum: keepdim must be true or false, not 1/, e.message)
    e = assert_raises(TypeError) { Kiln.sum(@x, dim: "a") }
    assert_match(/\AKiln\.sum: dim must be/, e.message)
    assert_match(/Kiln\.sum\(input, dim/, e.message)
    e = assert_raises(TypeError) { Kiln.softmax(@x, dim: "a") }
    assert_match(/\AKiln\.softmax: dim must be/, e.message)
    assert_match(/Kiln\.softmax\(input, dim/, e.message)
    e = assert_raises(TypeError) { @x.max(dim: 1.5) }
    assert_match(/Kiln::Tensor#max: dim must be/, e.message)
    e = assert_raises(TypeError) { Kiln::NN::F.softmax(@x, dim: :a) }
    assert_match(/Kiln::NN::Functional\.softmax: dim must be an Integer/, e.message)
    e = assert_raises(TypeError) { Kiln::NN::Softmax.new(dim: "x") }
    assert_match(/Kiln::NN::Softmax\.new: dim must be an Integer/, e.message)
    e = assert_raises(ArgumentError) { Kiln.zeros(2, 3, dtyp: :float64) }
    assert_match(/Kiln\.zeros.*unknown keyword dtyp:/, e.message)
    e = assert_raises(TypeError) { @x.reshape(2, "a") }
    assert_match(/Kiln::Tensor#reshape: shape must be an Integer or an Array of Integers, not \[2, "a"\]/, e.message)
    e = assert_raises(TypeError) { Kiln.cat([@x, @x], dim: nil) }
    assert_match(/Kiln\.cat: dim must be an Integer/, e.message)
  end
end
