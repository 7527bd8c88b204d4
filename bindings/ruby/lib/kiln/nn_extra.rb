# frozen_string_literal: true

# More of torch-rb's Torch::NN: the activations, losses, normalizations,
# padding and pooling models reach for beyond the basics, each written in
# Kiln's ops (so they record, fuse and differentiate like the rest), as
# Functional functions and as modules.
module Kiln
  module NN
    module Functional
      module_function

      # --- activations ----------------------------------------------------------

      def silu(x)
        x * x.sigmoid
      end

      def leaky_relu(x, negative_slope = 0.01)
        Kiln.where(x > 0, x, x * negative_slope)
      end

      def elu(x, alpha = 1.0)
        Kiln.where(x > 0, x, x.expm1 * alpha)
      end

      def selu(x)
        elu(x, 1.6732632423543772) * 1.0507009873554805
      end

      def celu(x, alpha = 1.0)
        Kiln.where(x > 0, x, (x / alpha).expm1 * alpha)
      end

      # log(1 + exp(beta x)) / beta, the input itself past threshold
      def softplus(x, beta: 1, threshold: 20)
        bx = x * beta
        soft = (bx.clamp(max: threshold).exp.log1p) / beta
        Kiln.where(bx > threshold, x, soft)
      end

      def mish(x)
        x * softplus(x).tanh
      end

      def hardtanh(x, min_val = -1.0, max_val = 1.0)
        x.clamp(min_val, max_val)
      end

      def relu6(x)
        x.clamp(0, 6)
      end

      def hardsigmoid(x)
        (x / 6 + 0.5).clamp(0, 1)
      end

      def hardswish(x)
        x * hardsigmoid(x)
      end

      # log(sigmoid(x)) = -softplus(-x), stable for large |x|
      def logsigmoid(x)
        -softplus(-x)
      end

      def softsign(x)
        x / (x.abs + 1)
      end

      # --- losses ---------------------------------------------------------------

      def reduce_loss(name, loss, reduction)
        case reduction.to_s
        when "mean" then loss.mean
        when "sum" then loss.sum
        when "none" then loss
        else raise ArgumentError, "Kiln::NN::Functional.#{name}: reduction is mean, sum or none, not #{reduction.inspect}"
        end
      end

      def same_shapes!(name, input, target)
        return if input.shape == target.shape

        raise Kiln::ShapeError, "Kiln::NN::Functional.#{name}: input #{input.shape.inspect} and target #{target.shape.inspect} differ"
      end

      def l1_loss(input, target, reduction: "mean")
        same_shapes!("l1_loss", input, target)
        reduce_loss("l1_loss", (input - target).abs, reduction)
      end

      # 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta beyond
      def smooth_l1_loss(input, target, reduction: "mean", beta: 1.0)
        same_shapes!("smooth_l1_loss", input, target)
        d = (input - target).abs
        return reduce_loss("smooth_l1_loss", d, reduction) if beta.zero?

        reduce_loss("smooth_l1_loss", Kiln.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), reduction)
      end

      # 0.5 d^2 where |d| < delta, delta (|d| - 0.5 delta) beyond
      def huber_loss(input, target, reduction: "mean", delta: 1.0)
        same_shapes!("huber_loss", input, target)
        d = (input - target).abs
        reduce_loss("huber_loss", Kiln.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), reduction)
      end

      # -(t log p + (1 - t) log(1 - p)), each log clamped at -100 (torch's)
      def binary_cross_entropy(input, target, weight: nil, reduction: "mean")
        same_shapes!("binary_cross_entropy", input, target)
        lp = input.log.clamp(min: -100)
        lq = (-input).log1p.clamp(min: -100)
        loss = -(target * lp + (-target + 1) * lq)
        loss *= weight if weight
        reduce_loss("binary_cross_entropy", loss, reduction)
      end

      # target (log_target: log target) times (log target - input), input
      # being log-probabilities; "batchmean" divides the sum by the batch
      def kl_div(input, target, reduction: "mean", log_target: false)
        loss = if log_target
                 target.exp * (target - input)
               else
                 Kiln.where(target > 0, target * (target.clamp(min: Float::MIN).log - input), 0.0)
               end
        return loss.sum / input.shape[0] if reduction.to_s == "batchmean"

        reduce_loss("kl_div", loss, reduction)
      end

      # --- normalizations and similarities ---------------------------------------

      # x / max(||x||_p, eps) along dim
      def normalize(input, p: 2.0, dim: 1, eps: 1e-12)
        input / input.norm(p, dim: dim, keepdim: true).clamp(min: eps)
      end

      def cosine_similarity(x1, x2, dim: 1, eps: 1e-8)
        n1 = x1.norm(2, dim: dim, keepdim: true).clamp(min: eps)
        n2 = x2.norm(2, dim: dim, keepdim: true).clamp(min: eps)
        ((x1 / n1) * (x2 / n2)).sum(dim: dim)
      end

      def pairwise_distance(x1, x2, p: 2.0, eps: 1e-6, keepdim: false)
        (x1 - x2 + eps).norm(p, dim: -1, keepdim: keepdim)
      end

      # normalizes each of num_groups channel groups of [N, C, *] over its
      # channels and positions, then weight and bias per channel
      def group_norm(input, num_groups, weight: nil, bias: nil, eps: 1e-5)
        n, c = input.shape
        unless input.ndim >= 2 && (c % num_groups).zero?
          raise Kiln::ShapeError, "Kiln::NN::Functional.group_norm: #{c.inspect} channels of #{input.shape.inspect} do not split into #{num_groups} groups"
        end

        g = input.reshape(n, num_groups, -1)
        mean = g.mean(dim: -1, keepdim: true)
        var = ((g - mean)**2).mean(dim: -1, keepdim: true)
        y = ((g - mean) / (var + eps).sqrt).reshape(input.shape)
        per_channel = [1, c] + [1] * (input.ndim - 2)
        y *= weight.reshape(per_channel) if weight
        y += bias.reshape(per_channel) if bias
        y
      end

      # --- padding and pooling ----------------------------------------------------

      # constant padding: pad lists (before, after) pairs from the last dim
      # backwards, as torch's F.pad; negative amounts crop
      def pad(input, pad, mode: "constant", value: 0)
        raise ArgumentError, "Kiln::NN::Functional.pad: only mode: \"constant\", not #{mode.inspect}" unless mode.to_s == "constant"
        raise ArgumentError, "Kiln::NN::Functional.pad: pad needs pairs, got #{pad.inspect}" if pad.size.odd? || pad.size / 2 > input.ndim

        pad.each_slice(2).with_index.reduce(input) do |t, ((before, after), i)|
          d = t.ndim - 1 - i
          t = t.narrow(d, -before, t.size(d) + before) if before.negative?
          t = t.narrow(d, 0, t.size(d) + after) if after.negative?
          parts = []
          parts << Kiln.full(t.shape.dup.tap { |s| s[d] = before }, value, dtype: t.dtype, device: t.device) if before.positive?
          parts << t
          parts << Kiln.full(t.shape.dup.tap { |s| s[d] = after }, value, dtype: t.dtype, device: t.device) if after.positive?
          parts.size == 1 ? t : Kiln.cat(parts, d)
        end
      end

      # the mean over torch's adaptive windows of [N, C, H, W]: output cell
      # (i, j) averages rows floor(i H / oh) ... ceil((i + 1) H / oh) - 1 and
      # the same in columns
      def adaptive_avg_pool2d(input, output_size)
        oh, ow = output_size.is_a?(Integer) ? [output_size, output_size] : output_size
        raise Kiln::ShapeError, "Kiln::NN::Functional.adaptive_avg_pool2d: 4-d input expected, got #{input.shape.inspect}" unless input.ndim == 4

        h, w = input.shape[2..]
        oh ||= h
        ow ||= w
        return input.mean(dim: [2, 3], keepdim: true) if oh == 1 && ow == 1
        return avg_pool2d(input, [h / oh, w / ow]) if (h % oh).zero? && (w % ow).zero?

        rows = Array.new(oh) do |i|
          r0 = i * h / oh
          r1 = ((i + 1) * h + oh - 1) / oh
          cols = Array.new(ow) do |j|
            c0 = j * w / ow
            c1 = ((j + 1) * w + ow - 1) / ow
            input.narrow(2, r0, r1 - r0).narrow(3, c0, c1 - c0).mean(dim: [2, 3], keepdim: true)
          end
          Kiln.cat(cols, 3)
        end
        Kiln.cat(rows, 2)
      end
    end

    # --- modules over those functions --------------------------------------------

    # a module whose forward is F.<function>(x, *options)
    class FunctionModule < Module
      def initialize(*options)
        super()
        @options = options
      end

      def forward(x)
        F.public_send(self.class::FUNCTION, x, *@options)
      end
    end

    {
      SiLU: :silu, Mish: :mish, SELU: :selu, ReLU6: :relu6, Hardsigmoid: :hardsigmoid,
      Hardswish: :hardswish, LogSigmoid: :logsigmoid, Softsign: :softsign
    }.each { |name, fn| const_set(name, Class.new(FunctionModule) { const_set(:FUNCTION, fn) }) }

    # a FunctionModule whose options may also be given by name (torch's
    # LeakyReLU(0.2) or LeakyReLU(negative_slope: 0.2)); an unknown name
    # is an error
    class NamedOptionsModule < FunctionModule
      def initialize(*args, **kw)
        names = self.class::OPTIONS.keys
        unknown = kw.keys - names
        raise ArgumentError, "#{self.class.name}: unknown keyword #{unknown.first} (options: #{names.join(', ')})" unless unknown.empty?
        raise ArgumentError, "#{self.class.name}: #{args.size} options given, at most #{names.size}" if args.size > names.size

        super(*self.class::OPTIONS.each_with_index.map { |(name, default), i| kw.fetch(name, args.fetch(i, default)) })
      end
    end

    class LeakyReLU < NamedOptionsModule
      FUNCTION = :leaky_relu
      OPTIONS = { negative_slope: 0.01 }.freeze
    end

    class ELU < NamedOptionsModule
      FUNCTION = :elu
      OPTIONS = { alpha: 1.0 }.freeze
    end

    class CELU < ELU
      FUNCTION = :celu
    end

    class Hardtanh < NamedOptionsModule
      FUNCTION = :hardtanh
      OPTIONS = { min_val: -1.0, max_val: 1.0 }.freeze
    end

    class Softplus < Module
      def initialize(beta: 1, threshold: 20)
        super()
        @beta = beta
        @threshold = threshold
      end

      def forward(x)
        F.softplus(x, beta: @beta, threshold: @threshold)
      end
    end

    # a loss module: forward is F.<function>(input, target, **options)
    class OptionLoss < Module
      def initialize(**options)
        super()
        @options = options
      end

      def forward(input, target)
        F.public_send(self.class::FUNCTION, input, target, **@options)
      end
    end

    {
      L1Loss: :l1_loss, SmoothL1Loss: :smooth_l1_loss, HuberLoss: :huber_loss,
      BCELoss: :binary_cross_entropy, KLDivLoss: :kl_div
    }.each { |name, fn| const_set(name, Class.new(OptionLoss) { const_set(:FUNCTION, fn) }) }

    class CosineSimilarity < Module
      def initialize(dim: 1, eps: 1e-8)
        super()
        @dim = dim
        @eps = eps
      end

      def forward(x1, x2)
        F.cosine_similarity(x1, x2, dim: @dim, eps: @eps)
      end
    end

    # batch norm of [N, C] or [N, C, L] input over axis 1 (BatchNorm2d's
    # statistics and running averages)
    class BatchNorm1d < BatchNorm2d
      def forward(x)
        raise Kiln::ShapeError, "Kiln::NN::BatchNorm1d: expected [N, C] or [N, C, L] input, got #{x.shape.inspect}" unless [2, 3].include?(x.dim)

        F.batch_norm(x, @running_mean, @running_var, weight: @weight, bias: @bias,
                                                      training: training? || @running_mean.nil?,
                                                      momentum: @momentum, eps: @eps)
      end
    end

    class GroupNorm < Module
      attr_reader :weight, :bias

      def initialize(num_groups, num_channels, eps: 1e-5, affine: true)
        super()
        raise ArgumentError, "Kiln::NN::GroupNorm: #{num_channels} channels do not split into #{num_groups} groups" unless (num_channels % num_groups).zero?

        @num_groups = num_groups
        @eps = eps
        return unless affine

        @weight = constant_parameter([num_channels], 1.0)
        @bias = constant_parameter([num_channels], 0.0)
      end

      def forward(x)
        F.group_norm(x, @num_groups, weight: @weight, bias: @bias, eps: @eps)
      end
    end

    class AdaptiveAvgPool2d < Module
      def initialize(output_size)
        super()
        @output_size = output_size
      end

      def forward(x)
        F.adaptive_avg_pool2d(x, @output_size)
      end
    end

    # constant padding of the last dims (torch's ZeroPad2d / ConstantPad*d)
    class ConstantPad < Module
      def initialize(padding, value = 0.0)
        super()
        @padding = padding.is_a?(Integer) ? [padding] * self.class::SIDES : padding
        @value = value
      end

      def forward(x)
        F.pad(x, @padding, value: @value)
      end
    end

    { ConstantPad1d: 2, ConstantPad2d: 4, ConstantPad3d: 6 }.each do |name, sides|
      const_set(name, Class.new(ConstantPad) { const_set(:SIDES, sides) })
    end

    class ZeroPad2d < ConstantPad
      SIDES = 4
      def initialize(padding)
        super(padding, 0.0)
      end
    end

    # submodules by name (torch's ModuleDict): m[:name], each, keys
    class ModuleDict < Module
      include Enumerable

      def initialize(modules = {})
        super()
        @dict = {}
        modules.each { |k, v| self[k] = v }
      end

      def children_pairs
        @dict.map { |k, v| [k, v] }
      end

      def [](key)
        @dict.fetch(key.to_s)
      end

      def []=(key, mod)
        raise TypeError, "Kiln::NN::ModuleDict: #{mod.class} is not a Kiln::NN::Module" unless mod.is_a?(Module)

        @dict[key.to_s] = mod
      end

      def each(&block)
        @dict.each(&block)
      end

      def keys
        @dict.keys
      end

      def values
        @dict.values
      end

      def key?(key)
        @dict.key?(key.to_s)
      end

      def size
        @dict.size
      end
      alias length size
    end
  end
end
