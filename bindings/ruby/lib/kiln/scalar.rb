# frozen_string_literal: true

module Kiln
  # What Tensor#coerce hands back for a Ruby number on the left of an
  # operator, so that `2 * x`, `1 - x`, `1.0 / x` and `0 < x` work.  + and *
  # commute, so they take exactly the path `x * 2` takes (a weak scalar that
  # never widens x); - / ** and comparisons turn the number into a 0-d tensor
  # of the dtype `x OP number` would use, so both orders give the same dtype.
  class Scalar
    attr_reader :value

    def initialize(value)
      @value = value
    end

    def +(other)
      other + @value
    end

    def *(other)
      other * @value
    end

    def -(other)
      other._scalar_like(@value) - other
    end

    def /(other)
      other._scalar_like(@value) / other
    end

    def **(other)
      other._scalar_like(@value)**other
    end

    def <(other)
      other > @value
    end

    def <=(other)
      other >= @value
    end

    def >(other)
      other < @value
    end

    def >=(other)
      other <= @value
    end

    def inspect
      "#<Kiln::Scalar #{@value.inspect}>"
    end
  end
end
