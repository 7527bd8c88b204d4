# frozen_string_literal: true

module Kiln
  module NN
    # over [N, C, L] (a Conv2d over [N, C, 1, L]: the same kernels and
    # gradients); initialized like torch-rb: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    class Conv1d < Module
      attr_reader :weight, :bias

      def initialize(in_channels, out_channels, kernel_size, stride: 1, padding: 0, dilation: 1,
                     groups: 1, bias: true, padding_mode: "zeros")
        super()
        raise ArgumentError, "Kiln::NN::Conv1d: only padding_mode: \"zeros\"" unless padding_mode.to_s == "zeros"
        unless (in_channels % groups).zero? && (out_channels % groups).zero?
          raise ArgumentError, "Kiln::NN::Conv1d: channels (#{in_channels}, #{out_channels}) must divide by groups (#{groups})"
        end

        @in_channels = in_channels
        @out_channels = out_channels
        @kernel_size = F.single(kernel_size)
        @stride = F.single(stride)
        @padding = F.single(padding)
        @dilation = F.single(dilation)
        @groups = groups
        bound = 1.0 / Math.sqrt((in_channels / groups) * @kernel_size)
        @weight = uniform_parameter([out_channels, in_channels / groups, @kernel_size], bound)
        @bias = bias ? uniform_parameter([out_channels], bound) : nil
      end

      def forward(x)
        F.conv1d(x, @weight, @bias, stride: @stride, padding: @padding, dilation: @dilation, groups: @groups)
      end

      def extra_inspect
        "#{@in_channels}, #{@out_channels}, kernel_size: #{@kernel_size}, stride: #{@stride}" \
          "#{@padding.zero? ? '' : ", padding: #{@padding}"}#{@groups == 1 ? '' : ", groups: #{@groups}"}"
      end
    end

    module Functional
      class << self
        # [N, C, L] as [N, C, 1, L] through conv2d
        def conv1d(input, weight, bias, stride, padding, dilation, groups)
          unless input.ndim == 3 && weight.ndim == 3
            raise Kiln::ShapeError, "Kiln::NN::Functional.conv1d: input [N, C, L] and weight [O, C/groups, K], " \
                                    "not #{input.shape.inspect} and #{weight.shape.inspect}"
          end

          out = input.unsqueeze(2)._conv2d(weight.unsqueeze(2), bias, [1, single(stride)], [0, single(padding)],
                                           [1, single(dilation)], groups)
          out.squeeze(2)
        end

        # one Integer (or a one-element Array of one)
        def single(v)
          return v if v.is_a?(Integer)
          return v[0] if v.is_a?(Array) && v.size == 1 && v[0].is_a?(Integer)

          raise ArgumentError, "expected an Integer, got #{v.inspect}"
        end

        extend Signature::DSL

        signature "conv1d(Tensor input, Tensor weight, Tensor? bias=None, int[] stride=1, int[] padding=0, int[] dilation=1, int groups=1)"
      end
    end

    # torch.nn.init's initializers, as torch-rb names them: each writes new
    # values into the tensor in place (under no_grad; a parameter stays a
    # leaf that requires grad) and returns it.  Random ones draw from Kiln's
    # generator (Kiln.manual_seed reproduces them).
    module Init
      module_function

      # the recommended gain for a nonlinearity (torch's table)
      def calculate_gain(nonlinearity, param = nil)
        case nonlinearity.to_s
        when "linear", "identity", "sigmoid", "conv1d", "conv2d", "conv3d",
             "conv_transpose1d", "conv_transpose2d", "conv_transpose3d" then 1.0
        when "tanh" then 5.0 / 3
        when "relu" then Math.sqrt(2.0)
        when "leaky_relu"
          slope = param.nil? ? 0.01 : param
          unless slope.is_a?(Numeric)
            raise ArgumentError, "Kiln::NN::Init.calculate_gain: negative_slope #{slope.inspect} is not a number"
          end

          Math.sqrt(2.0 / (1 + slope**2))
        when "selu" then 3.0 / 4
        else raise ArgumentError, "Kiln::NN::Init.calculate_gain: unsupported nonlinearity #{nonlinearity.inspect}"
        end
      end

      # [fan_in, fan_out] of a weight of 2 or more dimensions ([out, in, *kernel])
      def calculate_fan_in_and_fan_out(tensor)
        if tensor.ndim < 2
          raise Kiln::ShapeError, "Kiln::NN::Init: fan in and fan out need a tensor of 2 or more dimensions, not #{tensor.shape.inspect}"
        end

        receptive = tensor.shape.drop(2).reduce(1, :*)
        [tensor.shape[1] * receptive, tensor.shape[0] * receptive]
      end

      def uniform!(tensor, a: 0.0, b: 1.0)
        write(tensor, Kiln.rand(tensor.shape, dtype: tensor.dtype) * (b - a) + a)
      end

      def normal!(tensor, mean: 0.0, std: 1.0)
        write(tensor, Kiln.randn(tensor.shape, dtype: tensor.dtype) * std + mean)
      end

      def constant!(tensor, val)
        write(tensor, Kiln.full(tensor.shape, val, dtype: tensor.dtype))
      end

      def ones!(tensor)
        constant!(tensor, 1)
      end

      def zeros!(tensor)
        constant!(tensor, 0)
      end

      # the identity in a 2-D tensor (ones on the diagonal)
      def eye!(tensor)
        raise Kiln::ShapeError, "Kiln::NN::Init.eye!: a 2-D tensor is needed, not #{tensor.shape.inspect}" unless tensor.ndim == 2

        rows, cols = tensor.shape
        write(tensor, Kiln.arange(rows).unsqueeze(1).eq(Kiln.arange(cols).unsqueeze(0))._cast(tensor.dtype))
      end

      def xavier_uniform!(tensor, gain: 1.0)
        fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
        a = Math.sqrt(3.0) * gain * Math.sqrt(2.0 / (fan_in + fan_out))
        uniform!(tensor, a: -a, b: a)
      end

      def xavier_normal!(tensor, gain: 1.0)
        fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
        normal!(tensor, mean: 0.0, std: gain * Math.sqrt(2.0 / (fan_in + fan_out)))
      end

      def kaiming_uniform!(tensor, a: 0, mode: :fan_in, nonlinearity: :leaky_relu)
        bound = Math.sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity)
        uniform!(tensor, a: -bound, b: bound)
      end

      def kaiming_normal!(tensor, a: 0, mode: :fan_in, nonlinearity: :leaky_relu)
        normal!(tensor, mean: 0.0, std: kaiming_std(tensor, a, mode, nonlinearity))
      end

      def kaiming_std(tensor, a, mode, nonlinearity)
        fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
        fan = case mode.to_s
              when "fan_in" then fan_in
              when "fan_out" then fan_out
              else raise ArgumentError, "Kiln::NN::Init: mode is :fan_in or :fan_out, not #{mode.inspect}"
              end
        calculate_gain(nonlinearity, a) / Math.sqrt(fan)
      end

      def write(tensor, values)
        unless tensor.is_a?(Tensor)
          raise TypeError, "Kiln::NN::Init: #{tensor.class} is not a Kiln::Tensor"
        end
        unless tensor.floating_point?
          raise Kiln::DTypeError, "Kiln::NN::Init: a floating-point tensor is needed, not #{tensor.dtype}"
        end

        Kiln.no_grad { tensor.copy!(values) }
        tensor
      end
      private_class_method :kaiming_std, :write
    end

    # torch.nn.utils's gradient clipping, as torch-rb names it
    module Utils
      module_function

      # Scales every gradient of parameters by min(1, max_norm / (total +
      # 1e-6)), total the norm of all of them together (norm_type 2, any
      # positive number, or Float::INFINITY), in place: what the optimizer
      # reads next.  Returns the total norm (a 0-d tensor, not read: no wait).
      def clip_grad_norm!(parameters, max_norm, norm_type: 2.0, error_if_nonfinite: false)
        params = parameters.is_a?(Tensor) ? [parameters] : parameters.to_a
        grads = params.filter_map(&:grad)
        return Kiln.tensor(0.0) if grads.empty?

        norm_type = norm_type.to_f
        total = Kiln.no_grad do
          if norm_type == Float::INFINITY
            grads.map { |g| g.abs.max }.reduce { |m, x| m.maximum(x) }
          else
            Kiln.stack(grads.map { |g| g.norm(norm_type) }, 0).norm(norm_type)
          end
        end
        if error_if_nonfinite && !total.item.finite?
          raise Kiln::Error, "Kiln::NN::Utils.clip_grad_norm!: the total norm of order #{norm_type} is #{total.item}: " \
                             "the gradients are not finite (error_if_nonfinite: false scales them anyway)"
        end

        Kiln.no_grad do
          coef = max_norm.to_f / (total + 1e-6)
          coef = coef.clamp(nil, 1.0)
          grads.each { |g| g.mul!(coef) }
        end
        total
      end

      # clamps every gradient of parameters to [-clip_value, clip_value] in place
      def clip_grad_value!(parameters, clip_value)
        params = parameters.is_a?(Tensor) ? [parameters] : parameters.to_a
        v = clip_value.to_f
        Kiln.no_grad { params.filter_map(&:grad).each { |g| g.copy!(g.clamp(-v, v)) } }
        nil
      end
    end
  end
