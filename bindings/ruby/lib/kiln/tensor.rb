# frozen_string_literal: true

module Kiln
  # A Kiln tensor: an immutable value of fixed shape and dtype (in-place
  # methods ending in ! rebind this handle to a new value).  Ops record
  # lazily; to_a, item, inspect and Kiln.sync evaluate.
  #
  # The operators (+ - * / ** -@ < <= > >= & |), the elementwise math (exp,
  # log, sqrt, tanh, sigmoid, relu, gelu, ...), matmul, transpose, unsqueeze,
  # index_select, gather, cross_entropy, mse_loss, detach, grad, zero_grad!,
  # sub_scaled!, assign!, shape, dtype, ndim, numel, to_a and item are C
  # methods (ext/kiln); this file adds the keyword forms and conveniences.
  #
  # == and != compare whole tensors and return true/false (Ruby semantics:
  # same shape and equal elements, after promotion); elementwise comparison
  # is eq / ne (and <, <=, >, >= which are elementwise, as in PyTorch).
  class Tensor
    extend Signature::DSL

    DTYPES = %i[bool uint8 int8 int16 int32 int64 bfloat16 float16 float32 float64].freeze
    FLOAT_DTYPES = %i[bfloat16 float16 float32 float64].freeze

    alias _cross_entropy cross_entropy # the C method; cross_entropy below checks Array targets

    class << self
      # Kiln::Tensor.new(data, ...) is Kiln.tensor(data, ...)
      def new(data, **kwargs)
        Kiln.tensor(data, **kwargs)
      end
    end

    # --- Ruby protocol --------------------------------------------------------

    # Lets a number sit on the left of an operator: `2 * x`, `1 - x`, `0.5 < x`.
    def coerce(other)
      case other
      when Numeric, true, false then [Scalar.new(other), self]
      else raise TypeError, "#{other.class} can't be coerced into Kiln::Tensor"
      end
    end

    # PyTorch's format (from kiln_print), plus `, requires_grad: true`.
    def inspect
      text = _print
      requires_grad ? text.sub(/\)\z/, ", requires_grad: true)") : text
    end
    alias to_s inspect

    def pretty_print(q)
      q.text(inspect)
    end

    # Elementwise, as in torch-rb: `a == b` is a bool tensor (a Tensor, Array,
    # number or true/false on the right; anything else gives false, so
    # `t == nil` stays a plain false).  `!=` is `ne`.  eql? and hash are
    # identity (Object's), so tensors work as Hash keys and in Sets by object;
    # `equal(other)` is torch's whole-tensor comparison (same shape, equal
    # elements), a Ruby true/false.
    def ==(other)
      case other
      when Tensor, Numeric, Array, true, false then eq(other)
      else false
      end
    end

    def !=(other)
      case other
      when Tensor, Numeric, Array, true, false then ne(other)
      else true
      end
    end

    # torch.equal: true when other is a Tensor of the same shape with equal
    # elements (after promotion)
    def equal(other)
      return true if equal?(other)
      return false unless other.is_a?(Tensor) && shape == other.shape

      eq(other).all?
    end

    # torch-rb: size is the shape; size(dim) one extent (negative counts from the end)
    def size(dim = nil)
      s = shape
      return s if dim.nil?

      raise TypeError, "size: dim must be an Integer, not #{dim.inspect}" unless dim.is_a?(Integer)

      d = dim.negative? ? dim + s.size : dim
      raise IndexError, "size: dim #{dim} is out of range for a tensor of #{s.size} dimensions" unless d >= 0 && d < s.size

      s[d]
    end
    signature "size(int? dim=None)"

    # the number of dimensions (torch-rb's dim)
    def dim
      ndim
    end
    alias ndimension dim

    def nelement
      numel
    end

    # the first axis' extent (torch-rb's length; a 0-d tensor has none)
    def length
      raise TypeError, "Kiln::Tensor#length: a 0-d tensor has no length" if ndim.zero?

      shape[0]
    end

    def each(&block)
      return enum_for(:each) { ndim.zero? ? 0 : shape[0] } unless block
      raise TypeError, "iteration over a 0-d tensor" if ndim.zero?

      shape[0].times { |i| yield self[i] }
      self
    end
    include Enumerable

    def to_f
      v = item
      v == true || v == false ? (v ? 1.0 : 0.0) : v.to_f
    end

    def to_i
      v = item
      v == true || v == false ? (v ? 1 : 0) : v.to_i
    end

    # --- dtype ------------------------------------------------------------------

    def cast(dtype)
      _cast(dtype)
    end

    # t.to(:float64), t.to(:cuda), t.to(:cpu), t.to("cuda", :float64) —
    # devices and dtypes, as torch's Tensor#to
    DEVICES = %i[cpu cuda].freeze

    def to(*args, device: nil, dtype: nil)
      args.each do |a|
        if DEVICES.include?(a.to_s.to_sym) then device = a
        else dtype = a
        end
      end
      t = device ? _to_device(device) : self
      dtype ? t._cast(dtype) : t
    end

    def cuda
      _to_device(:cuda)
    end

    def cpu
      _to_device(:cpu)
    end

    def cuda?
      device == :cuda
    end

    def float
      _cast(:float32)
    end

    def double
      _cast(:float64)
    end

    def int
      _cast(:int32)
    end

    def long
      _cast(:int64)
    end

    def bool
      _cast(:bool)
    end

    def half
      _cast(:float16)
    end

    def bfloat16
      _cast(:bfloat16)
    end

    def byte
      _cast(:uint8)
    end

    def char
      _cast(:int8)
    end

    def short
      _cast(:int16)
    end

    def floating_point?
      FLOAT_DTYPES.include?(dtype)
    end

    # --- autodiff -----------------------------------------------------------------

    def requires_grad=(on)
      _set_requires_grad(on ? true : false)
    end

    def requires_grad!(on = true)
      _set_requires_grad(on ? true : false)
      self
    end

    # Reverse mode from this tensor; grad is required unless it has one element.
    def backward(grad = nil)
      grad = Kiln.tensor(grad, dtype: dtype) unless grad.nil? || grad.is_a?(Tensor)
      _backward(grad)
    end

    # the gradient accumulated by backward (nil before any); in-place
    # updates of it (mul!, clamp!, copy!, ...) also update the gradient the
    # optimizer reads, as torch-rb's `p.grad.mul!(scale)` expects
    def grad
      g = _grad
      g&.instance_variable_set(:@grad_of, self)
      g
    end

    # `x.grad = g` makes g's values the gradient (same dtype and shape);
    # `x.grad = nil` drops it (the same as zero_grad!)
    def grad=(value)
      _set_grad(value.nil? || value.is_a?(Tensor) ? value : Kiln.tensor(value, dtype: dtype))
    end

    # --- elementwise with keywords ------------------------------------------------

    def clamp(lo, hi)
      raise ArgumentError, "Kiln::Tensor#clamp needs min, max or both" if lo.nil? && hi.nil?

      _clamp(lo.nil? ? -Float::INFINITY : lo, hi.nil? ? Float::INFINITY : hi)
    end
    signature "clamp(float? min=None, float? max=None)"
    alias clip clamp

    # torch's x.where(condition, other): condition ? self : other
    def where(condition, other)
      Kiln.where(condition, self, other)
    end
    signature "where(any condition, any other)"

    # --- reductions ----------------------------------------------------------------

    # sum(dim: nil | Integer | Array, keepdim: false) — also sum(1), sum(0, 1),
    # sum(1, true), axis:, keepdims:; dtype: casts first (as torch)
    def sum(dim, keepdim, dtype)
      (dtype ? _cast(dtype) : self)._sum(dim, keepdim)
    end
    signature "sum(int... dim|axis=None, bool keepdim|keepdims=False, *, dtype? dtype=None)"

    def mean(dim, keepdim, dtype)
      (dtype ? _cast(dtype) : self)._mean(dim, keepdim)
    end
    signature "mean(int... dim|axis=None, bool keepdim|keepdims=False, *, dtype? dtype=None)"

    def prod(dim, keepdim, dtype)
      (dtype ? _cast(dtype) : self)._prod(dim, keepdim)
    end
    signature "prod(int... dim|axis=None, bool keepdim|keepdims=False, *, dtype? dtype=None)"

    # torch-rb: max() is a 0-d tensor; max(1) / max(dim: 1) is [values, indices]
    # (indices int64, as argmax); max(other_tensor) is maximum.  A list of
    # axes (max(dim: [0, 1])) gives the values only (torch has no such form).
    def max(*args, **kw)
      return maximum(args[0]) if kw.empty? && args.size == 1 && args[0].is_a?(Tensor)

      max_over(*args, **kw)
    end

    def min(*args, **kw)
      return minimum(args[0]) if kw.empty? && args.size == 1 && args[0].is_a?(Tensor)

      min_over(*args, **kw)
    end

    # values only, over any axes (Kiln's amax / amin)
    def amax(dim, keepdim)
      _max(dim, keepdim)
    end
    signature "amax(int... dim|axis=None, bool keepdim|keepdims=False)"

    def amin(dim, keepdim)
      _min(dim, keepdim)
    end
    signature "amin(int... dim|axis=None, bool keepdim|keepdims=False)"

    # int64 indices of the largest value along dim (of the flattened tensor without dim)
    def argmax(dim, keepdim)
      arg_reduce(:_argmax, dim, keepdim)
    end
    signature "argmax(int... dim|axis=None, bool keepdim|keepdims=False)"

    def argmin(dim, keepdim)
      arg_reduce(:_argmin, dim, keepdim)
    end
    signature "argmin(int... dim|axis=None, bool keepdim|keepdims=False)"

    # bool tensors: every / some element is nonzero (0-d, or along dim)
    def all(dim, keepdim)
      return Kiln.tensor(true) if numel.zero? && dim.nil?

      _cast(:bool)._min(dim, keepdim)
    end
    signature "all(int? dim|axis=None, bool keepdim|keepdims=False)"

    def any(dim, keepdim)
      return Kiln.tensor(false) if numel.zero? && dim.nil?

      _cast(:bool)._max(dim, keepdim)
    end
    signature "any(int? dim|axis=None, bool keepdim|keepdims=False)"

    def all?
      all.item
    end

    def any?
      any.item
    end

    def softmax(dim, dtype)
      (dtype ? _cast(dtype) : self)._softmax(dim)
    end
    signature "softmax(int dim|axis=-1, *, dtype? dtype=None)"

    def log_softmax(dim, dtype)
      (dtype ? _cast(dtype) : self)._log_softmax(dim)
    end
    signature "log_softmax(int dim|axis=-1, *, dtype? dtype=None)"

    def logsumexp(dim, keepdim)
      _logsumexp(dim, keepdim)
    end
    signature "logsumexp(int dim|axis=-1, bool keepdim|keepdims=False)"

    # [values, indices] along dim (stable; NaN sorts as the largest value)
    def sort(dim, descending)
      _sort(dim, descending)
    end
    signature "sort(int dim|axis=-1, bool descending=False)"

    def argsort(dim, descending)
      _sort(dim, descending)[1]
    end
    signature "argsort(int dim|axis=-1, bool descending=False)"

    # [values, indices] of the k largest (largest: false: smallest) along dim, in order
    def topk(k, dim, largest, sorted)
      raise ArgumentError, "Kiln::Tensor#topk: sorted: false is not supported (results are always sorted)" unless sorted

      _topk(k, dim, largest)
    end
    signature "topk(int k, int dim|axis=-1, bool largest=True, bool sorted=True)"

    # variance with Bessel's correction by default (correction: 1, or
    # unbiased: false for 0), as torch-rb
    def var(dim, unbiased, keepdim, correction)
      _var(dim, moment_correction("var", unbiased, correction), keepdim)
    end
    signature "var(int... dim|axis=None, bool? unbiased=None, bool keepdim|keepdims=False, *, float? correction=None)"

    def std(dim, unbiased, keepdim, correction)
      _std(dim, moment_correction("std", unbiased, correction), keepdim)
    end
    signature "std(int... dim|axis=None, bool? unbiased=None, bool keepdim|keepdims=False, *, float? correction=None)"

    # integers and bool sum into :int64
    def cumsum(dim, dtype)
      (dtype ? _cast(dtype) : self)._cumsum(dim)
    end
    signature "cumsum(int dim|axis, *, dtype? dtype=None)"

    # class indices (:int64) -> one-hot rows; num_classes -1: the largest index + 1
    def one_hot(num_classes, dtype)
      num_classes = max.item.to_i + 1 if num_classes == -1
      _one_hot(num_classes, dtype)
    end
    signature "one_hot(int num_classes=-1, *, dtype dtype=:int64)"

    # over the last axis; weight and bias are optional tensors of that size
    def layer_norm(weight, bias, eps)
      _layer_norm(weight, bias, eps)
    end
    signature "layer_norm(Tensor? weight=None, Tensor? bias=None, *, float eps=1e-5)"

    # --- shape ---------------------------------------------------------------------

    # reshape(2, 3), reshape([2, 3]); one -1 is inferred
    def reshape(shape)
      _reshape(shape.is_a?(Integer) ? [shape] : shape)
    end
    signature "reshape(int... shape)"
    alias view reshape

    def expand(size)
      _expand(size.is_a?(Integer) ? [size] : size)
    end
    signature "expand(int... size)"

    def permute(dims)
      _permute(dims.is_a?(Integer) ? [dims] : dims)
    end
    signature "permute(int... dims)"

    # squeeze(dim) removes that axis (which must have size 1); squeeze() removes
    # every axis of size 1
    # squeeze(dim) of an axis whose size is not 1 is the tensor as it is
    # (torch's); an axis out of range is still an error
    def squeeze(dim)
      return _reshape(shape.reject { |s| s == 1 }) if dim.nil?
      return _squeeze(dim) unless dim.is_a?(Integer) && dim.between?(-[ndim, 1].max, [ndim, 1].max - 1)

      axis = dim.negative? ? dim + [ndim, 1].max : dim
      ndim.zero? || shape[axis] == 1 ? _squeeze(dim) : self
    end
    signature "squeeze(int? dim=None)"

    def flatten(start_dim, end_dim)
      return _reshape([1]) if ndim.zero?

      s = shape
      a = start_dim.negative? ? start_dim + ndim : start_dim
      b = end_dim.negative? ? end_dim + ndim : end_dim
      if a.negative? || b >= ndim || a > b
        raise Kiln::ShapeError, "Kiln::Tensor#flatten: dims #{start_dim}..#{end_dim} out of range for #{ndim} dimensions"
      end

      _reshape(s[0...a] + [s[a..b].reduce(1, :*)] + s[(b + 1)..])
    end
    signature "flatten(int start_dim=0, int end_dim=-1)"

    # the C methods that take an axis, with their keyword forms
    signature "transpose(int dim0, int dim1)"
    signature "unsqueeze(int dim)"
    signature "index_select(int dim, index index)"
    signature "gather(int dim, index index)"
    signature "scatter_add(int dim, index index, Tensor src)"

    # the transpose of a 2-d tensor (a 0-d or 1-d tensor is returned as is)
    def t
      ndim < 2 ? self : transpose(0, 1)
    end

    # this handle rebound to its transpose (torch-rb's x.t!)
    def t!
      raise FrozenError, "can't modify frozen #{self.class}: #{inspect}" if frozen?
      return self if ndim < 2

      r = transpose(0, 1)
      s = shape
      raise Kiln::ShapeError, "Kiln::Tensor#t!: a #{s} tensor's transpose has another shape: use t" unless s[0] == s[1]

      assign!(r)
    end

    # x[i], x[i, j], x[1..], x[..-2], x[0...3, 1], x[(0..).step(2)]: Integers drop
    # their axis, ranges (also beginless/endless, negative) keep it; views.
    # x[index_tensor] (int32/int64, 1-d) selects rows like index_select(0, index).
    def [](*index)
      raise ArgumentError, "Kiln::Tensor#[] needs an index" if index.empty?
      if index.size == 1 && index[0].is_a?(Tensor)
        return index[0].dtype == :bool ? masked_select_rows(index[0]) : index_select(0, index[0])
      end
      raise IndexError, "too many indices (#{index.size}) for a tensor of #{ndim} dimensions" if index.size > ndim

      t = self
      s = shape
      drop = []
      index.each_with_index do |ix, axis|
        size = s[axis]
        case ix
        when Integer
          i = ix.negative? ? ix + size : ix
          raise IndexError, "index #{ix} is out of range for dimension #{axis} of size #{size}" unless i >= 0 && i < size

          t = t._slice(axis, i, i + 1, 1)
          drop << axis
        when true # the whole axis (torch-rb's x[true, 0])
          next
        when Range
          t = t._slice(axis, *range_bounds(ix.begin, ix.end, ix.exclude_end?, 1, size), 1)
        when Enumerator::ArithmeticSequence
          step = ix.step
          raise ArgumentError, "slice step must not be 0" if step.zero?

          t = t._slice(axis, *range_bounds(ix.begin, ix.end, ix.exclude_end?, step, size), step)
        else
          raise TypeError, "Kiln::Tensor#[]: #{ix.inspect} is not an index (use Integers, Ranges and true for a whole axis)"
        end
      end
      drop.reverse_each { |axis| t = t._squeeze(axis) }
      t
    end

    # t[i, j] = v, t[0, 1..2] = tensor_or_number, t[mask] = v (a bool mask of
    # t's shape, or of its leading axes; v a number or broadcastable to t).
    # Functional underneath: the new value is computed (where / scatter_add)
    # and this handle rebound to it with assign!, as sub_scaled! does, so
    # views taken before keep the old value.
    def []=(*index, value)
      raise FrozenError, "can't modify frozen #{self.class}: #{inspect}" if frozen?
      raise ArgumentError, "Kiln::Tensor#[]= needs an index" if index.empty?

      if index.size == 1 && index[0].is_a?(Tensor) && index[0].dtype == :bool
        mask = index[0]
        mask = mask.reshape(mask.shape + [1] * (ndim - mask.ndim)) if mask.ndim < ndim
        return assign!(Kiln.where(mask, same_dtype(value), self))
      end
      repeats = index.size == 1 && index[0].is_a?(Tensor) && index[0].numel > 1
      if index.size == 1 && index[0].is_a?(Tensor)
        pos = index[0] # rows, as index_select(0, pos)
        rows = Kiln.arange(numel).reshape(shape)
        pos = rows.index_select(0, pos)
      else
        pos = Kiln.arange(numel).reshape(shape)[*index]
      end
      flat_pos = pos.reshape(-1)
      v = same_dtype(value)
      v = v.expand(pos.shape) unless v.shape == pos.shape
      work = dtype == :bool ? :int32 : dtype
      hit = Kiln.zeros(numel, dtype: :int32).scatter_add(0, flat_pos, Kiln.ones(flat_pos.numel, dtype: :int32)) > 0
      writes = v.reshape(-1)._cast(work)
      writes = Kiln.where(Tensor.last_writes(flat_pos), writes, 0) if repeats
      vals = Kiln.zeros(numel, dtype: work).scatter_add(0, flat_pos, writes)
      vals = vals._cast(dtype) if work != dtype
      assign!(Kiln.where(hit, vals, reshape(-1)).reshape(shape))
    end

    # which of the writes to positions pos (an index tensor may repeat one)
    # land: the last to each position, as torch's t[idx] = v on the CPU
    # (summing them all gave t[[0, 0]] = [1, 2] a 3)
    def self.last_writes(pos)
      sorted, order = pos.sort(0) # stable: a position's writes in order
      last = Kiln.cat([sorted[0...-1].ne(sorted[1..]), Kiln.tensor([true])], 0)
      Kiln.zeros(pos.numel, dtype: :int32).scatter_add(0, order, last._cast(:int32)) > 0
    end

    # --- in place (this handle is rebound to the new value; see assign!) --------

    # self += other * alpha
    def add!(other, alpha)
      if other.is_a?(Tensor) && other.shape == shape && other.dtype == dtype && floating_point?
        return sub_scaled!(other, -alpha)
      end

      assign!(stored_in_place("add!", alpha == 1 ? self + other : self + other * alpha))
    end
    signature "add!(value other, *, float alpha=1)"

    def sub!(other, alpha)
      add!(other, alpha: -alpha)
    end
    signature "sub!(value other, *, float alpha=1)"

    # mask (bool, broadcast to self's shape): value there, self elsewhere
    def masked_fill!(mask, value)
      assign!(masked_fill(mask, value))
    end
    signature "masked_fill!(Tensor mask, value value)"

    def mul!(other)
      assign!(stored_in_place("mul!", self * other))
    end

    def div!(other)
      assign!(stored_in_place("div!", self / other))
    end

    def zero!
      assign!(Kiln.zeros(shape, dtype: dtype))
    end

    def fill!(value)
      assign!(Kiln.full(shape, value, dtype: dtype))
    end

    # p.copy!(src): the values of src (cast to self's dtype, broadcast to its
    # shape, as torch's copy_; a ShapeError where it does not broadcast)
    def copy!(src)
      v = same_dtype(src)
      assign!(v.shape == shape ? v : v.expand(shape))
    end

    # --- arithmetic and linear algebra ----------------------------------------------

    # self + other * alpha (torch's add with alpha:; + is the C method)
    def add(other, alpha)
      alpha == 1 ? self + other : self + other * alpha
    end
    signature "add(value other, *, float alpha=1)"

    def sub(other, alpha)
      alpha == 1 ? self - other : self - other * alpha
    end
    signature "sub(value other, *, float alpha=1)"

    # mask (a bool Tensor broadcastable to self): value there, self
    # elsewhere; value a number or a 0-d Tensor, in self's dtype
    def masked_fill(mask, value)
      unless mask.dtype == :bool
        raise Kiln::DTypeError, "Kiln::Tensor#masked_fill: mask must be a :bool tensor, not #{mask.dtype}"
      end
      if value.is_a?(Tensor) && value.ndim != 0
        raise Kiln::ShapeError, "Kiln::Tensor#masked_fill: value must be a number or a 0-d tensor, not shape #{value.shape}"
      end

      # a number is a fill on self's device, in self's dtype (so a -inf
      # fill of attention scores is recognized as attention's mask); an
      # integer past 2**53 goes through Kiln.tensor, which keeps it exact
      # (and raises RangeError past int64)
      fill = if value.is_a?(Tensor) then value
             elsif value.is_a?(Integer) && value.abs > 2**53 then Kiln.tensor(value).to(device)
             else _scalar_like(value)
             end
      Kiln.where(mask, same_dtype(fill), self)
    end
    signature "masked_fill(Tensor mask, value value)"

    # the vector p-norm over dim (all elements by default): p 2 / "fro"
    # (the default), 1, any positive number, Float::INFINITY (largest
    # magnitude), -Float::INFINITY (smallest) or 0 (the count of nonzeros)
    def norm(p, dim, keepdim, dtype)
      x = dtype ? _cast(dtype) : self
      unless x.floating_point?
        raise Kiln::DTypeError, "Kiln::Tensor#norm: a floating-point tensor is needed, not #{x.dtype} (give dtype: :float32)"
      end

      p = 2 if p.to_s == "fro"
      unless p.is_a?(Numeric)
        raise ArgumentError, "Kiln::Tensor#norm: p must be a number, \"fro\" or Float::INFINITY, not #{p.inspect}"
      end

      a = x.abs
      if p == Float::INFINITY then a._max(dim, keepdim)
      elsif p == -Float::INFINITY then a._min(dim, keepdim)
      elsif p.zero? then a.ne(0)._cast(x.dtype)._sum(dim, keepdim)
      elsif p == 1 then a._sum(dim, keepdim)
      elsif p == 2 then Tensor.root_of_squares((x * x)._sum(dim, keepdim))
      else (a**p)._sum(dim, keepdim)**(1.0 / p)
      end
    end
    signature "norm(any p=\"fro\", int... dim|axis=None, bool keepdim|keepdims=False, *, dtype? dtype=None)"

    # sqrt(s) of a sum of squares s, whose gradient at s = 0 is 0 (torch's
    # norm), not 0 * inf = NaN: one zero row (padding) poisoned a whole
    # step through norm, F.normalize and F.cosine_similarity.  The same
    # values: sqrt(0) is 0.
    def self.root_of_squares(s)
      return s.sqrt unless s.requires_grad

      zero = s.eq(0)
      Kiln.where(zero, 0.0, Kiln.where(zero, 1.0, s).sqrt)
    end

    # torch's repeat: tiles self sizes[i] times along each axis (sizes may
    # have more entries than self has axes: leading axes of 1 are added)
    def repeat(sizes)
      sizes = [sizes] if sizes.is_a?(Integer)
      if sizes.size < ndim
        raise ArgumentError, "Kiln::Tensor#repeat: #{sizes.size} sizes for a tensor of #{ndim} dimensions (give at least #{ndim})"
      end
      if sizes.any?(&:negative?)
        raise ArgumentError, "Kiln::Tensor#repeat: sizes must not be negative, got #{sizes}"
      end

      s = [1] * (sizes.size - ndim) + shape
      one = s.flat_map { |n| [1, n] }
      tiled = sizes.zip(s).flatten
      _reshape(one)._expand(tiled)._reshape(sizes.zip(s).map { |r, n| r * n })
    end
    signature "repeat(int... sizes)"

    # the indices of the nonzero elements: an :int64 tensor [n, ndim] (row
    # order), or with as_tuple: true one 1-d tensor per axis.  The count
    # depends on the values, so they are read (evaluated) here, as torch does.
    def nonzero(as_tuple)
      bytes = ne(0)._cast(:bool).to_binary
      flat = []
      i = bytes.index("\x01".b)
      while i
        flat << i
        i = bytes.index("\x01".b, i + 1)
      end
      dims = shape
      coords = Array.new(dims.size) { [] }
      flat.each do |f|
        (dims.size - 1).downto(0) do |ax|
          coords[ax] << f % dims[ax]
          f /= dims[ax]
        end
      end
      if as_tuple
        return [Kiln.tensor(flat, dtype: :int64)] if dims.empty? && flat.size.positive?
        return [Kiln.zeros(0, dtype: :int64)] if dims.empty?

        return coords.map { |c| Kiln.tensor(c, dtype: :int64) }
      end
      return Kiln.zeros(flat.size, dims.size, dtype: :int64) if dims.empty? || flat.empty?

      Kiln.tensor(coords.transpose, dtype: :int64)
    end
    signature "nonzero(*, bool as_tuple=False)"

    # Kiln's tensors are values: every one is already contiguous
    def contiguous
      self
    end

    def contiguous?
      true
    end

    # dense tensors only (torch's :strided)
    def layout
      :strided
    end

    # t.type(:float64) / t.type("float64"): the cast (torch-rb's type)
    def type(dtype)
      _cast(dtype)
    end
    signature "type(dtype dtype)"

    # the value without autograd (torch's .data); in-place updates of it
    # (sub!, add!, []=, copy!, ...) also update this tensor, as
    # `p.data.sub!(p.grad.data * lr)` expects
    def data
      d = detach
      d.instance_variable_set(:@data_of, self)
      d
    end

    alias _sub_scaled! sub_scaled!
    alias _assign! assign!

    def sub_scaled!(src, alpha)
      _sub_scaled!(src, alpha)
      @data_of&._assign!(self)
      @grad_of&._set_grad(self)
      self
    end

    def assign!(src)
      _assign!(src)
      @data_of&._assign!(self)
      @grad_of&._set_grad(self)
      self
    end

    # torch-rb's Tensor#numo: a Numo::NArray with this tensor's values (copied),
    # of the class holding its dtype (Kiln::NUMO_CLASSES; bool gives Numo::Bit,
    # bfloat16/float16 give Numo::SFloat, Numo having no 16-bit floats)
    def numo
      unless defined?(::Numo::NArray)
        raise Kiln::Error, "Tensor#numo needs numo-narray: gem install numo-narray, then require \"numo/narray\""
      end
      return _cast(:uint8).numo.ne(0) if dtype == :bool

      t = %i[bfloat16 float16].include?(dtype) ? _cast(:float32) : self
      ::Numo.const_get(Kiln::NUMO_CLASSES.fetch(t.dtype)).from_binary(t.to_binary, shape)
    end

    # nested Ruby Arrays (a 0-d tensor: its number), as torch-rb's tolist
    def tolist
      ndim.zero? ? item : to_a
    end

    # Marshal.dump(t) / Marshal.load: dtype, shape and the bytes (bit for
    # bit); requires_grad is kept, the graph and gradient are not
    def _dump(_level)
      Marshal.dump(["kiln-tensor-1", dtype, shape, to_binary, requires_grad])
    end

    def self._load(str)
      tag, dtype, shape, bytes, grad = Marshal.load(str)
      raise ArgumentError, "Kiln::Tensor._load: not a dumped Kiln::Tensor (#{tag.inspect})" unless tag == "kiln-tensor-1"

      t = Kiln._from_binary(bytes, dtype, shape)
      t.requires_grad = true if grad
      t
    end

    # torch's remainder: x - floor(x / y) * y (the sign of y); integer tensors
    # stay integer (computed in float64, exact for |x| < 2**53)
    def %(other)
      integer_divisor_not_zero!("%", other)
      other_float = other.is_a?(Float) || (other.is_a?(Tensor) && other.floating_point?)
      return _cast(other.is_a?(Tensor) ? other.dtype : :float32) % other if !floating_point? && other_float
      return self - (self / other).floor * other if floating_point?

      x = _cast(:float64)
      y = other.is_a?(Tensor) ? other._cast(:float64) : other
      (x - (x / y).floor * y)._cast(other.is_a?(Tensor) && other.dtype == :int64 ? :int64 : dtype)
    end
    alias remainder %

    # inner product of two 1-d tensors (0-d result)
    def dot(other)
      raise Kiln::ShapeError, "dot: 1-d tensors expected, got #{shape} and #{other.shape}" unless ndim == 1 && other.ndim == 1

      matmul(other)
    end
    signature "dot(Tensor tensor)"

    def mm(other)
      raise Kiln::ShapeError, "mm: 2-d tensors expected, got #{shape} and #{other.shape}" unless ndim == 2 && other.ndim == 2

      matmul(other)
    end
    signature "mm(Tensor mat2)"

    def bmm(other)
      raise Kiln::ShapeError, "bmm: 3-d tensors expected, got #{shape} and #{other.shape}" unless ndim == 3 && other.ndim == 3

      matmul(other)
    end
    signature "bmm(Tensor mat2)"

    # torch's chunk: n pieces of ceil(size / n) along dim (the last smaller; fewer
    # pieces when the size does not fill n)
    def chunk(chunks, dim)
      raise ArgumentError, "Kiln::Tensor#chunk: chunks must be positive, not #{chunks}" unless chunks.positive?

      split((size(dim) + chunks - 1) / chunks, dim).then { |parts| parts.empty? ? [self] : parts }
    end
    signature "chunk(int chunks, int dim=0)"

    # split(size, dim) pieces of that size (the last smaller); split([2, 3], dim)
    # pieces of those sizes (which must add up to the axis' size).  Views.
    def split(split_size_or_sections, dim)
      n = size(dim)
      d = dim.negative? ? dim + ndim : dim
      sizes = if split_size_or_sections.is_a?(Array)
                unless split_size_or_sections.sum == n
                  raise Kiln::ShapeError, "Kiln::Tensor#split: sections #{split_size_or_sections} do not add up to #{n}"
                end

                split_size_or_sections
              else
                step = split_size_or_sections
                raise ArgumentError, "Kiln::Tensor#split: split_size must be positive, not #{step}" unless step.positive?

                Array.new((n + step - 1) / step) { |i| [step, n - i * step].min }
              end
      start = 0
      sizes.map do |k|
        part = _slice(d, start, start + k, 1)
        start += k
        part
      end
    end
    signature "split(int[] split_size_or_sections|split_size, int dim=0)"

    # mean cross-entropy against class indices; an Array target is checked here
    # (a label out of range names Kiln.cross_entropy, not the kernel)
    def cross_entropy(target)
      if target.is_a?(Array)
        classes = ndim == 2 ? shape[1] : nil
        target.flatten.each do |label|
          raise TypeError, "Kiln.cross_entropy: label #{label.inspect} is not an Integer" unless label.is_a?(Integer)
          next if classes.nil? || (label >= 0 && label < classes)

          e = Kiln::Error.new("Kiln.cross_entropy: label #{label} is out of range for #{classes} classes")
          e.instance_variable_set(:@status, :arg)
          raise e
        end
      end
      _cross_entropy(target)
    end

    # Tensors are values: a "copy" is a new handle to the same value.
    def dup
      _reshape(shape)
    end
    alias clone dup

    private

    # value as a tensor of self's dtype (numbers become a 0-d tensor)
    # an in-place op's result in self's dtype: a float result does not go
    # into an integer or bool tensor (torch's rule; add!(1.5) truncated)
    def stored_in_place(name, result)
      if result.floating_point? && !floating_point?
        raise Kiln::DTypeError, "Kiln::Tensor##{name}: its result is #{result.dtype}, which cannot be stored in place in this #{dtype} tensor (cast it first)"
      end

      same_dtype(result)
    end

    def same_dtype(value)
      v = value.is_a?(Tensor) ? value : Kiln.tensor(value)
      v.dtype == dtype ? v : v._cast(dtype)
    end

    # t[mask]: the selected elements (mask of t's shape) or rows (mask of t's
    # leading axes), flattened.  The result's size depends on the mask's
    # values, so the mask is read (evaluated) here, as torch does.
    def masked_select_rows(mask)
      unless mask.ndim <= ndim && mask.shape == shape[0, mask.ndim]
        raise Kiln::ShapeError, "Kiln::Tensor#[]: mask of shape #{mask.shape} does not match #{shape}"
      end

      flat = mask.reshape(-1).to_a
      idx = []
      flat.each_with_index { |m, i| idx << i if m }
      rest = shape[mask.ndim..]
      reshape([flat.size] + rest).index_select(0, Kiln.tensor(idx, dtype: :int64))
    end

    def moment_correction(name, unbiased, correction)
      raise ArgumentError, "Kiln::Tensor##{name}: give unbiased: or correction:, not both" if !unbiased.nil? && !correction.nil?
      return correction unless correction.nil?

      unbiased == false ? 0 : 1
    end

    def max_over(dim, keepdim)
      return _max(dim, keepdim) if dim.nil? || dim.is_a?(Array)

      [_max(dim, keepdim), _argmax(dim, keepdim)]
    end
    signature "max_over(int... dim|axis=None, bool keepdim|keepdims=False)", label: "Kiln::Tensor#max"

    def min_over(dim, keepdim)
      return _min(dim, keepdim) if dim.nil? || dim.is_a?(Array)

      [_min(dim, keepdim), _argmin(dim, keepdim)]
    end
    signature "min_over(int... dim|axis=None, bool keepdim|keepdims=False)", label: "Kiln::Tensor#min"

    def arg_reduce(op, dim, keepdim)
      if dim.nil? # over all elements, as PyTorch does
        r = (ndim.zero? ? _reshape([1]) : _reshape([-1])).send(op, 0, false)
        return keepdim ? r._reshape([1] * ndim) : r
      end
      raise ArgumentError, "Kiln::Tensor##{op.to_s.delete('_')} takes one axis, not #{dim}" if dim.is_a?(Array) && dim.size != 1

      send(op, dim.is_a?(Array) ? dim[0] : dim, keepdim)
    end

    # [start, stop] for kiln_slice (which clamps like Python, reading a
    # negative value as counted from the end): Ruby range ends, made explicit
    def range_bounds(b, e, exclusive, step, size)
      if step.positive?
        b = 0 if b.nil?
        b += size if b.negative?
        b = 0 if b.negative?
        if e.nil?
          e = size
        else
          e += size if e.negative?
          e += 1 unless exclusive
          e = 0 if e.negative?
        end
      else
        before_first = -(size + 1) # clamps to "before index 0"
        b = size - 1 if b.nil?
        b += size if b.negative?
        b = before_first if b.negative?
        if e.nil?
          e = before_first
        else
          e += size if e.negative?
          e -= 1 unless exclusive
          e = before_first if e.negative?
        end
      end
      [b, e]
    end
  end
end

module Kiln
  # Kiln::CUDA.available? — whether a CUDA driver and device are present;
  # Kiln::CUDA.info — the device ("NVIDIA H100 ..., sm_90, ...") or why there
  # is none.  Tensors move with t.cuda / t.cpu / t.to(:cuda); KILN_DEVICE=cuda
  # makes new tensors there.
  module CUDA
    def self.info
      Kiln.device_info(:cuda)
    end
  end
end
