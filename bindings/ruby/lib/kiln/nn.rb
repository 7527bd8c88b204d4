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
  # Parameters are float tensors with requires_grad (Kiln has no separate
  # Parameter class); a module finds its parameters and children in its
  # instance variables (Tensors that require grad, Modules, Arrays of
  # Modules), in definition order, as torch-rb does.  Buffers (tensors saved
  # in state_dict that are not trained) are declared with register_buffer.
  module NN
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

      # [[name, module]] of the direct children, in definition order
      def named_children
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
        named_children.map(&:last)
      end

      # [[qualified name, module]] for self ("") and every descendant
      def named_modules(prefix = "", seen = {}.compare_by_identity)
        return [] if seen[self]

        seen[self] = true
        out = [[prefix, self]]
        named_children.each do |name, m|
          out.concat(m.named_modules(prefix.empty? ? name : "#{prefix}.#{name}", seen))
        end
        out
      end

      def modules
        named_modules.map(&:last)
      end

      # [[name, tensor]] of every parameter, recursively, each once (a
      # parameter shared by two modules is listed under its first name)
      def named_parameters(prefix: "", recurse: true)
        seen = {}.compare_by_identity
        out = []
        mods = recurse ? named_modules(prefix) : [[prefix, self]]
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
        named_parameters(recurse: recurse).map(&:last)
      end

      # declares a tensor saved in state_dict but not trained (BatchNorm's
      # running statistics)
      def register_buffer(name, tensor)
        @_buffers ||= []
        @_buffers << name.to_s unless @_buffers.include?(name.to_s)
        instance_variable_set("@#{name}", tensor)
      end

      def named_buffers
        named_modules.flat_map do |mprefix, m|
          (m.instance_variable_get(:@_buffers) || []).map do |name|
            [mprefix.empty? ? name : "#{mprefix}.#{name}", m.instance_variable_get("@#{name}")]
          end
        end
      end

      def buffers
        named_buffers.map(&:last)
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

      # drops every parameter's gradient (torch's set_to_none)
      def zero_grad
        parameters.each(&:zero_grad!)
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
        targets = named_parameters + named_buffers
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
        kids = named_children
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
      def initialize(dim: -1)
        super()
        @dim = dim
      end

      def forward(x)
        x.softmax(@dim)
      end
    end

    class LogSoftmax < Softmax
      def forward(x)
        x.log_softmax(@dim)
      end
    end

    class Flatten < Module
      def initialize(start_dim: 1, end_dim: -1)
        super()
        @start_dim = start_dim
        @end_dim = end_dim
      end

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

      def named_children
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

    # mean cross-entropy of logits [N, C] against int64 class indices [N]
    class CrossEntropyLoss < Module
      def initialize(reduction: "mean")
        super()
        raise ArgumentError, "Kiln::NN::CrossEntropyLoss: only reduction: \"mean\"" unless reduction.to_s == "mean"
      end

      def forward(input, target)
        F.cross_entropy(input, target)
      end
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

      def gelu(x, approximate: "none")
        raise ArgumentError, "gelu: only approximate: \"none\"" unless approximate.to_s == "none"

        x.gelu
      end

      def sigmoid(x)
        x.sigmoid
      end

      def tanh(x)
        x.tanh
      end

      def softmax(x, dim: -1)
        x.softmax(dim)
      end

      def log_softmax(x, dim: -1)
        x.log_softmax(dim)
      end

      def linear(x, weight, bias = nil)
        y = x.matmul(weight.t)
        bias.nil? ? y : y + bias
      end

      def cross_entropy(input, target, reduction: "mean")
        raise ArgumentError, "cross_entropy: only reduction: \"mean\"" unless reduction.to_s == "mean"

        input.cross_entropy(target)
      end

      def mse_loss(input, target, reduction: "mean")
        case reduction.to_s
        when "mean" then input.mse_loss(target)
        when "sum" then ((input - target)**2).sum
        when "none" then (input - target)**2
        else raise ArgumentError, "mse_loss: reduction is mean, sum or none"
        end
      end

      # normalized_shape: the last axis' size (Kiln normalizes one trailing axis)
      def layer_norm(x, normalized_shape, weight: nil, bias: nil, eps: 1e-5)
        shape = Array(normalized_shape)
        unless shape.size == 1 && shape[0] == x.shape[-1]
          raise Kiln::ShapeError, "layer_norm: normalized_shape #{normalized_shape.inspect} must be the last axis (#{x.shape[-1]})"
        end

        x.layer_norm(weight, bias, eps: eps)
      end
    end
    F = Functional
  end
end
