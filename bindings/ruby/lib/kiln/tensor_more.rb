# frozen_string_literal: true

# More of torch-rb's Tensor methods and Torch functions, written in Kiln's
# ops (so they record, fuse and differentiate like any other): triangles,
# the float predicates, elementwise extras, flips and rolls, views by
# example, small products and the *_mean pairs.  Kiln.name(x, ...) is each
# one as a module function.
module Kiln
  class Tensor
    # --- triangles and predicates (C: kiln_triu, kiln_tril, kiln_isnan, ...) ----

    # the upper triangle of the last two dims (j - i >= diagonal), the rest
    # 0; triu(ones, 1).bool is the causal mask, which attention reads as its
    # causal flag
    def triu(diagonal)
      _triu(diagonal)
    end
    signature "triu(int diagonal=0)"

    # the lower triangle (j - i <= diagonal), the rest 0
    def tril(diagonal)
      _tril(diagonal)
    end
    signature "tril(int diagonal=0)"

    # --- elementwise ---------------------------------------------------------------

    def square
      self * self
    end

    # 1 / x (integers divide as floats, as torch)
    def reciprocal
      Kiln.ones_like(self, dtype: floating_point? ? dtype : :float32) / self
    end

    def log2
      log * (1 / Math.log(2))
    end

    def log10
      log * (1 / Math.log(10))
    end

    def exp2
      Kiln.full_like(self, 2.0, dtype: floating_point? ? dtype : :float32)**self
    end

    def tan
      sin / cos
    end

    # toward zero; integers are already whole
    def trunc
      return clone unless floating_point?

      Kiln.where(self < 0, ceil, floor)
    end
    alias fix trunc

    # an integer tensor divided by the integer 0 has no value: torch's
    # ZeroDivisionError (it gave 2**63 - 1, and % gave 0).  A divisor tensor
    # holding a zero is not read here (that would evaluate it).
    def integer_divisor_not_zero!(name, other)
      return if floating_point? || !other.is_a?(Integer) || !other.zero?

      raise ZeroDivisionError, "Kiln::Tensor##{name}: integer division by zero"
    end
    private :integer_divisor_not_zero!

    # x - trunc(x), with x's sign
    def frac
      self - trunc
    end

    # torch's floor_divide (//): floor(x / y); integers stay integer
    # (computed in float64, exact for |x| < 2**53)
    def floor_divide(other)
      integer_divisor_not_zero!("floor_divide", other)
      other_float = other.is_a?(Float) || (other.is_a?(Tensor) && other.floating_point?)
      return (self / other).floor if floating_point? || other_float

      y = other.is_a?(Tensor) ? other._cast(:float64) : other
      (_cast(:float64) / y).floor._cast(other.is_a?(Tensor) ? Kiln.promote_types(dtype, other.dtype) : dtype)
    end

    # C's fmod: x - trunc(x / y) * y, the sign of x (remainder has y's)
    def fmod(other)
      integer_divisor_not_zero!("fmod", other)
      return self - (self / other).trunc * other if floating_point?

      x = _cast(:float64)
      y = other.is_a?(Tensor) ? other._cast(:float64) : other
      (x - (x / y).trunc * y)._cast(other.is_a?(Tensor) && other.dtype == :int64 ? :int64 : dtype)
    end

    def clamp_min(min)
      clamp(min: min)
    end

    def clamp_max(max)
      clamp(max: max)
    end

    # self + weight * (end - self)
    def lerp(end_, weight)
      self + (end_ - self) * weight
    end

    # self + value * t1 * t2; self + value * t1 / t2
    def addcmul(tensor1, tensor2, value: 1)
      self + tensor1 * tensor2 * value
    end

    def addcdiv(tensor1, tensor2, value: 1)
      self + tensor1 / tensor2 * value
    end

    def logical_xor(other)
      _cast(:bool).ne(other.is_a?(Tensor) ? other._cast(:bool) : Kiln.tensor(other ? true : false))
    end

    # |self - other| <= atol + rtol * |other|, infinities equal to themselves,
    # NaN equal to NaN with equal_nan: (torch.isclose)
    def isclose(other, rtol: 1e-05, atol: 1e-08, equal_nan: false)
      other = Kiln.full_like(self, other) unless other.is_a?(Tensor)
      close = (self - other).abs <= (other.abs * rtol + atol)
      close = close.logical_or(eq(other))
      close = close.logical_or(isnan.logical_and(other.isnan)) if equal_nan
      close
    end

    def allclose(other, rtol: 1e-05, atol: 1e-08, equal_nan: false)
      isclose(other, rtol: rtol, atol: atol, equal_nan: equal_nan).all.item
    end

    # NaN -> nan, +inf -> posinf (the dtype's largest by default), -inf -> neginf
    def nan_to_num(nan: 0.0, posinf: nil, neginf: nil)
      return clone unless floating_point?

      big = FLOAT_MAX.fetch(dtype)
      x = Kiln.where(isnan, nan, self)
      x = Kiln.where(x == Float::INFINITY, posinf.nil? ? big : posinf, x)
      Kiln.where(x == -Float::INFINITY, neginf.nil? ? -big : neginf, x)
    end

    FLOAT_MAX = { float64: Float::MAX, float32: 3.4028234663852886e38, bfloat16: 3.3895313892515355e38,
                  float16: 65_504.0 }.freeze
    private_constant :FLOAT_MAX

    # --- shape ---------------------------------------------------------------------

    # the elements in reverse order along each of dims
    def flip(dims)
      dims = [dims] if dims.is_a?(Integer)
      dims.reduce(self) do |t, d|
        d += ndim if d.negative?
        raise IndexError, "Kiln::Tensor#flip: dim #{d} is out of range for #{ndim} dimensions" unless d.between?(0, ndim - 1)

        n = t.size(d)
        n < 2 ? t : t.index_select(d, Kiln.arange(n - 1, -1, -1, dtype: :int64))
      end
    end
    signature "flip(int... dims)"

    def fliplr
      flip(1)
    end

    def flipud
      flip(0)
    end

    # the elements shifted by shifts along dims, wrapping around; without
    # dims, over the flattened tensor (torch.roll)
    def roll(shifts, dims = nil)
      shifts = [shifts] if shifts.is_a?(Integer)
      dims = [dims] if dims.is_a?(Integer)
      return flatten.roll(shifts, 0).reshape(shape) if dims.nil? || dims.empty?

      raise ArgumentError, "Kiln::Tensor#roll: #{shifts.size} shifts for #{dims.size} dims" unless shifts.size == dims.size

      shifts.zip(dims).reduce(self) do |t, (s, d)|
        n = t.size(d)
        s = n.zero? ? 0 : s % n
        s.zero? ? t : Kiln.cat([t.narrow(d, n - s, s), t.narrow(d, 0, n - s)], d)
      end
    end

    # the length elements from start along dim (a view, as slicing)
    def narrow(dim, start, length)
      d = dim.negative? ? dim + ndim : dim
      n = size(d)
      start += n if start.negative?
      unless start.between?(0, n) && length >= 0 && start + length <= n
        raise IndexError, "Kiln::Tensor#narrow: start #{start} and length #{length} do not fit in dim #{dim} of size #{n}"
      end

      _slice(d, start, start + length, 1)
    end

    # the slices along dim, each without that dim
    def unbind(dim = 0)
      d = dim.negative? ? dim + ndim : dim
      Array.new(size(d)) { |i| _slice(d, i, i + 1, 1)._squeeze(d) }
    end

    # moves dims source to destination, the others keeping their order
    def movedim(source, destination)
      src = Array(source).map { |d| d.negative? ? d + ndim : d }
      dst = Array(destination).map { |d| d.negative? ? d + ndim : d }
      raise ArgumentError, "Kiln::Tensor#movedim: #{src.size} sources for #{dst.size} destinations" unless src.size == dst.size

      order = Array.new(ndim)
      src.zip(dst).each { |s, d| order[d] = s }
      rest = (0...ndim).to_a - src
      order.map! { |o| o.nil? ? rest.shift : o }
      permute(order)
    end
    alias moveaxis movedim

    def swapaxes(dim0, dim1)
      transpose(dim0, dim1)
    end
    alias swapdims swapaxes

    def expand_as(other)
      expand(other.shape)
    end

    def broadcast_to(size)
      expand(size)
    end

    def view_as(other)
      reshape(other.shape)
    end
    alias reshape_as view_as

    def type_as(other)
      to(other.dtype)
    end

    def new_zeros(*size, dtype: nil)
      Kiln.zeros(*size, dtype: dtype || self.dtype, device: device)
    end

    def new_ones(*size, dtype: nil)
      Kiln.ones(*size, dtype: dtype || self.dtype, device: device)
    end

    def new_full(size, fill_value, dtype: nil)
      Kiln.full(size, fill_value, dtype: dtype || self.dtype, device: device)
    end

    # torch's tile: repeat with reps padded by leading 1s to ndim
    def tile(*reps)
      reps = reps.first if reps.size == 1 && reps.first.is_a?(Array)
      repeat([1] * [ndim - reps.size, 0].max + reps)
    end

    # 1-d: the square matrix with it on diagonal `diagonal`; 2-d: that
    # diagonal as a 1-d tensor (torch.diag)
    def diag(diagonal = 0)
      case ndim
      when 1
        n = size(0) + diagonal.abs
        m = Kiln.zeros(n, n, dtype: dtype, device: device)
        eye = Kiln.ones(n, n, dtype: :bool, device: device).triu(diagonal).logical_and(
          Kiln.ones(n, n, dtype: :bool, device: device).tril(diagonal)
        )
        padded = Kiln.cat([self, Kiln.zeros(diagonal.abs, dtype: dtype, device: device)], 0)
        row = diagonal >= 0 ? padded.reshape(n, 1) : padded.reshape(1, n)
        Kiln.where(eye, row.expand(n, n), m)
      when 2 then diagonal(diagonal)
      else raise Kiln::ShapeError, "Kiln::Tensor#diag: a 1-d or 2-d tensor expected, got #{ndim} dimensions"
      end
    end

    # the elements (i, i + offset) of a matrix, as a 1-d tensor
    def diagonal(offset = 0)
      raise Kiln::ShapeError, "Kiln::Tensor#diagonal: a 2-d tensor expected, got #{ndim} dimensions" unless ndim == 2

      r, c = shape
      count = offset >= 0 ? [[r, c - offset].min, 0].max : [[r + offset, c].min, 0].max
      return Kiln.zeros(0, dtype: dtype, device: device) if count.zero?

      start = offset >= 0 ? offset : -offset * c
      contiguous.reshape(r * c)._slice(0, start, start + (count - 1) * (c + 1) + 1, c + 1)
    end

    # --- products and statistics ---------------------------------------------------

    # the outer product of two 1-d tensors
    def outer(other)
      raise Kiln::ShapeError, "Kiln::Tensor#outer: 1-d tensors expected, got #{shape} and #{other.shape}" unless ndim == 1 && other.ndim == 1

      reshape(size(0), 1) * other.reshape(1, other.size(0))
    end
    alias ger outer

    def mv(vec)
      raise Kiln::ShapeError, "Kiln::Tensor#mv: a matrix and a vector expected, got #{shape} and #{vec.shape}" unless ndim == 2 && vec.ndim == 1

      matmul(vec)
    end

    # beta * self + alpha * (mat1 @ mat2); baddbmm the same over batches
    def addmm(mat1, mat2, beta: 1, alpha: 1)
      prod = mat1.mm(mat2)
      (beta == 1 ? self : self * beta) + (alpha == 1 ? prod : prod * alpha)
    end

    def baddbmm(batch1, batch2, beta: 1, alpha: 1)
      prod = batch1.bmm(batch2)
      (beta == 1 ? self : self * beta) + (alpha == 1 ? prod : prod * alpha)
    end

    # the elements where mask (broadcast to self) is true, as a 1-d tensor
    def masked_select(mask)
      shape_ = Kiln.broadcast_shapes(shape, mask.shape)
      expand(shape_)[mask.expand(shape_)]
    end

    # the indices of the nonzero elements, [n, ndim] (torch.argwhere)
    def argwhere
      nonzero
    end

    # the products of the elements so far along dim (torch.cumprod): a
    # running product, one multiply a step, exact as torch's for zeros and
    # negatives
    def cumprod(dim)
      d = dim.negative? ? dim + ndim : dim
      n = size(d)
      return clone if n <= 1

      acc = narrow(d, 0, 1)
      parts = [acc]
      (1...n).each { |i| parts << (acc = acc * narrow(d, i, 1)) }
      Kiln.cat(parts, d)
    end

    # value written at index along dim (a new tensor, torch's index_fill)
    def index_fill(dim, index, value)
      d = dim.negative? ? dim + ndim : dim
      index = Kiln.tensor(Array(index), dtype: :int64) unless index.is_a?(Tensor)
      hit = Kiln.zeros(size(d), dtype: :bool)
      hit = hit.scatter_add(0, index, Kiln.ones(index.numel, dtype: :bool)) if index.numel.positive?
      hit = hit.reshape([1] * d + [size(d)] + [1] * (ndim - d - 1))
      Kiln.where(hit, value, self)
    end

    def std_mean(*args, **kw)
      [std(*args, **kw), mean(*args.first(1), **kw.slice(:keepdim, :keepdims, :dim, :axis))]
    end

    def var_mean(*args, **kw)
      [var(*args, **kw), mean(*args.first(1), **kw.slice(:keepdim, :keepdims, :dim, :axis))]
    end

    # torch-rb's in-place forms (relu!, clamp!(min, max), pow!(2), ...): the
    # op's value rebound to this handle, as add! does (views taken before
    # keep the old value); a float result does not go into an integer tensor
    IN_PLACE = %i[relu sigmoid tanh exp expm1 log log1p log2 log10 sqrt rsqrt neg abs floor ceil round
                  trunc frac sign sin cos tan asin acos atan sinh cosh asinh acosh atanh erf reciprocal
                  square clamp clip pow fmod remainder lerp hardtanh].freeze
    IN_PLACE.each do |name|
      next if method_defined?(:"#{name}!") || !method_defined?(name)

      define_method(:"#{name}!") do |*args, **kw|
        assign!(stored_in_place("#{name}!", public_send(name, *args, **kw)))
      end
    end
  end

  class << self
    extend Signature::DSL

    # the shape shapes broadcast to (torch.broadcast_shapes)
    def broadcast_shapes(*shapes)
      n = shapes.map(&:size).max || 0
      Array.new(n) do |i|
        dims = shapes.map { |s| i < n - s.size ? 1 : s[i - (n - s.size)] }.uniq - [1]
        raise Kiln::ShapeError, "Kiln.broadcast_shapes: #{shapes.map(&:inspect).join(', ')} do not broadcast" if dims.size > 1

        dims.first || 1
      end
    end

    # coordinate grids of 1-d tensors: indexing "ij" (matrix, the default)
    # or "xy" (Cartesian: the first two swapped)
    def meshgrid(*tensors, indexing: "ij")
      tensors = tensors.first if tensors.size == 1 && tensors.first.is_a?(Array)
      raise ArgumentError, "Kiln.meshgrid: indexing is \"ij\" or \"xy\", not #{indexing.inspect}" unless %w[ij xy].include?(indexing.to_s)

      ts = tensors.dup
      ts[0], ts[1] = ts[1], ts[0] if indexing.to_s == "xy" && ts.size > 1
      shape = ts.map(&:numel)
      grids = ts.each_with_index.map do |t, i|
        t.reshape(Array.new(ts.size) { |j| j == i ? t.numel : 1 }).expand(shape)
      end
      indexing.to_s == "xy" && ts.size > 1 ? [grids[1], grids[0], *grids[2..]] : grids
    end

    # pairwise p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]
    def cdist(x1, x2, p: 2.0)
      (x1.unsqueeze(-2) - x2.unsqueeze(-3)).norm(p, dim: -1)
    end

    # torch's promote_types for two dtype names
    def promote_types(a, b)
      (Kiln.zeros(1, dtype: a) + Kiln.zeros(1, dtype: b)).dtype
    end

    Kiln::MORE_TENSOR_FUNCTIONS = %i[
      triu tril isnan isinf isfinite square reciprocal log2 log10 exp2 tan trunc fix frac
      floor_divide fmod clamp_min clamp_max lerp addcmul addcdiv logical_xor isclose allclose
      nan_to_num flip fliplr flipud roll narrow unbind movedim moveaxis swapaxes swapdims
      broadcast_to tile diag diagonal outer ger mv addmm baddbmm std_mean var_mean
      masked_select argwhere cumprod index_fill
    ].freeze
    Kiln::MORE_TENSOR_FUNCTIONS.each do |name|
      if Signature::ALL.any? { |s| s.name == name.to_s && s.label.start_with?("Kiln::Tensor#") }
        tensor_function(name)
      else
        define_method(name) { |input, *args, **kw, &blk| input.public_send(name, *args, **kw, &blk) }
      end
    end
  end
