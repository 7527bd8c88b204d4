# frozen_string_literal: true

require_relative "test_helper"

# Kiln::NN::RNN, GRU and LSTM (issue 42) against a plain-Ruby reference of
# torch's equations (gate order, biases, directions, layers), their
# parameter names and shapes, hx/batch_first/unbatched forms, and their
# gradients against finite differences in float64.
class RecurrentTest < Minitest::Test
  include KilnAssertions

  def sig(v) = 1.0 / (1.0 + Math.exp(-v))

  # w [rows, cols] (nested Arrays) times v [cols]
  def mv(w, v) = w.map { |row| row.zip(v).sum { |a, b| a * b } }
  def add(*vs) = vs.transpose.map(&:sum)

  # one step of cell mode for one batch row: [h, c]
  def cell(mode, x, h, c, p, nonlin)
    gx = add(mv(p[:w_ih], x), p[:b_ih])
    gh = add(mv(p[:w_hh], h), p[:b_hh])
    n = h.size
    case mode
    when :rnn
      [add(gx, gh).map { |v| nonlin == :relu ? [v, 0.0].max : Math.tanh(v) }, nil]
    when :gru
      r = (0...n).map { |j| sig(gx[j] + gh[j]) }
      z = (0...n).map { |j| sig(gx[n + j] + gh[n + j]) }
      nn = (0...n).map { |j| Math.tanh(gx[2 * n + j] + r[j] * gh[2 * n + j]) }
      [(0...n).map { |j| (1 - z[j]) * nn[j] + z[j] * h[j] }, nil]
    when :lstm
      s = add(gx, gh)
      i = (0...n).map { |j| sig(s[j]) }
      f = (0...n).map { |j| sig(s[n + j]) }
      g = (0...n).map { |j| Math.tanh(s[2 * n + j]) }
      o = (0...n).map { |j| sig(s[3 * n + j]) }
      c2 = (0...n).map { |j| f[j] * c[j] + i[j] * g[j] }
      [(0...n).map { |j| o[j] * Math.tanh(c2[j]) }, c2]
    end
  end

  # the reference over x [T][B][I]: [output [T][B][H * dirs], h_n [L * dirs][B][H]]
  def reference(mode, m, x, layers, dirs, hidden, nonlin: :tanh)
    sd = m.state_dict.transform_values(&:to_a)
    batch = x[0].size
    inp = x
    hn = []
    cn = []
    layers.times do |l|
      outs = dirs.times.map do |d|
        sfx = "_l#{l}#{d == 1 ? '_reverse' : ''}"
        p = { w_ih: sd["weight_ih#{sfx}"], w_hh: sd["weight_hh#{sfx}"], b_ih: sd["bias_ih#{sfx}"],
              b_hh: sd["bias_hh#{sfx}"] }
        hs = Array.new(batch) { Array.new(hidden, 0.0) }
        cs = Array.new(batch) { Array.new(hidden, 0.0) }
        out = Array.new(inp.size)
        order = d.zero? ? (0...inp.size).to_a : (inp.size - 1).downto(0).to_a
        order.each do |t|
          batch.times do |b|
            hs[b], cs[b] = cell(mode, inp[t][b], hs[b], cs[b], p, nonlin)
          end
          out[t] = hs.map(&:dup)
        end
        hn << hs
        cn << cs
        out
      end
      inp = (0...inp.size).map { |t| (0...batch).map { |b| outs.flat_map { |o| o[t][b] } } }
    end
    [inp, hn, cn]
  end

  def check(mode, cls, layers:, dirs:, **kw)
    Kiln.manual_seed(21)
    hidden = 3
    m = cls.new(4, hidden, num_layers: layers, bidirectional: dirs == 2, **kw)
    x = Kiln.randn(5, 2, 4)
    out, state = m.(x)
    want_out, want_h, want_c = reference(mode, m, x.to_a, layers, dirs, hidden, nonlin: kw[:nonlinearity] || :tanh)
    assert_tensor want_out, out, tol: 1e-5
    if mode == :lstm
      assert_tensor want_h, state[0], tol: 1e-5
      assert_tensor want_c, state[1], tol: 1e-5
    else
      assert_tensor want_h, state, tol: 1e-5
    end
  end

  def test_rnn_gru_lstm_follow_torchs_equations
    check(:rnn, Kiln::NN::RNN, layers: 1, dirs: 1)
    check(:rnn, Kiln::NN::RNN, layers: 2, dirs: 2, nonlinearity: :relu)
    check(:gru, Kiln::NN::GRU, layers: 1, dirs: 1)
    check(:gru, Kiln::NN::GRU, layers: 2, dirs: 2)
    check(:lstm, Kiln::NN::LSTM, layers: 1, dirs: 1)
    check(:lstm, Kiln::NN::LSTM, layers: 2, dirs: 2)
  end

  # RNNCell, GRUCell, LSTMCell: torch's step equations (the reference
  # cell above, row by row), names, shapes and forms; a loop a user writes
  # with one rolls, and gives the GRU module's results on the same weights
  def test_cells_follow_torchs_equations
    [[:rnn, Kiln::NN::RNNCell, {}], [:rnn, Kiln::NN::RNNCell, { nonlinearity: :relu }],
     [:gru, Kiln::NN::GRUCell, {}], [:lstm, Kiln::NN::LSTMCell, {}]].each do |mode, cls, kw|
      Kiln.manual_seed(31)
      m = cls.new(4, 3, **kw)
      sd = m.state_dict.transform_values(&:to_a)
      p = { w_ih: sd["weight_ih"], w_hh: sd["weight_hh"], b_ih: sd["bias_ih"], b_hh: sd["bias_hh"] }
      x = Kiln.randn(2, 4)
      h = Kiln.randn(2, 3)
      c = Kiln.randn(2, 3)
      got = mode == :lstm ? m.(x, [h, c]) : m.(x, h)
      want = (0...2).map { |b| cell(mode, x.to_a[b], h.to_a[b], c.to_a[b], p, kw[:nonlinearity] || :tanh) }
      if mode == :lstm
        assert_tensor want.map(&:first), got[0], tol: 1e-5
        assert_tensor want.map(&:last), got[1], tol: 1e-5
        h1, c1 = m.(x[0], [h[0], c[0]]) # unbatched
        assert_tensor want[0][0], h1, tol: 1e-5
        assert_tensor want[0][1], c1, tol: 1e-5
      else
        assert_tensor want.map(&:first), got, tol: 1e-5
        assert_tensor want[0][0], m.(x[0], h[0]), tol: 1e-5
        zero = (0...2).map { |b| cell(mode, x.to_a[b], [0.0] * 3, [0.0] * 3, p, kw[:nonlinearity] || :tanh)[0] }
        assert_tensor zero, m.(x), tol: 1e-5 # hx nil: zeros
      end
    end
    g = Kiln::NN::GRUCell.new(4, 3)
    assert_equal [["weight_ih", [9, 4]], ["weight_hh", [9, 3]], ["bias_ih", [9]], ["bias_hh", [9]]],
                 g.named_parameters.to_a.map { |n, t| [n, t.shape] }
    assert_equal [%w[weight_ih weight_hh], [[20, 2], [20, 5]]],
                 Kiln::NN::LSTMCell.new(2, 5, bias: false).named_parameters.to_a.transpose.then { |n, t| [n, t.map(&:shape)] }
    err = assert_raises(Kiln::ShapeError) { g.(Kiln.randn(2, 4), Kiln.zeros(3, 3)) }
    assert_match(/hx must be \[2, 3\]/, err.message)
    assert_raises(Kiln::ShapeError) { g.(Kiln.randn(2, 5)) }
    assert_raises(ArgumentError) { Kiln::NN::LSTMCell.new(4, 3, nonlinearity: :relu) }
  end

  def test_a_loop_over_a_cell_rolls_and_equals_the_module
    Kiln.manual_seed(8)
    gru = Kiln::NN::GRU.new(4, 6)
    cellm = Kiln::NN::GRUCell.new(4, 6)
    cellm.load_state_dict(gru.state_dict.transform_keys { |k| k.sub("_l0", "") })
    x = Kiln.randn(20, 3, 4)
    out, = gru.(x)
    loss_m = (out ** 2).mean
    loss_m.backward
    names = %w[weight_ih weight_hh bias_ih bias_hh]
    want = [loss_m.item, names.map { |n| gru.named_parameters["#{n}_l0"].grad.to_a }]
    before = Kiln.stats
    h = nil
    outs = (0...20).map { |t| h = cellm.(x[t], h) }
    loss_c = (Kiln.stack(outs, 0) ** 2).mean
    loss_c.backward
    assert_in_delta want[0], loss_c.item, 1e-6
    names.each_with_index { |n, i| assert_tensor want[1][i], cellm.send(n).grad, tol: 1e-5 }
    assert_operator Kiln.stats[:loops_rolled] - before[:loops_rolled], :>=, 2, "forward and backward rolled"
  end

  def test_parameters_have_torchs_names_shapes_and_init
    g = Kiln::NN::GRU.new(4, 3, num_layers: 2, bidirectional: true)
    shapes = g.named_parameters.to_a.to_h { |n, t| [n, t.shape] }
    assert_equal [9, 4], shapes["weight_ih_l0"]
    assert_equal [9, 3], shapes["weight_hh_l0_reverse"]
    assert_equal [9, 6], shapes["weight_ih_l1"] # 2 directions of 3 in
    assert_equal [9], shapes["bias_hh_l1_reverse"]
    assert_equal 16, shapes.size
    bound = 1.0 / Math.sqrt(3)
    assert g.parameters.all? { |t| t.to_a.flatten.all? { |v| v.abs <= bound } }
    l = Kiln::NN::LSTM.new(2, 5, bias: false)
    assert_equal [["weight_ih_l0", [20, 2]], ["weight_hh_l0", [20, 5]]],
                 l.named_parameters.to_a.map { |n, t| [n, t.shape] }
  end

  def test_batch_first_hx_and_unbatched_forms
    Kiln.manual_seed(4)
    m = Kiln::NN::LSTM.new(4, 3, num_layers: 2)
    x = Kiln.randn(5, 2, 4)
    h0 = Kiln.randn(2, 2, 3)
    c0 = Kiln.randn(2, 2, 3)
    out, (h, c) = m.(x, [h0, c0])
    bf = Kiln::NN::LSTM.new(4, 3, num_layers: 2, batch_first: true)
    bf.load_state_dict(m.state_dict)
    out2, (h2, c2) = bf.(x.transpose(0, 1), [h0, c0])
    assert_tensor out.to_a, out2.transpose(0, 1), tol: 1e-6
    assert_tensor h.to_a, h2, tol: 1e-6
    assert_tensor c.to_a, c2, tol: 1e-6
    # one sequence without a batch axis: the batch's first row
    out3, (h3, _c3) = m.(x[0..-1, 0], [h0[0..-1, 0], c0[0..-1, 0]])
    assert_equal [5, 3], out3.shape
    assert_tensor out.to_a.map { |r| r[0] }, out3, tol: 1e-6
    assert_tensor h.to_a.map { |r| r[0] }, h3, tol: 1e-6
    err = assert_raises(Kiln::ShapeError) { m.(x, [Kiln.zeros(1, 2, 3), c0]) }
    assert_match(/h_0 must be \[2, 2, 3\]/, err.message)
    assert_raises(Kiln::ShapeError) { m.(Kiln.randn(5, 2, 7)) }
    assert_raises(ArgumentError) { Kiln::NN::GRU.new(4, 3, nonlinearity: :relu) }
    assert_raises(ArgumentError) { Kiln::NN::RNN.new(4, 3, nonlinearity: :gelu) }
  end

  # gradients of every parameter kind against central differences (float64)
  def test_gradients_match_finite_differences
    Kiln.manual_seed(9)
    m = Kiln::NN::GRU.new(3, 2, bidirectional: true)
    # the module's parameters as float64 leaves (it reads them by name)
    params64 = m.named_parameters.to_a.to_h do |n, t|
      [n, t.detach.to(:float64).tap { |u| u.requires_grad = true }]
    end
    x = Kiln.randn(4, 2, 3, dtype: :float64)
    loss = lambda do |ps|
      ps.each { |n, t| m.instance_variable_set("@#{n}", t) }
      out, h = m.(x)
      (out * out).sum + (h * h * 0.5).sum
    end
    loss.(params64).backward
    h = 1e-6
    %w[weight_ih_l0 weight_hh_l0_reverse bias_hh_l0 bias_ih_l0_reverse].each do |name|
      base = params64[name].detach.to_a.flatten
      grad = params64[name].grad.to_a.flatten
      [0, base.size - 1].each do |i|
        f = lambda do |delta|
          v = base.dup
          v[i] += delta
          ps = params64.merge(name => Kiln.tensor(v, dtype: :float64).reshape(*params64[name].shape))
          Kiln.no_grad { loss.(ps).item }
        end
        fd = (f.(h) - f.(-h)) / (2 * h)
        assert_in_delta fd, grad[i], 1e-6 * [1, fd.abs].max, "#{name}[#{i}]"
      end
    end
  end

  # Marshal round trips a module (its parameters, still trainable, and its
  # configuration): the copy computes the same outputs
  def test_modules_survive_marshal
    Kiln.manual_seed(12)
    m = Kiln::NN::LSTM.new(3, 4, num_layers: 2, bidirectional: true)
    copy = Marshal.load(Marshal.dump(m))
    x = Kiln.randn(5, 2, 3)
    out, (h, c) = m.(x)
    out2, (h2, c2) = copy.(x)
    assert_tensor out.to_a, out2, tol: 0
    assert_tensor h.to_a, h2, tol: 0
    assert_tensor c.to_a, c2, tol: 0
    assert copy.parameters.all?(&:requires_grad)
    # its own tensors: training the copy leaves the original as it was
    before = m.state_dict.transform_values(&:to_a)
    Kiln::Optim::SGD.new(copy.parameters, lr: 0.5).tap do |opt|
      copy.(x)[0].sum.backward
      opt.step
    end
    before.each { |k, v| assert_tensor v, m.state_dict.fetch(k), tol: 0 }
    refute_equal before["weight_ih_l0"], copy.state_dict["weight_ih_l0"].to_a
    enc = Kiln::NN::TransformerEncoder.new(Kiln::NN::TransformerEncoderLayer.new(8, 2, dim_feedforward: 16), 2)
    enc.eval
    enc2 = Marshal.load(Marshal.dump(enc))
    y = Kiln.randn(4, 2, 8)
    assert_tensor enc.(y).to_a, enc2.(y), tol: 0
  end
end

