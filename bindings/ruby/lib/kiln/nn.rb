# frozen_string_literal: true

module Kiln
  # Neural-network modules in the shape of torch-rb's Torch::NN.
  #
  #   class Net < Kiln::NN::Module
  #     def initialize
  #       super()
  #       @fc1 = Kiln::NN::Linear.new(64, 64)
  #       @fc2 = Kiln::NN::Linear.new(64, 10)
  #     end
  #
  #     def forward(x)
  #       @fc2.call(Kiln::NN::F.relu(@fc1.call(x)))
  #     end
  #   end
  #
  # Parameters are float tensors with requires_grad (Kiln::NN::Parameter.new
  # makes one); a module finds its parameters and children in its
  # instance variables (Tensors that require grad, Modules, Arrays of
  # Modules), in definition order, as torch-rb does.  Buffers (tensors saved
  # in state_dict that are not trained) are declared with register_buffer.
  module NN
    # torch-rb's Parameter.new(data, requires_grad: true): data (a Tensor, or
    # anything Kiln.tensor takes) as a leaf tensor that requires grad, which
    # a Module finds among its instance variables.  A Kiln::Tensor (Kiln has
    # no Parameter class of its own), detached from data's graph.
    module Parameter
      def self.new(data = nil, requires_grad: true)
        t = data.nil? ? Kiln.empty(0) : (data.is_a?(Tensor) ? data : Kiln.tensor(data))
        t = t.detach
        t.requires_grad = requires_grad
        t
      end
    end

    class Module
      def initialize
        @training = true
      end

      # model.call(x) (or model.(x)) runs forward
      def call(*args, **kwargs, &block)
        forward(*args, **kwargs, &block)
      end

      def forward(*)
        raise NotImplementedError, "#{self.class} must define forward"
      end

      # {name => module} of the direct children, in definition order (a
      # Hash, as torch-rb's; each pair also as |name, m| in each/map)
      def named_children
        children_pairs.to_h
      end

      def children_pairs
        out = []
        instance_variables.each do |iv|
          v = instance_variable_get(iv)
          name = iv.to_s.delete_prefix("@")
          case v
          when Module then out << [name, v]
          when Array
            v.each_with_index { |m, i| out << ["#{name}.#{i}", m] if m.is_a?(Module) }
          end
        end
        out
      end

      def children
        children_pairs.map(&:last)
      end

      # {qualified name => module} for self ("") and every descendant
      def named_modules(prefix = "")
        module_pairs(prefix).to_h
      end

      def module_pairs(prefix = "", seen = {}.compare_by_identity)
        return [] if seen[self]

        seen[self] = true
        out = [[prefix, self]]
        children_pairs.each do |name, m|
          out.concat(m.module_pairs(prefix.empty? ? name : "#{prefix}.#{name}", seen))
        end
        out
      end

      def modules
        module_pairs.map(&:last)
      end

      # {name => tensor} of every parameter, recursively, each once (a
      # parameter shared by two modules is listed under its first name)
      def named_parameters(prefix: "", recurse: true)
        parameter_pairs(prefix: prefix, recurse: recurse).to_h
      end

      def parameter_pairs(prefix: "", recurse: true)
        seen = {}.compare_by_identity
        out = []
        mods = recurse ? module_pairs(prefix) : [[prefix, self]]
        mods.each do |mprefix, m|
          m.send(:own_parameters).each do |name, t|
            next if seen[t]

            seen[t] = true
            out << [mprefix.empty? ? name : "#{mprefix}.#{name}", t]
          end
        end
        out
      end

      def parameters(recurse: true)
        parameter_pairs(recurse: recurse).map(&:last)
      end

      # torch-rb's register_parameter: param (a tensor, made a trainable
      # leaf if it is not one, or nil) becomes the parameter `name`
      def register_parameter(name, param)
        param = Parameter.new(param) if param && !param.requires_grad
        instance_variable_set("@#{name}", param)
        param
      end

      # torch-rb's add_module: mod (a Module, or nil) becomes the child `name`
      def add_module(name, mod)
        raise TypeError, "#{self.class.name}#add_module: #{mod.class} is not a Kiln::NN::Module" unless mod.nil? || mod.is_a?(Module)

        instance_variable_set("@#{name}", mod)
        mod
      end
      alias register_module add_module

      # declares a tensor saved in state_dict but not trained (BatchNorm's
      # running statistics)
      def register_buffer(name, tensor)
        @_buffers ||= []
        @_buffers << name.to_s unless @_buffers.include?(name.to_s)
        instance_variable_set("@#{name}", tensor)
      end

      def named_buffers
        buffer_pairs.to_h
      end

      def buffer_pairs
        module_pairs.flat_map do |mprefix, m|
          (m.instance_variable_get(:@_buffers) || []).map do |name|
            [mprefix.empty? ? name : "#{mprefix}.#{name}", m.instance_variable_get("@#{name}")]
          end
        end
      end

      def buffers
        buffer_pairs.map(&:last)
      end

      def train(mode = true)
        modules.each { |m| m.instance_variable_set(:@training, mode ? true : false) }
        self
      end

      def eval
        train(false)
      end

      def training?
        @training != false
      end

      def training
        training?
      end

      # model.to(:bfloat16), model.to(:cuda), model.to("cuda", :float64), and
      # half / bfloat16 / float / double / cuda / cpu, as torch-rb's: every
      # floating-point parameter and buffer of every submodule becomes a new
      # tensor of that dtype (integer buffers keep theirs) on that device;
      # parameters stay trainable leaves.  Build optimizers afterwards (they
      # hold the tensors they were given).  Returns self.
      def to(*args, device: nil, dtype: nil)
        args.each do |a|
          if Tensor::DEVICES.include?(a.to_s.to_sym) then device = a
          else dtype = a
          end
        end
        dtype = Kiln.dtype(dtype) if dtype
        modules.each do |m|
          m.instance_variables.each do |iv|
            v = m.instance_variable_get(iv)
            next unless v.is_a?(Tensor)

            nv = device && v.device != device.to_s.to_sym ? v.to(device: device) : v
            nv = nv.to(dtype: dtype) if dtype && v.floating_point? && nv.dtype != dtype
            next if nv.equal?(v)

            if v.requires_grad
              nv = nv.detach
              nv.requires_grad = true
            end
            m.instance_variable_set(iv, nv)
          end
        end
        self
      end

      def half
        to(dtype: :float16)
      end

      def bfloat16
        to(dtype: :bfloat16)
      end

      def float
        to(dtype: :float32)
      end

      def double
        to(dtype: :float64)
      end

      def cuda
        to(device: :cuda)
      end

      def cpu
        to(device: :cpu)
      end

      # drops every parameter's gradient (torch's set_to_none)
      def zero_grad(set_to_none: true)
        parameters.each { |p| Kiln::Optim::Optimizer.zero_grad_of(p, set_to_none) }
        self
      end

      # Hash name => tensor (parameters, then buffers): snapshots of the
      # values, detached.  Kiln's in-place updates rebind a handle, so unlike
      # torch's, a state_dict taken before training goes on keeps the values
      # it had.
      def state_dict
        h = {}
        named_parameters.each { |name, t| h[name] = t.detach }
        named_buffers.each { |name, t| h[name] = t.detach }
        h
      end

      # copies the values of state_dict's tensors (or Arrays) into the
      # parameters and buffers (in place, under no_grad).  strict: missing or
      # unexpected keys raise KeyError; a shape that differs raises
      # Kiln::ShapeError.
      def load_state_dict(state_dict, strict: true)
        given = state_dict.to_h.transform_keys(&:to_s)
        targets = parameter_pairs + buffer_pairs
        names = targets.map(&:first)
        if strict
          missing = names - given.keys
          unexpected = given.keys - names
          unless missing.empty? && unexpected.empty?
            raise KeyError, "load_state_dict: missing keys #{missing.inspect}, unexpected keys #{unexpected.inspect}"
          end
        end
        Kiln.no_grad do
          targets.each do |name, t|
            next unless given.key?(name)

            v = given[name]
            v = Kiln.tensor(v, dtype: t.dtype) unless v.is_a?(Tensor)
            unless v.shape == t.shape
              raise Kiln::ShapeError, "load_state_dict: #{name} has shape #{v.shape}, the model's #{t.shape}"
            end

            t.copy!(v)
          end
        end
        self
      end

      def inspect
        kids = children_pairs
        return "#{self.class.name}(#{extra_inspect})" if kids.empty?

        lines = kids.map { |name, m| "  (#{name}): #{m.inspect.gsub("\n", "\n  ")}" }
        "#{self.class.name}(\n#{lines.join("\n")}\n)"
      end
      alias to_s inspect

      def extra_inspect
        ""
      end

      private

      # [[name, tensor]] of this module's own parameters: instance variables
      # holding float tensors that require grad
      def own_parameters
        bufs = @_buffers || []
        instance_variables.filter_map do |iv|
          v = instance_variable_get(iv)
          name = iv.to_s.delete_prefix("@")
          [name, v] if v.is_a?(Tensor) && v.requires_grad && !bufs.include?(name)
        end
      end

      # a trainable leaf: U(-bound, bound) from Kiln's RNG (Kiln.manual_seed
      # reproduces it), computed once
      def uniform_parameter(shape, bound)
        t = ((Kiln.rand(shape) * 2 - 1) * bound).detach
        Kiln.sync
        t.requires_grad = true
        t
      end

      def constant_parameter(shape, value)
        Kiln.full(shape, value.to_f, requires_grad: true)
      end
    end

    # y = x W^T + b, W [out, in]; initialized like torch-rb:
    # U(-1/sqrt(in), 1/sqrt(in)) for W and b
    class Linear < Module
      attr_reader :in_features, :out_features, :weight, :bias

      def initialize(in_features, out_features, bias: true)
        super()
        @in_features = in_features
        @out_features = out_features
        bound = 1.0 / Math.sqrt(in_features)
        @weight = uniform_parameter([out_features, in_features], bound)
        @bias = bias ? uniform_parameter([out_features], bound) : nil
      end

      def forward(x)
        F.linear(x, @weight, @bias)
      end

      def extra_inspect
        "in_features: #{@in_features}, out_features: #{@out_features}, bias: #{!@bias.nil?}"
      end
    end

    # over the last axis (Kiln's layer_norm normalizes one trailing axis)
    class LayerNorm < Module
      attr_reader :weight, :bias

      def initialize(normalized_shape, eps: 1e-5, elementwise_affine: true)
        super()
        shape = Array(normalized_shape)
        raise ArgumentError, "Kiln::NN::LayerNorm normalizes the last axis only (got #{normalized_shape.inspect})" unless shape.size == 1

        @normalized_shape = shape
        @eps = eps
        if elementwise_affine
          @weight = constant_parameter(shape, 1.0)
          @bias = constant_parameter(shape, 0.0)
        end
      end

      def forward(x)
        x.layer_norm(@weight, @bias, eps: @eps)
      end

      def extra_inspect
        "#{@normalized_shape.inspect}, eps: #{@eps}"
      end
    end

    # 2-d convolution over NCHW input; weight [out, in/groups, kh, kw].
    # Initialized like torch-rb: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
    # weight and bias, fan_in = in/groups x kh x kw.
    class Conv2d < Module
      attr_reader :weight, :bias

      def initialize(in_channels, out_channels, kernel_size, stride: 1, padding: 0, dilation: 1,
                     groups: 1, bias: true, padding_mode: "zeros")
        super()
        raise ArgumentError, "Kiln::NN::Conv2d: only padding_mode: \"zeros\"" unless padding_mode.to_s == "zeros"
        unless (in_channels % groups).zero? && (out_channels % groups).zero?
          raise ArgumentError, "Kiln::NN::Conv2d: channels (#{in_channels}, #{out_channels}) must divide by groups (#{groups})"
        end

        @in_channels = in_channels
        @out_channels = out_channels
        @kernel_size = F.pair(kernel_size)
        @stride = F.pair(stride)
        @padding = F.pair(padding)
        @dilation = F.pair(dilation)
        @groups = groups
        fan_in = (in_channels / groups) * @kernel_size[0] * @kernel_size[1]
        bound = 1.0 / Math.sqrt(fan_in)
        @weight = uniform_parameter([out_channels, in_channels / groups] + @kernel_size, bound)
        @bias = bias ? uniform_parameter([out_channels], bound) : nil
      end

      def forward(x)
        F.conv2d(x, @weight, @bias, stride: @stride, padding: @padding, dilation: @dilation, groups: @groups)
      end

      def extra_inspect
        "#{@in_channels}, #{@out_channels}, kernel_size: #{@kernel_size.inspect}, stride: #{@stride.inspect}" \
          "#{@padding == [0, 0] ? '' : ", padding: #{@padding.inspect}"}#{@groups == 1 ? '' : ", groups: #{@groups}"}"
      end
    end

    class MaxPool2d < Module
      def initialize(kernel_size, stride: nil, padding: 0)
        super()
        @kernel_size = kernel_size
        @stride = stride
        @padding = padding
      end

      def forward(x)
        F.max_pool2d(x, @kernel_size, stride: @stride, padding: @padding)
      end

      def extra_inspect
        "kernel_size: #{@kernel_size.inspect}, stride: #{(@stride || @kernel_size).inspect}, padding: #{@padding.inspect}"
      end
    end

    # counts the padding in the average, as torch's default count_include_pad: true
    class AvgPool2d < MaxPool2d
      def forward(x)
        F.avg_pool2d(x, @kernel_size, stride: @stride, padding: @padding)
      end
    end

    # batch norm over axis 1 of NCHW input: batch statistics in training (the
    # running ones updated in place, momentum as torch's), the running ones
    # in eval.  weight 1, bias 0, running_mean 0, running_var 1 to start.
    class BatchNorm2d < Module
      attr_reader :weight, :bias, :running_mean, :running_var

      def initialize(num_features, eps: 1e-5, momentum: 0.1, affine: true, track_running_stats: true)
        super()
        @num_features = num_features
        @eps = eps
        @momentum = momentum
        if affine
          @weight = constant_parameter([num_features], 1.0)
          @bias = constant_parameter([num_features], 0.0)
        end
        return unless track_running_stats

        register_buffer(:running_mean, Kiln.zeros(num_features))
        register_buffer(:running_var, Kiln.ones(num_features))
      end

      def forward(x)
        raise Kiln::ShapeError, "Kiln::NN::BatchNorm2d: expected 4-d input [N, C, H, W], got #{x.shape.inspect}" unless x.dim == 4

        F.batch_norm(x, @running_mean, @running_var, weight: @weight, bias: @bias,
                                                      training: training? || @running_mean.nil?,
                                                      momentum: @momentum, eps: @eps)
      end

      def extra_inspect
        "#{@num_features}, eps: #{@eps}, momentum: #{@momentum}"
      end
    end

    # zeroes each element with probability p in training (scaling the rest by
    # 1/(1-p)); the identity in eval.  Kiln's RNG: Kiln.manual_seed repeats it.
    class Dropout < Module
      def initialize(p: 0.5)
        super()
        raise ArgumentError, "Kiln::NN::Dropout: p must be in [0, 1], got #{p}" unless p.is_a?(Numeric) && p >= 0 && p <= 1

        @p = p
      end

      def forward(x)
        F.dropout(x, p: @p, training: training?)
      end

      def extra_inspect
        "p: #{@p}"
      end
    end

    # a lookup table: rows of weight [num_embeddings, embedding_dim] for
    # int64 indices of any shape; weight N(0, 1) as torch-rb
    class Embedding < Module
      attr_reader :weight, :padding_idx

      # padding_idx: that row starts at zeros and gets no gradient (its
      # positions in the output are constant), as torch's
      def initialize(num_embeddings, embedding_dim, padding_idx: nil, _weight: nil)
        super()
        @num_embeddings = num_embeddings
        @embedding_dim = embedding_dim
        @padding_idx = check_padding_idx(padding_idx)
        @weight = _weight || begin
          w = Kiln.randn(num_embeddings, embedding_dim)
          w[@padding_idx] = 0 if @padding_idx
          w.detach
        end
        Kiln.sync
        @weight.requires_grad = true
      end

      # an Embedding holding embeddings [num, dim] (not trained when freeze)
      def self.from_pretrained(embeddings, freeze: true, padding_idx: nil)
        raise Kiln::ShapeError, "Kiln::NN::Embedding.from_pretrained: a 2-d tensor expected, got #{embeddings.shape.inspect}" unless embeddings.ndim == 2

        e = new(*embeddings.shape, padding_idx: padding_idx, _weight: embeddings.detach.clone)
        e.weight.requires_grad = !freeze
        e
      end

      def forward(input)
        out = F.embedding(input, @weight)
        return out unless @padding_idx && @weight.requires_grad

        # the padding positions' values without a path back to the weight
        Kiln.where(input.ne(@padding_idx).unsqueeze(-1), out, out.detach)
      end

      def extra_inspect
        "#{@num_embeddings}, #{@embedding_dim}#{@padding_idx ? ", padding_idx: #{@padding_idx}" : ''}"
      end

      private

      def check_padding_idx(idx)
        return nil if idx.nil?

        idx += @num_embeddings if idx.negative?
        raise ArgumentError, "Kiln::NN::Embedding: padding_idx #{idx} is out of range for #{@num_embeddings} embeddings" unless idx.between?(0, @num_embeddings - 1)

        idx
      end
    end

    class ReLU < Module
      def forward(x)
        x.relu
      end
    end

    # the exact (erf) form; approximate: "tanh" is not offered
    class GELU < Module
      def initialize(approximate: "none")
        super()
        raise ArgumentError, "Kiln::NN::GELU: only approximate: \"none\" (the erf form)" unless approximate.to_s == "none"
      end

      def forward(x)
        x.gelu
      end
    end

    class Tanh < Module
      def forward(x)
        x.tanh
      end
    end

    class Sigmoid < Module
      def forward(x)
        x.sigmoid
      end
    end

    class Identity < Module
      def forward(x)
        x
      end
    end

    class Softmax < Module
      extend Signature::DSL

      def initialize(dim)
        super()
        @dim = dim
      end
      signature "initialize(int dim|axis=-1)", label: "Kiln::NN::Softmax.new"

      def forward(x)
        x.softmax(@dim)
      end
    end

    # not a Softmax subclass: each class's signature wraps its own
    # initialize, and super(dim) into Softmax's wrapper dispatched back to
    # this one's (SystemStackError)
    class LogSoftmax < Module
      extend Signature::DSL

      def initialize(dim)
        super()
        @dim = dim
      end
      signature "initialize(int dim|axis=-1)", label: "Kiln::NN::LogSoftmax.new"

      def forward(x)
        x.log_softmax(@dim)
      end
    end

    class Flatten < Module
      extend Signature::DSL

      def initialize(start_dim, end_dim)
        super()
        @start_dim = start_dim
        @end_dim = end_dim
      end

      signature "initialize(int start_dim=1, int end_dim=-1)", label: "Kiln::NN::Flatten.new"

      def forward(x)
        x.flatten(@start_dim, @end_dim)
      end
    end

    # modules applied in order; children are named "0", "1", ...
    class Sequential < Module
      include Enumerable

      def initialize(*mods)
        super()
        @modules = mods.flatten
      end

      def children_pairs
        @modules.each_with_index.map { |m, i| [i.to_s, m] }
      end

      def forward(x)
        @modules.reduce(x) { |h, m| m.call(h) }
      end

      def [](i)
        @modules[i]
      end

      def <<(mod)
        @modules << mod
        self
      end
      alias append <<

      def each(&block)
        @modules.each(&block)
      end

      def size
        @modules.size
      end
      alias length size
    end

    class ModuleList < Sequential
      def forward(*)
        raise NotImplementedError, "Kiln::NN::ModuleList has no forward"
      end
    end

    # a loss whose forward is F.<function>(input, target, reduction:)
    class MeanLoss < Module
      REDUCTIONS = %w[mean].freeze

      def initialize(reduction: "mean")
        super()
        unless self.class::REDUCTIONS.include?(reduction.to_s)
          raise ArgumentError, "#{self.class.name}.new: reduction must be #{self.class::REDUCTIONS.map(&:inspect).join(", ")}, not #{reduction.inspect}"
        end

        @reduction = reduction.to_s
      end

      def forward(input, target)
        F.send(self.class::FUNCTION, input, target, reduction: @reduction)
      end
    end

    # cross-entropy of logits [N, C] against int64 class indices [N]
    class CrossEntropyLoss < MeanLoss
      FUNCTION = :cross_entropy
      REDUCTIONS = %w[mean sum none].freeze
    end

    # negative log-likelihood of log-probabilities [N, C] at class indices [N]
    class NLLLoss < MeanLoss
      FUNCTION = :nll_loss
      REDUCTIONS = %w[mean sum none].freeze
    end

    class BCEWithLogitsLoss < MeanLoss
      FUNCTION = :binary_cross_entropy_with_logits
    end

    class MSELoss < Module
      def initialize(reduction: "mean")
        super()
        @reduction = reduction.to_s
        raise ArgumentError, "Kiln::NN::MSELoss: reduction is mean, sum or none" unless %w[mean sum none].include?(@reduction)
      end

      def forward(input, target)
        F.mse_loss(input, target, reduction: @reduction)
      end
    end

    # torch-rb's Torch::NN::Functional
    module Functional
      module_function

      def relu(x)
        x.relu
      end

      def gelu(x, approximate)
        raise ArgumentError, "Kiln::NN::Functional.gelu: only approximate: \"none\"" unless approximate.to_s == "none"

        x.gelu
      end

      def sigmoid(x)
        x.sigmoid
      end

      def tanh(x)
        x.tanh
      end

      class << self
        extend Signature::DSL

        # F.softmax(x, 1), F.softmax(x, dim: 1), F.one_hot(t, 3), ...: the
        # Tensor methods, parsed as they are (errors name F's function)
        %i[softmax log_softmax one_hot].each { |name| tensor_function(name) }
      end

      def linear(x, weight, bias = nil)
        y = x.matmul(weight.t)
        bias.nil? ? y : y + bias
      end

      def cross_entropy(input, target, reduction)
        return input.cross_entropy(target) if reduction.to_s == "mean"

        reduce_per_sample(input.log_softmax(1), target, reduction, "Kiln::NN::Functional.cross_entropy")
      end

      # the "sum" and "none" reductions of the negative log-likelihood of
      # log-probabilities [N, C] at class indices [N] ("mean" is one op)
      def reduce_per_sample(logp, target, reduction, label)
        unless %w[sum none].include?(reduction.to_s)
          raise ArgumentError, "#{label}: reduction must be \"mean\", \"sum\" or \"none\", not #{reduction.inspect}"
        end

        losses = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
        reduction.to_s == "sum" ? losses.sum : losses
      end

      def mse_loss(input, target, reduction)
        case reduction.to_s
        when "mean" then input.mse_loss(target)
        when "sum" then ((input - target)**2).sum
        when "none" then (input - target)**2
        else raise ArgumentError, "Kiln::NN::Functional.mse_loss: reduction is mean, sum or none, not #{reduction.inspect}"
        end
      end

      def conv2d(input, weight, bias, stride, padding, dilation, groups)
        input._conv2d(weight, bias, pair(stride), pair(padding), pair(dilation), groups)
      end

      def max_pool2d(input, kernel_size, stride, padding)
        input._max_pool2d(pair(kernel_size), stride.nil? ? nil : pair(stride), pair(padding))
      end

      def avg_pool2d(input, kernel_size, stride, padding)
        input._avg_pool2d(pair(kernel_size), stride.nil? ? nil : pair(stride), pair(padding))
      end

      # running_mean / running_var may be nil in training (batch statistics
      # only); given, they are updated in place when training
      def batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
        input._batch_norm(running_mean, running_var, weight, bias, training, momentum, eps)
      end

      def dropout(input, p, training)
        raise ArgumentError, "Kiln::NN::Functional.dropout: p must be in [0, 1], got #{p}" unless p >= 0 && p <= 1
        # every element dropped: zeros (torch's input * 0; kiln_dropout's
        # scale 1 / (1 - p) has no value at p = 1)
        return training ? input * 0.0 : input if p == 1

        input._dropout(p, training)
      end

      def embedding(input, weight)
        weight._embedding(input)
      end


      # mean negative log-likelihood of log-probabilities [N, C] at int64 class indices [N]
      def nll_loss(input, target, reduction)
        return input.nll_loss(target) if reduction.to_s == "mean"

        reduce_per_sample(input, target, reduction, "Kiln::NN::Functional.nll_loss")
      end

      def binary_cross_entropy_with_logits(input, target, reduction)
        mean_only!(reduction, "Kiln::NN::Functional.binary_cross_entropy_with_logits")
        input.binary_cross_entropy_with_logits(target)
      end

      # the losses Kiln reduces by the mean only
      def mean_only!(reduction, label)
        raise ArgumentError, "#{label}: only reduction: \"mean\", not #{reduction.inspect}" unless reduction.to_s == "mean"
      end

      # an Integer n as [n, n]; an Array of two as it is
      def pair(v)
        return [v, v] if v.is_a?(Integer)
        return v.to_a if v.respond_to?(:to_a) && v.to_a.size == 2 && v.to_a.all?(Integer)

        raise ArgumentError, "expected an Integer or two Integers, got #{v.inspect}"
      end

      # normalized_shape: the last axis' size (Kiln normalizes one trailing axis)
      def layer_norm(x, normalized_shape, weight, bias, eps)
        shape = Array(normalized_shape)
        unless shape.size == 1 && shape[0] == x.shape[-1]
          raise Kiln::ShapeError, "layer_norm: normalized_shape #{normalized_shape.inspect} must be the last axis (#{x.shape[-1]})"
        end

        x.layer_norm(weight, bias, eps: eps)
      end

      # PyTorch's signatures: each argument positionally or by name
      class << self
        extend Signature::DSL

        signature "gelu(Tensor input, *, any approximate=\"none\")"
        signature "linear(Tensor input, Tensor weight, Tensor? bias=None)"
        signature "cross_entropy(Tensor input, index target, *, any reduction=\"mean\")"
        signature "mse_loss(Tensor input, Tensor target, *, any reduction=\"mean\")"
        signature "nll_loss(Tensor input, index target, *, any reduction=\"mean\")"
        signature "binary_cross_entropy_with_logits(Tensor input, Tensor target, *, any reduction=\"mean\")"
        signature "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[] stride=1, int[] padding=0, int[] dilation=1, int groups=1)"
        signature "max_pool2d(Tensor input, int[] kernel_size, int[]? stride=None, int[] padding=0)"
        signature "avg_pool2d(Tensor input, int[] kernel_size, int[]? stride=None, int[] padding=0)"
        signature "batch_norm(Tensor input, Tensor? running_mean, Tensor? running_var, Tensor? weight=None, Tensor? bias=None, bool training=False, float momentum=0.1, float eps=1e-5)"
        signature "dropout(Tensor input, float p=0.5, bool training=True)"
        signature "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-5)"
      end
    end
    F = Functional
  end
end
