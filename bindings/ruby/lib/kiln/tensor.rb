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
    DTYPES = %i[bool int32 int64 float32 float64].freeze

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

    # true when other is a Tensor of the same shape with equal elements
    def ==(other)
      return true if equal?(other)
      return false unless other.is_a?(Tensor) && shape == other.shape

      eq(other).all?
    end

    alias size numel

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

    def to(dtype)
      _cast(dtype)
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

    def floating_point?
      dtype == :float32 || dtype == :float64
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

    # `x.grad = nil` drops the gradient (the same as zero_grad!)
    def grad=(value)
      raise ArgumentError, "only nil can be assigned to grad (use zero_grad!)" unless value.nil?

      zero_grad!
    end

    # --- elementwise with keywords ------------------------------------------------

    def clamp(lo = nil, hi = nil, min: nil, max: nil)
      lo = min if lo.nil?
      hi = max if hi.nil?
      raise ArgumentError, "clamp needs min, max or both" if lo.nil? && hi.nil?

      _clamp(lo.nil? ? -Float::INFINITY : lo, hi.nil? ? Float::INFINITY : hi)
    end
    alias clip clamp

    # torch's x.where(cond, other): cond ? self : other
    def where(cond, other)
      Kiln.where(cond, self, other)
    end

    # --- reductions ----------------------------------------------------------------

    # sum(dim: nil | Integer | Array, keepdim: false) — also sum(1), sum(0, 1),
    # axis:, keepdims:
    def sum(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      _sum(reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    def mean(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      _mean(reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    # the largest values (over all axes, or dim:); max(other_tensor) is maximum
    def max(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      return maximum(dims[0]) if dims.size == 1 && dims[0].is_a?(Tensor)

      _max(reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    def min(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      return minimum(dims[0]) if dims.size == 1 && dims[0].is_a?(Tensor)

      _min(reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    def prod(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      _prod(reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    # int64 indices of the largest value along dim (of the flattened tensor without dim)
    def argmax(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      arg_reduce(:_argmax, reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    def argmin(*dims, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      arg_reduce(:_argmin, reduce_axes(dims, dim, axis), keep?(keepdim, keepdims))
    end

    # 0-d bool tensors: every / some element is nonzero
    def all
      numel.zero? ? Kiln.tensor(true) : _cast(:bool)._min(nil, false)
    end

    def any
      numel.zero? ? Kiln.tensor(false) : _cast(:bool)._max(nil, false)
    end

    def all?
      all.item
    end

    def any?
      any.item
    end

    def softmax(pos = nil, dim: nil, axis: nil)
      _softmax(one_axis(pos, dim, axis, -1))
    end

    def log_softmax(pos = nil, dim: nil, axis: nil)
      _log_softmax(one_axis(pos, dim, axis, -1))
    end

    def logsumexp(pos = nil, dim: nil, axis: nil, keepdim: nil, keepdims: nil)
      _logsumexp(one_axis(pos, dim, axis, -1), keep?(keepdim, keepdims))
    end

    # over the last axis; weight and bias are optional tensors of that size
    def layer_norm(weight = nil, bias = nil, eps: 1e-5)
      _layer_norm(weight, bias, eps)
    end

    # --- shape ---------------------------------------------------------------------

    # reshape(2, 3), reshape([2, 3]); one -1 is inferred
    def reshape(*shape)
      _reshape(shape_arg(shape))
    end
    alias view reshape

    def expand(*shape)
      _expand(shape_arg(shape))
    end

    def permute(*dims)
      _permute(shape_arg(dims))
    end

    # squeeze(dim) removes that axis (which must have size 1); squeeze() removes
    # every axis of size 1
    def squeeze(dim = nil)
      return _squeeze(dim) unless dim.nil?

      _reshape(shape.reject { |s| s == 1 })
    end

    def flatten(start_dim = 0, end_dim = -1)
      return _reshape([1]) if ndim.zero?

      s = shape
      a = start_dim.negative? ? start_dim + ndim : start_dim
      b = end_dim.negative? ? end_dim + ndim : end_dim
      raise Kiln::ShapeError, "flatten: dims #{start_dim}..#{end_dim} out of range for #{ndim} dimensions" if a.negative? || b >= ndim || a > b

      _reshape(s[0...a] + [s[a..b].reduce(1, :*)] + s[(b + 1)..])
    end

    # the transpose of a 2-d tensor (a 0-d or 1-d tensor is returned as is)
    def t
      ndim < 2 ? self : transpose(0, 1)
    end

    # x[i], x[i, j], x[1..], x[..-2], x[0...3, 1], x[(0..).step(2)]: Integers drop
    # their axis, ranges (also beginless/endless, negative) keep it; views.
    # x[index_tensor] (int32/int64, 1-d) selects rows like index_select(0, index).
    def [](*index)
      raise ArgumentError, "Kiln::Tensor#[] needs an index" if index.empty?
      return index_select(0, index[0]) if index.size == 1 && index[0].is_a?(Tensor)
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
        when Range
          t = t._slice(axis, *range_bounds(ix.begin, ix.end, ix.exclude_end?, 1, size), 1)
        when Enumerator::ArithmeticSequence
          step = ix.step
          raise ArgumentError, "slice step must not be 0" if step.zero?

          t = t._slice(axis, *range_bounds(ix.begin, ix.end, ix.exclude_end?, step, size), step)
        else
          raise TypeError, "Kiln::Tensor#[]: #{ix.class} is not an index (use Integers and Ranges)"
        end
      end
      drop.reverse_each { |axis| t = t._squeeze(axis) }
      t
    end

    # Tensors are values: a "copy" is a new handle to the same value.
    def dup
      _reshape(shape)
    end
    alias clone dup

    private

    def keep?(keepdim, keepdims)
      raise ArgumentError, "give keepdim: or keepdims:, not both" if !keepdim.nil? && !keepdims.nil?

      (keepdim.nil? ? keepdims : keepdim) ? true : false
    end

    # nil (all axes), an Integer or an Array of Integers
    def reduce_axes(positional, dim, axis)
      pos = case positional.size
            when 0 then nil
            when 1 then positional[0]
            else positional
            end
      given = [pos, dim, axis].compact
      raise ArgumentError, "give the axes once (positionally, dim: or axis:)" if given.size > 1

      given.first
    end

    def one_axis(pos, dim, axis, default)
      given = [pos, dim, axis].compact
      raise ArgumentError, "give the axis once (positionally, dim: or axis:)" if given.size > 1

      given.empty? ? default : given.first
    end

    def arg_reduce(op, dim, keepdim)
      if dim.nil? # over all elements, as PyTorch does
        r = (ndim.zero? ? _reshape([1]) : _reshape([-1])).send(op, 0, false)
        return keepdim ? r._reshape([1] * ndim) : r
      end
      raise ArgumentError, "#{op.to_s.delete('_')} takes one axis" if dim.is_a?(Array) && dim.size != 1

      send(op, dim.is_a?(Array) ? dim[0] : dim, keepdim)
    end

    def shape_arg(args)
      args.size == 1 && args[0].is_a?(Array) ? args[0] : args
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