end

module Kiln
  module NN
    # The recurrent layers of torch.nn (RNN, GRU, LSTM), with torch's
    # parameter names (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0,
    # ..._reverse), gate order (GRU r, z, n; LSTM i, f, g, o), init
    # U(-1/sqrt(hidden), 1/sqrt(hidden)), shapes ([T, B, I], or [B, T, I]
    # with batch_first:, or unbatched [T, I]) and results (output, h_n; for
    # LSTM output, [h_n, c_n]).  Each layer and direction computes its input
    # projection for every step at once (one GEMM over [T * B, I]) and then
    # runs the recurrent part step by step, as the loop is written.
    class RNNBase < Module
      attr_reader :input_size, :hidden_size, :num_layers, :bidirectional, :batch_first

      GATES = { rnn: 1, gru: 3, lstm: 4 }.freeze

      def initialize(mode, input_size, hidden_size, num_layers: 1, nonlinearity: nil, bias: true,
                     batch_first: false, dropout: 0.0, bidirectional: false)
        super()
        nonlinearity = RNNBase.check_sizes(self, mode, input_size, hidden_size, nonlinearity)
        raise ArgumentError, "#{self.class}: num_layers must be a positive Integer" unless num_layers.is_a?(Integer) && num_layers.positive?
        raise ArgumentError, "#{self.class}: dropout must be in [0, 1], got #{dropout}" unless dropout >= 0 && dropout <= 1

        @mode = mode
        @input_size = input_size
        @hidden_size = hidden_size
        @num_layers = num_layers
        @nonlinearity = nonlinearity.to_s
        @batch_first = batch_first
        @dropout = dropout.to_f
        @bidirectional = bidirectional
        @bias = bias
        dirs = bidirectional ? 2 : 1
        rows = GATES.fetch(mode) * hidden_size
        bound = 1.0 / Math.sqrt(hidden_size)
        num_layers.times do |l|
          dirs.times do |d|
            sfx = suffix(l, d)
            width = l.zero? ? input_size : hidden_size * dirs
            instance_variable_set("@weight_ih#{sfx}", uniform_parameter([rows, width], bound))
            instance_variable_set("@weight_hh#{sfx}", uniform_parameter([rows, hidden_size], bound))
            next unless bias

            instance_variable_set("@bias_ih#{sfx}", uniform_parameter([rows], bound))
            instance_variable_set("@bias_hh#{sfx}", uniform_parameter([rows], bound))
          end
        end
      end

      def forward(input, hx = nil)
        unbatched = input.ndim == 2
        unless [2, 3].include?(input.ndim) && input.shape[-1] == @input_size
          raise Kiln::ShapeError, "#{self.class}: input must be [T, B, #{@input_size}] (or [B, T, #{@input_size}] " \
                                  "with batch_first:, or [T, #{@input_size}]), not #{input.shape.inspect}"
        end

        x = unbatched ? input.unsqueeze(1) : (@batch_first ? input.transpose(0, 1) : input)
        dirs = @bidirectional ? 2 : 1
        h0, c0 = initial_state(hx, x, dirs, unbatched)
        hn = []
        cn = []
        layer_in = x
        @num_layers.times do |l|
          outs = Array.new(dirs) do |d|
            idx = l * dirs + d
            out, h, c = run_direction(layer_in, l, d, h0[idx], c0&.[](idx))
            hn << h
            cn << c
            out
          end
          layer_in = dirs == 2 ? Kiln.cat(outs, 2) : outs[0]
          layer_in = F.dropout(layer_in, p: @dropout, training: true) if @dropout.positive? && training? && l < @num_layers - 1
        end
        output = unbatched ? layer_in.squeeze(1) : (@batch_first ? layer_in.transpose(0, 1) : layer_in)
        h_n = Kiln.stack(hn, 0)
        h_n = h_n.squeeze(1) if unbatched
        return [output, h_n] unless @mode == :lstm

        c_n = Kiln.stack(cn, 0)
        [output, [h_n, unbatched ? c_n.squeeze(1) : c_n]]
      end

      def extra_inspect
        "#{@input_size}, #{@hidden_size}#{@num_layers == 1 ? '' : ", num_layers: #{@num_layers}"}" \
          "#{@batch_first ? ', batch_first: true' : ''}#{@bidirectional ? ', bidirectional: true' : ''}"
      end

      private

      def suffix(layer, dir)
        "_l#{layer}#{dir == 1 ? '_reverse' : ''}"
      end

      # [h0 per layer and direction, c0 (LSTM) or nil]
      def initial_state(hx, x, dirs, unbatched)
        want = [@num_layers * dirs, x.shape[1], @hidden_size]
        check = lambda do |t, what|
          t = t.unsqueeze(1) if unbatched && t.ndim == 2
          unless t.shape == want
            raise Kiln::ShapeError, "#{self.class}: #{what} must be #{want.inspect}, not #{t.shape.inspect}"
          end

          t
        end
        if @mode == :lstm
          h, c = hx.nil? ? [nil, nil] : hx
          h = h.nil? ? Kiln.zeros(want, dtype: x.dtype) : check.(h, "h_0")
          c = c.nil? ? Kiln.zeros(want, dtype: x.dtype) : check.(c, "c_0")
          [Array.new(want[0]) { |i| h[i] }, Array.new(want[0]) { |i| c[i] }]
        else
          h = hx.nil? ? Kiln.zeros(want, dtype: x.dtype) : check.(hx, "h_0")
          [Array.new(want[0]) { |i| h[i] }, nil]
        end
      end

      # one layer, one direction over x [T, B, W]: [outputs [T, B, H], h, c]
      def run_direction(x, layer, dir, h, c)
        sfx = suffix(layer, dir)
        w_ih = instance_variable_get("@weight_ih#{sfx}")
        w_hh = instance_variable_get("@weight_hh#{sfx}")
        b_ih = @bias ? instance_variable_get("@bias_ih#{sfx}") : nil
        b_hh = @bias ? instance_variable_get("@bias_hh#{sfx}") : nil
        steps = x.shape[0]
        gx = F.linear(x, w_ih, b_ih) # every step's input projection at once
        outs = Array.new(steps)
        order = dir.zero? ? (0...steps).to_a : (steps - 1).downto(0).to_a
        order.each do |t|
          h, c = cell(gx[t], F.linear(h, w_hh, b_hh), h, c)
          outs[t] = h
        end
        [Kiln.stack(outs, 0), h, c]
      end

      def cell(gx, gh, h, c) = RNNBase.step(@mode, @nonlinearity, gx, gh, h, c)

      # the checks the modules and the cells share; returns the nonlinearity
      # (:tanh unless given; the gated modes take none)
      def self.check_sizes(m, mode, input_size, hidden_size, nonlinearity)
        unless hidden_size.is_a?(Integer) && hidden_size.positive? && input_size.is_a?(Integer) && input_size.positive?
          raise ArgumentError, "#{m.class}: input_size and hidden_size must be positive Integers"
        end
        raise ArgumentError, "#{m.class}: no nonlinearity: (its gates are fixed)" if mode != :rnn && !nonlinearity.nil?

        nonlinearity ||= :tanh
        unless %w[tanh relu].include?(nonlinearity.to_s)
          raise ArgumentError, "#{m.class}: nonlinearity is :tanh or :relu, not #{nonlinearity.inspect}"
        end

        nonlinearity
      end

      # one step of mode from the input and hidden projections gx, gh
      # [B, gates * H]: [h', c'] (c' nil but for LSTM)
      def self.step(mode, nonlinearity, gx, gh, h, c)
        case mode
        when :rnn
          s = gx + gh
          [nonlinearity == "tanh" ? s.tanh : s.relu, nil]
        when :gru
          rx, zx, nx = gx.chunk(3, 1)
          rh, zh, nh = gh.chunk(3, 1)
          r = (rx + rh).sigmoid
          z = (zx + zh).sigmoid
          n = (nx + r * nh).tanh
          [n + z * (h - n), nil] # (1 - z) * n + z * h
        when :lstm
          i, f, g, o = (gx + gh).chunk(4, 1)
          c = f.sigmoid * c + i.sigmoid * g.tanh
          [o.sigmoid * c.tanh, c]
        end
      end
    end

    # torch.nn.RNNCell, GRUCell and LSTMCell: one step of the recurrences
    # above (torch's parameter names weight_ih, weight_hh, bias_ih, bias_hh,
    # gate order and init), for the loops users write themselves.  Kiln
    # records such a loop as written and rolls it (one body for every
    # length, the input projections and weight gradients out of the loop).
    # input [B, I] or unbatched [I]; hx [B, H] (LSTM: [h, c]), zeros when
    # nil; returns h' (LSTM: [h', c']).
    class RNNCellBase < Module
      attr_reader :input_size, :hidden_size, :weight_ih, :weight_hh, :bias_ih, :bias_hh

      def initialize(mode, input_size, hidden_size, bias: true, nonlinearity: nil)
        super()
        nonlinearity = RNNBase.check_sizes(self, mode, input_size, hidden_size, nonlinearity)
        @mode = mode
        @input_size = input_size
        @hidden_size = hidden_size
        @nonlinearity = nonlinearity.to_s
        rows = RNNBase::GATES.fetch(mode) * hidden_size
        bound = 1.0 / Math.sqrt(hidden_size)
        @weight_ih = uniform_parameter([rows, input_size], bound)
        @weight_hh = uniform_parameter([rows, hidden_size], bound)
        return unless bias

        @bias_ih = uniform_parameter([rows], bound)
        @bias_hh = uniform_parameter([rows], bound)
      end

      def forward(input, hx = nil)
        unless [1, 2].include?(input.ndim) && input.shape[-1] == @input_size
          raise Kiln::ShapeError, "#{self.class}: input must be [B, #{@input_size}] or [#{@input_size}], " \
                                  "not #{input.shape.inspect}"
        end

        unbatched = input.ndim == 1
        x = unbatched ? input.unsqueeze(0) : input
        want = [x.shape[0], @hidden_size]
        state = lambda do |t, what|
          return Kiln.zeros(want, dtype: x.dtype) if t.nil?

          t = t.unsqueeze(0) if unbatched && t.ndim == 1
          raise Kiln::ShapeError, "#{self.class}: #{what} must be #{want.inspect}, not #{t.shape.inspect}" unless t.shape == want

          t
        end
        if @mode == :lstm
          h, c = hx.nil? ? [nil, nil] : hx
          h = state.(h, "h")
          c = state.(c, "c")
        else
          h = state.(hx, "hx")
        end
        h2, c2 = RNNBase.step(@mode, @nonlinearity, F.linear(x, @weight_ih, @bias_ih), F.linear(h, @weight_hh, @bias_hh),
                              h, c)
        h2, c2 = [h2, c2].map { |t| t&.squeeze(0) } if unbatched
        @mode == :lstm ? [h2, c2] : h2
      end

      def extra_inspect
        "#{@input_size}, #{@hidden_size}#{@bias_ih ? '' : ', bias: false'}"
      end
    end

    class RNNCell < RNNCellBase
      def initialize(input_size, hidden_size, **kw) = super(:rnn, input_size, hidden_size, **kw)
    end

    class GRUCell < RNNCellBase
      def initialize(input_size, hidden_size, **kw) = super(:gru, input_size, hidden_size, **kw)
    end

    class LSTMCell < RNNCellBase
      def initialize(input_size, hidden_size, **kw) = super(:lstm, input_size, hidden_size, **kw)
    end

    class RNN < RNNBase
      def initialize(input_size, hidden_size, **kw) = super(:rnn, input_size, hidden_size, **kw)
    end

    class GRU < RNNBase
      def initialize(input_size, hidden_size, **kw) = super(:gru, input_size, hidden_size, **kw)
    end

    class LSTM < RNNBase
      def initialize(input_size, hidden_size, **kw)
        raise ArgumentError, "Kiln::NN::LSTM: proj_size is not supported" if kw.key?(:proj_size)

        super(:lstm, input_size, hidden_size, **kw)
      end
    end
  end