end

module Kiln
  class << self
    # torch.einsum for one or more operands written with letters (no
    # ellipsis, no letter twice in one operand): letters of one operand
    # absent from the output and from the others are summed first; each
    # pair is one batched matmul (batch letters, the left's, the right's
    # and the contracted ones), with no permute or reshape where the
    # layout already is the matmul's, so attention written with einsum is
    # still recognized as the attention op
    def einsum(equation, *operands)
      operands = operands.first if operands.size == 1 && operands.first.is_a?(Array)
      lhs, out = equation.delete(" ").split("->", -1)
      ins = lhs.split(",", -1)
      raise ArgumentError, "Kiln.einsum: #{ins.size} operand subscripts for #{operands.size} operands" unless ins.size == operands.size
      if equation.include?(".")
        raise ArgumentError, "Kiln.einsum: an ellipsis (...) is not supported; name the dims with letters"
      end

      ins.each_with_index do |s, i|
        unless s.match?(/\A[a-zA-Z]*\z/) && s.size == operands[i].ndim && s.chars.uniq.size == s.size
          raise ArgumentError, "Kiln.einsum: subscripts #{s.inspect} do not fit operand #{i} of shape #{operands[i].shape.inspect} (one letter per dim, none twice)"
        end
      end
      out ||= ins.join.chars.tally.select { |_, n| n == 1 }.keys.sort.join
      sizes = {}
      ins.zip(operands).each do |s, t|
        s.chars.zip(t.shape).each do |c, n|
          raise Kiln::ShapeError, "Kiln.einsum: #{c} is #{sizes[c]} in one operand and #{n} in another" if sizes[c] && sizes[c] != n

          sizes[c] = n
        end
      end
      raise ArgumentError, "Kiln.einsum: output letter not in the inputs in #{equation.inspect}" unless (out.chars - sizes.keys).empty?

      terms = ins.zip(operands)
      s, t = terms.shift
      s, t = einsum_sum_own(s, t, out, terms.map(&:first))
      until terms.empty?
        s2, t2 = terms.shift
        s2, t2 = einsum_sum_own(s2, t2, out, [s] + terms.map(&:first))
        keep = (out.chars + terms.flat_map { |x| x.first.chars }).uniq
        s, t = einsum_pair(s, t, s2, t2, keep, sizes)
      end
      s, t = einsum_sum_own(s, t, out, [])
      einsum_permute(s, t, out).last
    end

    private

    # t with the letters of s that neither out nor the others have summed away
    def einsum_sum_own(s, t, out, others)
      gone = s.chars.each_index.reject { |i| out.include?(s[i]) || others.any? { |o| o.include?(s[i]) } }
      return [s, t] if gone.empty?

      [s.chars.reject.with_index { |_, i| gone.include?(i) }.join, t.sum(gone)]
    end

    def einsum_permute(s, t, to)
      return [s, t] if s == to

      [to, t.permute(to.chars.map { |c| s.index(c) })]
    end

    # a (letters sa) times b (sb), contracting the letters they share that
    # keep does not hold: batch = shared and kept, left = a's own, right = b's own
    def einsum_pair(sa, a, sb, b, keep, sizes)
      shared = sa.chars & sb.chars
      batch = shared.select { |c| keep.include?(c) }
      contract = shared - batch
      left = sa.chars - shared
      right = sb.chars - shared
      _, a = einsum_permute(sa, a, (batch + left + contract).join)
      _, b = einsum_permute(sb, b, (batch + contract + right).join)
      bs = batch.map { |c| sizes[c] }
      ln = left.map { |c| sizes[c] }.reduce(1, :*)
      cn = contract.map { |c| sizes[c] }.reduce(1, :*)
      rn = right.map { |c| sizes[c] }.reduce(1, :*)
      a = a.reshape(bs + [ln, cn]) unless left.size == 1 && contract.size == 1
      b = b.reshape(bs + [cn, rn]) unless right.size == 1 && contract.size == 1
      r = a.matmul(b)
      r = r.reshape(bs + (left + right).map { |c| sizes[c] }) unless left.size == 1 && right.size == 1
      [(batch + left + right).join, r]
    end
  end
end
