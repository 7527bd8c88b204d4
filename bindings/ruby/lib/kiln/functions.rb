# frozen_string_literal: true

# Kiln's module functions: constructors, functional ops, autodiff scopes.
# Kiln.manual_seed, Kiln.stats, Kiln.reset_stats, Kiln.sync, Kiln.jit_wait, Kiln.num_threads,
# Kiln.blas_core, Kiln.cpu_isa and Kiln.library_version are C functions.
module Kiln
  # Numo::NArray's classes by the Kiln dtype each holds as it is
  NUMO_CLASSES = { float64: "DFloat", float32: "SFloat", int64: "Int64", int32: "Int32", int16: "Int16",
                   int8: "Int8", uint8: "UInt8" }.freeze

  class << self
    extend Signature::DSL

    # Kiln.tensor([[1, 2], [3, 4]]) — Integer -> :int64, Float -> :float32,
    # true/false -> :bool (mixed: the widest); a number gives a 0-d tensor.
    # Ragged arrays raise Kiln::ShapeError.
    def tensor(data, dtype: nil, layout: nil, device: nil, requires_grad: false)
      t = if data.is_a?(Tensor)
            d = data.detach
            dtype.nil? || Kiln.dtype(dtype) == d.dtype ? d : d._cast(dtype)
          else
            _tensor(data, dtype)
          end
      made(t, layout, device, requires_grad)
    end

    # Kiln.zeros(2, 3), Kiln.zeros([2, 3]), Kiln.zeros(dtype: :int64) (0-d).
    # Every constructor takes torch-rb's options: dtype:, layout: (:strided),
    # device: (:cpu / "cpu" / :cuda / "cuda:0" / Kiln.device(...)) and
    # requires_grad:
    def zeros(size, dtype, layout, device, requires_grad)
      made(_zeros(dtype, shape_of(size)), layout, device, requires_grad)
    end
    signature "zeros(int... size=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    def ones(size, dtype, layout, device, requires_grad)
      made(_ones(dtype, shape_of(size)), layout, device, requires_grad)
    end
    signature "ones(int... size=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # torch's empty: Kiln never hands out uninitialized memory, so its
    # elements are zeros
    def empty(size, dtype, layout, device, requires_grad)
      made(_zeros(dtype, shape_of(size)), layout, device, requires_grad)
    end
    signature "empty(int... size=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # Kiln.full([2, 2], 7) — the dtype follows the value (Integer -> :int64,
    # Float -> :float32, true/false -> :bool) unless given
    def full(size, fill_value, dtype, layout, device, requires_grad)
      made(_full(fill_value, dtype || dtype_of(fill_value), shape_of(size)), layout, device, requires_grad)
    end
    signature "full(int[] size, scalar fill_value, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def zeros_like(input, dtype, layout, device, requires_grad)
      made(_zeros(dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "zeros_like(Tensor input, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def ones_like(input, dtype, layout, device, requires_grad)
      made(_ones(dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "ones_like(Tensor input, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def empty_like(input, dtype, layout, device, requires_grad)
      made(_zeros(dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "empty_like(Tensor input, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def full_like(input, fill_value, dtype, layout, device, requires_grad)
      made(_full(fill_value, dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "full_like(Tensor input, scalar fill_value, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def rand_like(input, dtype, layout, device, requires_grad)
      made(_rand(dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "rand_like(Tensor input, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    def randn_like(input, dtype, layout, device, requires_grad)
      made(_randn(dtype || input.dtype, input.shape), layout, device || input.device, requires_grad)
    end
    signature "randn_like(Tensor input, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    # uniform on [0, 1)
    def rand(size, dtype, layout, device, requires_grad)
      made(_rand(dtype, shape_of(size)), layout, device, requires_grad)
    end
    signature "rand(int... size=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # standard normal
    def randn(size, dtype, layout, device, requires_grad)
      made(_randn(dtype, shape_of(size)), layout, device, requires_grad)
    end
    signature "randn(int... size=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # arange(stop), arange(start, stop, step = 1); Integers give :int64, any Float :float32
    def arange(start, stop, step, dtype, layout, device, requires_grad)
      start, stop = 0, start if stop.nil?
      dtype ||= [start, stop, step].all?(Integer) ? :int64 : :float32
      made(_arange(start, stop, step, dtype), layout, device, requires_grad)
    end
    signature "arange(float start, float? end|stop=None, float step=1, *, dtype? dtype=None, any layout=:strided, any device=None, bool requires_grad=False)"

    # the device Symbol (:cpu or :cuda) for a name: :cpu, "cpu", :cuda,
    # "cuda", "cuda:0" (Kiln drives one GPU)
    def device(name)
      d = name.to_s
      d = "cuda" if d == "cuda:0"
      return d.to_sym if %w[cpu cuda].include?(d)

      raise ArgumentError, "Kiln.device: unknown device #{name.inspect} (:cpu, :cuda or \"cuda:0\")"
    end

    # A tensor from raw native-endian (little-endian) bytes, as
    # Numo::NArray#to_binary writes them: Kiln.from_binary(a.to_binary,
    # :float32, a.shape).  The bytes are copied once.
    def from_binary(str, dtype, shape)
      shape = [shape] if shape.is_a?(Integer)
      _from_binary(str, dtype, shape.to_a)
    end

    # torch-rb's Torch.from_numo: a tensor with a Numo::NArray's values, shape
    # and dtype (DFloat float64, SFloat float32, Int8..Int64, UInt8; Bit is
    # bool; UInt16/UInt32 widen to int32/int64, UInt64 to int64 when its values
    # fit).  The values are copied (Numo keeps its own memory: to_binary, then
    # one copy in).
    def from_numo(array)
      unless defined?(::Numo::NArray) && array.is_a?(::Numo::NArray)
        raise TypeError, "Kiln.from_numo: expected a Numo::NArray, got #{array.class}"
      end

      name = array.class.name.split("::").last
      case name
      when "Bit" then return from_numo(::Numo::UInt8.cast(array)).bool
      when "UInt16" then array = ::Numo::Int32.cast(array)
      when "UInt32" then array = ::Numo::Int64.cast(array)
      when "UInt64"
        if array.size.positive? && array.max > (2**63) - 1
          raise RangeError, "Kiln.from_numo: #{array.max} (Numo::UInt64) does not fit in int64"
        end

        array = ::Numo::Int64.cast(array)
      end
      dtype = NUMO_CLASSES.key(array.class.name.split("::").last)
      unless dtype
        raise Kiln::DTypeError, "Kiln.from_numo: #{array.class} has no Kiln dtype " \
                                "(DFloat, SFloat, Int8..Int64, UInt8..UInt64 and Bit do)"
      end

      from_binary(array.to_binary, dtype, array.shape)
    end

    # the dtype Symbol for a name (:float32, "float32", :float, :double, :long, ...)
    def dtype(name)
      _dtype(name)
    end

    # the n x n identity, or n x m (ones on the main diagonal)
    def eye(n, m, dtype, layout, device, requires_grad)
      t = _eye(m.nil? ? n : [n, m].max, dtype)
      t = t[0...n, 0...m].contiguous if m && m != n
      made(t, layout, device, requires_grad)
    end
    signature "eye(int n, int? m=None, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # steps values from start to stop, both included
    def linspace(start, stop, steps, dtype, layout, device, requires_grad)
      made(_linspace(start, stop, steps, dtype), layout, device, requires_grad)
    end
    signature "linspace(float start, float end|stop, int steps, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # steps values from base**start to base**end, both included (geometric)
    def logspace(start, stop, steps, base, dtype, layout, device, requires_grad)
      exps = _linspace(start, stop, steps, :float64)
      made((_full(base.to_f, :float64, [steps])**exps)._cast(dtype), layout, device, requires_grad)
    end
    signature "logspace(float start, float end|stop, int steps, float base=10.0, *, dtype dtype=:float32, any layout=:strided, any device=None, bool requires_grad=False)"

    # Kiln.randint(10, [2, 3]) or Kiln.randint(5, 10, [2, 3]): uniform on [low, high)
    def randint(low, high = nil, size = nil, dtype: :int64)
      low, high, size = 0, low, high if size.nil?
      raise ArgumentError, "Kiln.randint: give the size (an Array or Integer)" if size.nil?

      _randint(low, high, dtype, size.is_a?(Integer) ? [size] : size.to_a)
    end

    # a random permutation of 0...n (:int64)
    def randperm(n)
      _randperm(n)
    end

    # Saves a Tensor, a Hash of name => Tensor (a state_dict), or an Array
    # of Tensors (named "0", "1", ...) in the safetensors format, readable by
    # PyTorch, numpy and JAX tools and by kiln_load.  Whatever is pending is
    # evaluated first.
    def save(obj, path)
      names, tensors = case obj
                       when Tensor then [["tensor"], [obj]]
                       when Hash then [obj.keys.map(&:to_s), obj.values]
                       when Array then [obj.each_index.map(&:to_s), obj]
                       else
                         raise TypeError, "Kiln.save: a Tensor, a Hash of name => Tensor or an Array " \
                                          "of Tensors, not #{obj.class}"
                       end
      tensors.each_with_index do |t, i|
        next if t.is_a?(Tensor)

        raise TypeError, "Kiln.save: #{names[i].inspect} is a #{t.class}, not a Kiln::Tensor"
      end
      _save(path.to_s, names, tensors.map(&:detach))
      nil
    end

    # Loads what Kiln.save wrote: a Tensor saved alone comes back as that
    # Tensor; a file of several tensors as a Hash of name => Tensor (file
    # order), which model.load_state_dict takes.
    def load(path)
      pairs = _load(path.to_s)
      return pairs[0][1] if pairs.size == 1 && pairs[0][0] == "tensor"

      pairs.to_h
    end

    # Records no gradients inside the block (nestable).
    def no_grad
      _no_grad_push
      begin
        yield
      ensure
        _no_grad_pop
      end
    end

    # Records gradients again inside the block, within no_grad
    # (torch.enable_grad); Kiln.grad_enabled? says which mode is on.
    def enable_grad
      saved = _enable_grad_push
      begin
        yield
      ensure
        _enable_grad_pop(saved)
      end
    end

    # cond ? a : b elementwise; a and b may be Ruby numbers, cond a bool
    # Tensor or a nested Array of true/false
    def where(cond, a, b)
      unless cond.is_a?(Tensor) || cond.is_a?(Array) || cond == true || cond == false
        raise TypeError, "Kiln.where: cond must be a Tensor or an Array of true/false, not #{cond.inspect}"
      end
      [a, b].each do |v|
        next if v.is_a?(Tensor) || v.is_a?(Numeric) || v.is_a?(Array) || v == true || v == false

        raise TypeError, "Kiln.where: #{v.inspect} (#{v.class}) is not a Tensor, Array or number"
      end
      cond = _tensor(cond, :bool) unless cond.is_a?(Tensor)
      a = _tensor(a, nil) if a.is_a?(Array)
      b = _tensor(b, nil) if b.is_a?(Array)
      unless a.is_a?(Tensor) || b.is_a?(Tensor)
        a = _tensor(a, nil)
      end
      a = b._scalar_like(a) unless a.is_a?(Tensor)
      b = a._scalar_like(b) unless b.is_a?(Tensor)
      cond._where(a, b)
    end

    # Kiln.cat(list, 0), Kiln.cat(list, dim: 0) or axis: (one of them)
    def cat(tensors, dim)
      _concat(tensors.to_a, dim)
    end
    signature "cat(any tensors, int dim|axis=0)"
    alias concat cat
    alias concatenate cat

    def stack(tensors, dim)
      _stack(tensors.to_a, dim)
    end
    signature "stack(any tensors, int dim|axis=0)"

    # Kiln.masked_fill(x, mask, value), Kiln.flatten(x, 1), Kiln.sum(x, dim: 1),
    # ...: torch-rb's Torch module functions, each the Tensor method of that
    # name with the tensor first (keywords and errors as the method's, the
    # errors naming Kiln.name)
    Kiln::TENSOR_FUNCTIONS = %i[
      add sub mul div pow matmul mm bmm dot maximum minimum remainder
      eq ne lt le gt ge logical_and logical_or logical_not equal
      neg abs exp log sqrt rsqrt sin cos tanh sigmoid relu gelu erf log1p expm1
      floor ceil round sign clamp clip masked_fill
      sum mean prod max min amax amin argmax argmin all any var std norm
      softmax log_softmax logsumexp cumsum sort argsort topk
      reshape flatten squeeze unsqueeze transpose permute t chunk split
      index_select gather scatter_add repeat nonzero numel one_hot
      detach clone
    ].freeze
    Kiln::TENSOR_FUNCTIONS.each { |name| tensor_function(name) }

    # mean cross-entropy of logits [N, C] against int64 class indices [N]
    # (An Array target is checked here, so a bad label names this call; a
    # Tensor target's labels are checked when the loss is evaluated, and the
    # error then names the kernel that found it, kiln_gather.)
    def cross_entropy(logits, target)
      logits.cross_entropy(target)
    end

    def mse_loss(input, target)
      input.mse_loss(target)
    end

    tensor_function :layer_norm

    # Functional gradients (kiln_grad_of): d(sum of outputs . grad_outputs) /
    # d inputs, an Array with one Tensor per input (nil where Kiln gives none;
    # an input the outputs do not use gets zeros).  Nothing accumulates into
    # .grad.  create_graph: true records the gradient computation itself.
    def grad(outputs, inputs, grad_outputs: nil, create_graph: false)
      outs = outputs.is_a?(Tensor) ? [outputs] : outputs.to_a
      ins = inputs.is_a?(Tensor) ? [inputs] : inputs.to_a
      gouts = grad_outputs.is_a?(Tensor) ? [grad_outputs] : grad_outputs&.to_a
      _grad_of(outs, gouts, ins, create_graph ? true : false)
    end

    private

    # a constructor's result with torch-rb's options applied
    def made(t, layout, device, requires_grad)
      unless layout.nil? || layout.to_s == "strided"
        raise ArgumentError, "Kiln: layout #{layout.inspect} is not supported (Kiln's tensors are dense: :strided)"
      end

      t = t._to_device(device(device)) unless device.nil? || device(device) == t.device
      t.requires_grad = true if requires_grad
      t
    end

    def with_grad(t, on)
      t.requires_grad = true if on
      t
    end

    def shape_of(size)
      size.nil? ? [] : Array(size)
    end

    def dtype_of(value)
      case value
      when Integer then :int64
      when true, false then :bool
      else :float32
      end
    end
  end
end
