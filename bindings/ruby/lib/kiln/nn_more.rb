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
