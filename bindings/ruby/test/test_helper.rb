# frozen_string_literal: true

# Loads the gem from this checkout (lib/ with the compiled lib/kiln/kiln_ext.so)
# and minitest.  `rake test` compiles first.
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
# hot traces compile at KILN_HOT, not when the payoff rule says they pay
# (as in the C tests; tests/test_payoff.c tests the rule)
ENV["KILN_PAYOFF"] ||= "0"
require "kiln"
require "minitest/autorun"
require "open3"
require "rbconfig"

# Runs Ruby source in a process of its own with this checkout's gem loaded,
# on the interpreter (KILN_JIT=0) unless env says otherwise; fails the test
# if the child fails, else returns what it printed.
module KilnChild
  def kiln_child(source, *args, env: {})
    lib = File.expand_path("../lib", __dir__)
    out, err, status = Open3.capture3({ "KILN_JIT" => "0" }.merge(env), RbConfig.ruby, "-I", lib,
                                      "-rkiln", "-e", source, *args)
    assert status.success?, "the child failed: #{err}"
    out
  end
end

module KilnAssertions
  # compares a tensor's dtype, shape and values (floats within tol)
  def assert_tensor(expected, tensor, dtype: nil, tol: 1e-5)
    assert_kind_of Kiln::Tensor, tensor
    assert_equal dtype, tensor.dtype, "dtype" if dtype
    actual = tensor.to_a
    assert_nested(expected, actual, tol, [])
  end

  def assert_nested(expected, actual, tol, path)
    if expected.is_a?(Array)
      assert_kind_of Array, actual, "at #{path}"
      assert_equal expected.size, actual.size, "length at #{path}"
      expected.each_with_index { |e, i| assert_nested(e, actual[i], tol, path + [i]) }
    elsif expected.is_a?(Float) && expected.nan?
      assert actual.nan?, "expected NaN at #{path}, got #{actual}"
    elsif expected.is_a?(Float)
      assert_in_delta expected, actual, tol * [1.0, expected.abs].max, "at #{path}"
    else
      assert_equal expected, actual, "at #{path}"
    end
  end

  # asserts that the block raises klass with a message matching pattern
  def assert_kiln_error(klass, pattern, &block)
    e = assert_raises(klass, &block)
    assert_match pattern, e.message
    e
  end
end

Minitest::Test.include(KilnAssertions)
