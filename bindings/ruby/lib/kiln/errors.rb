# frozen_string_literal: true

module Kiln
  # Kiln::Error < StandardError; Kiln::ShapeError and Kiln::DTypeError < Kiln::Error.
  # Errors from libkiln carry its message (which names the op and the values)
  # and its status as a Symbol: :arg, :shape, :dtype, :oom, :device, :state
  # or :internal (nil for errors raised in Ruby with `raise Kiln::Error, "..."`).
  class Error
    attr_reader :status
  end
end