end

module Kiln
  module NN
    module Functional
      class << self
        # softmax(q k^T * scale + mask) v over the last two axes, as
        # torch.nn.functional.scaled_dot_product_attention: attn_mask a bool
        # tensor (true: may attend) or a float one added to the scores;
        # is_causal masks key positions after each query's; scale defaults
        # to 1/sqrt(head size); dropout_p drops weights (training only).  A
        # query whose keys are all masked out gets 0 (PyTorch 2.5+), not NaN
        def scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
          if attn_mask && is_causal
            raise ArgumentError, "scaled_dot_product_attention: attn_mask and is_causal: true together (give one)"
          end

          s = scale.nil? ? 1.0 / Math.sqrt(query.shape[-1]) : scale.to_f
          # one fused op (Kiln's attention primitive) unless weights are dropped
          return query._sdpa(key, value, attn_mask, is_causal, s) if s.positive? && !dropout_p.positive?

          scores = query.matmul(key.transpose(-2, -1)) * s
          if is_causal
            l = query.shape[-2]
            m = key.shape[-2]
            scores = scores.masked_fill(Kiln.arange(m).unsqueeze(0).gt(Kiln.arange(l).unsqueeze(1)), -Float::INFINITY)
          elsif attn_mask
            scores = attn_mask.dtype == :bool ? scores.masked_fill(attn_mask.logical_not, -Float::INFINITY) : scores + attn_mask
          end
          weights = scores.softmax(-1)
          weights = dropout(weights, dropout_p, true) if dropout_p.positive?
          weights.matmul(value)
        end

        signature "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None)"
      end
    end

    # torch.nn.MultiheadAttention (embed_dim, num_heads; dropout:, bias:,
    # batch_first:): in_proj_weight [3E, E] (xavier uniform), in_proj_bias
    # (zeros), out_proj (a Linear, its bias zeros), so a state_dict has
    # torch's names.  forward(query, key, value, key_padding_mask:,
    # need_weights:, attn_mask:, average_attn_weights:, is_causal:) returns
    # [output, weights or nil]; masks as torch's (bool: true is masked out;
    # float: added).  kdim/vdim other than embed_dim, add_bias_kv and
    # add_zero_attn are not supported (an error says so).
    class MultiheadAttention < Module
      attr_reader :embed_dim, :num_heads, :batch_first, :in_proj_weight, :in_proj_bias, :out_proj

      def initialize(embed_dim, num_heads, dropout: 0.0, bias: true, add_bias_kv: false, add_zero_attn: false,
                     kdim: nil, vdim: nil, batch_first: false)
        super()
        unless (embed_dim % num_heads).zero?
          raise ArgumentError, "Kiln::NN::MultiheadAttention: embed_dim #{embed_dim} must divide by num_heads #{num_heads}"
        end
        if add_bias_kv || add_zero_attn || (kdim && kdim != embed_dim) || (vdim && vdim != embed_dim)
          raise ArgumentError, "Kiln::NN::MultiheadAttention: kdim/vdim other than embed_dim, add_bias_kv and " \
                               "add_zero_attn are not supported"
        end

        @embed_dim = embed_dim
        @num_heads = num_heads
        @dropout = dropout.to_f
        @batch_first = batch_first
        @in_proj_weight = Kiln.empty(3 * embed_dim, embed_dim)
        Init.xavier_uniform!(@in_proj_weight)
        @in_proj_weight.requires_grad = true
        @in_proj_bias = bias ? constant_parameter([3 * embed_dim], 0.0) : nil
        @out_proj = Linear.new(embed_dim, embed_dim, bias: bias)
        Init.zeros!(@out_proj.bias) if bias
      end

      def forward(query, key, value, key_padding_mask: nil, need_weights: true, attn_mask: nil,
                  average_attn_weights: true, is_causal: false)
        unbatched = query.ndim == 2
        q, k, v = [query, key, value].map do |t|
          next t.unsqueeze(1) if unbatched

          @batch_first ? t.transpose(0, 1) : t
        end
        l, n, e = q.shape
        s = k.shape[0]
        if e != @embed_dim || k.shape[1..] != [n, e] || v.shape != k.shape
          raise Kiln::ShapeError, "Kiln::NN::MultiheadAttention: query #{query.shape.inspect}, key #{key.shape.inspect} " \
                                  "and value #{value.shape.inspect} must share batch and embed_dim #{@embed_dim}"
        end

        w_q, w_k, w_v = @in_proj_weight.chunk(3, 0)
        b_q, b_k, b_v = @in_proj_bias ? @in_proj_bias.chunk(3, 0) : [nil, nil, nil]
        hd = e / @num_heads
        heads = ->(t, len) { t.reshape(len, n * @num_heads, hd).transpose(0, 1) } # [N*H, len, hd]
        qh = heads.(F.linear(q, w_q, b_q), l)
        kh = heads.(F.linear(k, w_k, b_k), s)
        vh = heads.(F.linear(v, w_v, b_v), s)
        unless need_weights || (@dropout.positive? && training?) # the fused op
          # causal, or one bool [L, S] mask, as the op's own (the causal
          # one, however it was built, runs as causal: its masked blocks
          # skipped); else one additive mask
          plain = key_padding_mask.nil? && (attn_mask.nil? || (attn_mask.dtype == :bool && attn_mask.ndim == 2))
          causal = plain && is_causal && attn_mask.nil?
          mask = if plain
                   attn_mask&.logical_not
                 else
                   additive_mask(attn_mask, key_padding_mask, is_causal, l, s, n, unbatched, q.dtype)
                 end
          o = F.scaled_dot_product_attention(qh.reshape(n, @num_heads, l, hd), kh.reshape(n, @num_heads, s, hd),
                                             vh.reshape(n, @num_heads, s, hd), attn_mask: mask, is_causal: causal)
          out = @out_proj.(o.reshape(n * @num_heads, l, hd).transpose(0, 1).reshape(l, n, e))
          return [unbatched ? out.squeeze(1) : (@batch_first ? out.transpose(0, 1) : out), nil]
        end

        mask = additive_mask(attn_mask, key_padding_mask, is_causal, l, s, n, unbatched, q.dtype)
        scores = qh.matmul(kh.transpose(1, 2)) * (1.0 / Math.sqrt(hd)) # [N*H, L, S]
        scores = (scores.reshape(n, @num_heads, l, s) + mask).reshape(n * @num_heads, l, s) if mask
        weights = scores.softmax(-1)
        weights = F.dropout(weights, @dropout, true) if @dropout.positive? && training?
        out = weights.matmul(vh).transpose(0, 1).reshape(l, n, e) # [L, N, E]
        out = @out_proj.(out)
        out = unbatched ? out.squeeze(1) : (@batch_first ? out.transpose(0, 1) : out)
        return [out, nil] unless need_weights

        w = weights.reshape(n, @num_heads, l, s)
        w = w.mean(1) if average_attn_weights
        w = w.squeeze(0) if unbatched
        [out, w]
      end

      def extra_inspect
        "embed_dim: #{@embed_dim}, num_heads: #{@num_heads}#{@batch_first ? ', batch_first: true' : ''}"
      end

      private

      # one float mask [N, 1 or H, L, S] (or [L, S]) adding -inf where masked, or nil
      def additive_mask(attn_mask, key_padding_mask, is_causal, l, s, n, unbatched, dtype)
        parts = []
        attn_mask = Kiln.arange(s).unsqueeze(0).gt(Kiln.arange(l).unsqueeze(1)) if is_causal && attn_mask.nil?
        if attn_mask
          m = to_additive(attn_mask, dtype)
          m = m.reshape(n, @num_heads, l, s) if m.ndim == 3 # [N*H, L, S]
          parts << m
        end
        if key_padding_mask
          kp = unbatched ? key_padding_mask.unsqueeze(0) : key_padding_mask
          unless kp.shape == [n, s]
            raise Kiln::ShapeError, "Kiln::NN::MultiheadAttention: key_padding_mask must be #{[n, s].inspect}, not #{kp.shape.inspect}"
          end

          parts << to_additive(kp, dtype).reshape(n, 1, 1, s)
        end
        parts.reduce { |a, b| a + b }
      end

      # bool (true: masked out) -> 0 / -inf; float as it is
      def to_additive(mask, dtype)
        return mask._cast(dtype) unless mask.dtype == :bool

        Kiln.zeros(mask.shape, dtype: dtype).masked_fill(mask, -Float::INFINITY)
      end
    end

    # What torch's encoder and decoder layers share: their options, the
    # feed-forward block linear2(dropout(activation(linear1(x)))), and fresh
    # copies for the stacks (TransformerEncoder / TransformerDecoder)
    module TransformerLayerParts
      # a new layer of the same configuration
      def fresh_copy
        d_model, nhead, kw = @config
        self.class.new(d_model, nhead, **kw)
      end

      private

      def init_parts(d_model, nhead, norms, dim_feedforward:, dropout:, activation:, layer_norm_eps:, batch_first:,
                     norm_first:, bias:)
        unless %w[relu gelu].include?(activation.to_s)
          raise ArgumentError, "Kiln::NN::#{self.class.name.split('::').last}: activation is :relu or :gelu, " \
                               "not #{activation.inspect}"
        end

        @config = [d_model, nhead, { dim_feedforward: dim_feedforward, dropout: dropout, activation: activation,
                                     layer_norm_eps: layer_norm_eps, batch_first: batch_first,
                                     norm_first: norm_first, bias: bias }]
        @linear1 = Linear.new(d_model, dim_feedforward, bias: bias)
        @dropout = Dropout.new(p: dropout)
        @linear2 = Linear.new(dim_feedforward, d_model, bias: bias)
        @norm_first = norm_first
        (1..norms).each do |i|
          instance_variable_set("@norm#{i}", LayerNorm.new(d_model, eps: layer_norm_eps))
          instance_variable_set("@dropout#{i}", Dropout.new(p: dropout))
        end
        @activation = activation.to_s
      end

      def attention(mha, x, mem, mask, padding, is_causal, drop)
        out, = mha.(x, mem, mem, attn_mask: mask, key_padding_mask: padding, need_weights: false, is_causal: is_causal)
        drop.(out)
      end

      def feed_forward(x, drop)
        h = @linear1.(x)
        h = @activation == "gelu" ? F.gelu(h) : h.relu
        drop.(@linear2.(@dropout.(h)))
      end
    end

    # torch.nn.TransformerEncoderLayer (d_model, nhead; dim_feedforward:,
    # dropout:, activation: :relu or :gelu, layer_norm_eps:, batch_first:,
    # norm_first:, bias:): self-attention and a feed-forward block, each
    # with a residual and a LayerNorm after it (before it with norm_first:)
    class TransformerEncoderLayer < Module
      include TransformerLayerParts
      attr_reader :self_attn, :linear1, :linear2, :norm1, :norm2

      def initialize(d_model, nhead, dim_feedforward: 2048, dropout: 0.1, activation: :relu, layer_norm_eps: 1e-5,
                     batch_first: false, norm_first: false, bias: true)
        super()
        @self_attn = MultiheadAttention.new(d_model, nhead, dropout: dropout, bias: bias, batch_first: batch_first)
        init_parts(d_model, nhead, 2, dim_feedforward: dim_feedforward, dropout: dropout, activation: activation,
                                      layer_norm_eps: layer_norm_eps, batch_first: batch_first,
                                      norm_first: norm_first, bias: bias)
      end

      def forward(src, src_mask: nil, src_key_padding_mask: nil, is_causal: false)
        sa = ->(y) { attention(@self_attn, y, y, src_mask, src_key_padding_mask, is_causal, @dropout1) }
        x = src
        if @norm_first
          x += sa.(@norm1.(x))
          x + feed_forward(@norm2.(x), @dropout2)
        else
          x = @norm1.(x + sa.(x))
          @norm2.(x + feed_forward(x, @dropout2))
        end
      end
    end

    # torch.nn.TransformerDecoderLayer (the encoder layer's options):
    # self-attention over tgt, attention from tgt to memory
    # (multihead_attn), and the feed-forward block, each with a residual
    # and a LayerNorm (norm1..norm3) after it, or before it with norm_first:
    class TransformerDecoderLayer < Module
      include TransformerLayerParts
      attr_reader :self_attn, :multihead_attn, :linear1, :linear2, :norm1, :norm2, :norm3

      def initialize(d_model, nhead, dim_feedforward: 2048, dropout: 0.1, activation: :relu, layer_norm_eps: 1e-5,
                     batch_first: false, norm_first: false, bias: true)
        super()
        @self_attn = MultiheadAttention.new(d_model, nhead, dropout: dropout, bias: bias, batch_first: batch_first)
        @multihead_attn = MultiheadAttention.new(d_model, nhead, dropout: dropout, bias: bias, batch_first: batch_first)
        init_parts(d_model, nhead, 3, dim_feedforward: dim_feedforward, dropout: dropout, activation: activation,
                                      layer_norm_eps: layer_norm_eps, batch_first: batch_first,
                                      norm_first: norm_first, bias: bias)
      end

      def forward(tgt, memory, tgt_mask: nil, memory_mask: nil, tgt_key_padding_mask: nil,
                  memory_key_padding_mask: nil, tgt_is_causal: false, memory_is_causal: false)
        sa = ->(y) { attention(@self_attn, y, y, tgt_mask, tgt_key_padding_mask, tgt_is_causal, @dropout1) }
        ca = lambda do |y|
          attention(@multihead_attn, y, memory, memory_mask, memory_key_padding_mask, memory_is_causal, @dropout2)
        end
        x = tgt
        if @norm_first
          x += sa.(@norm1.(x))
          x += ca.(@norm2.(x))
          x + feed_forward(@norm3.(x), @dropout3)
        else
          x = @norm1.(x + sa.(x))
          x = @norm2.(x + ca.(x))
          @norm3.(x + feed_forward(x, @dropout3))
        end
      end
    end

    # num_layers copies of a layer (the same initial weights, as torch's
    # deep copies), then norm (a module or nil): what TransformerEncoder and
    # TransformerDecoder share
    module TransformerStack
      attr_reader :layers, :num_layers, :norm

      private

      def init_stack(layer, num_layers, norm, layer_class)
        unless layer.is_a?(layer_class)
          raise TypeError, "Kiln::NN::#{self.class.name.split('::').last}: a #{layer_class.name.split('::').last}, " \
                           "not #{layer.class}"
        end

        state = layer.state_dict
        @layers = ModuleList.new(Array.new(num_layers) { layer.fresh_copy.tap { |c| c.load_state_dict(state) } })
        @num_layers = num_layers
        @norm = norm
      end
    end

    class TransformerEncoder < Module
      include TransformerStack

      def initialize(encoder_layer, num_layers, norm: nil)
        super()
        init_stack(encoder_layer, num_layers, norm, TransformerEncoderLayer)
      end

      def forward(src, mask: nil, src_key_padding_mask: nil, is_causal: false)
        x = src
        @layers.each { |layer| x = layer.(x, src_mask: mask, src_key_padding_mask: src_key_padding_mask, is_causal: is_causal) }
        @norm ? @norm.(x) : x
      end
    end

    class TransformerDecoder < Module
      include TransformerStack

      def initialize(decoder_layer, num_layers, norm: nil)
        super()
        init_stack(decoder_layer, num_layers, norm, TransformerDecoderLayer)
      end

      def forward(tgt, memory, tgt_mask: nil, memory_mask: nil, tgt_key_padding_mask: nil,
                  memory_key_padding_mask: nil, tgt_is_causal: false, memory_is_causal: false)
        x = tgt
        @layers.each do |layer|
          x = layer.(x, memory, tgt_mask: tgt_mask, memory_mask: memory_mask,
                                tgt_key_padding_mask: tgt_key_padding_mask,
                                memory_key_padding_mask: memory_key_padding_mask, tgt_is_causal: tgt_is_causal,
                                memory_is_causal: memory_is_causal)
        end
        @norm ? @norm.(x) : x
      end
    end

    class Transformer
      # the float mask [sz, sz] torch's Transformer generates: 0 on and
      # below the diagonal, -inf above it
      def self.generate_square_subsequent_mask(sz, dtype: :float32)
        Kiln.zeros([sz, sz], dtype: dtype).masked_fill(Kiln.arange(sz).unsqueeze(0).gt(Kiln.arange(sz).unsqueeze(1)),
                                                       -Float::INFINITY)
      end
    end
  end
end
