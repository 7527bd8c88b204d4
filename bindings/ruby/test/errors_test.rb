# frozen_string_literal: true

require_relative "test_helper"

class ErrorsTest < Minitest::Test
  def test_hierarchy
    assert_operator Kiln::Error, :<, StandardError
    assert_operator Kiln::ShapeError, :<, Kiln::Error
    assert_operator Kiln::DTypeError, :<, Kiln::Error
  end

  def test_kiln_messages_and_classes
    e = assert_kiln_error(Kiln::ShapeError, /\Akiln_add: shapes \[2,3\] and \[4\] cannot broadcast\z/) do
      Kiln.zeros(2, 3) + Kiln.zeros(4)
    end
    assert_equal :shape, e.status
    e = assert_kiln_error(Kiln::DTypeError, /\Akiln_rand: /) { Kiln.rand(2, dtype: :int64) }
    assert_equal :dtype, e.status
    e = assert_kiln_error(Kiln::Error, /\Akiln_slice: slice step must not be 0\z/) { Kiln.zeros(3)._slice(0, 0, 3, 0) }
    assert_equal Kiln::Error, e.class
    assert_equal :arg, e.status
  end

  def test_message_is_fresh_after_an_error
    assert_raises(Kiln::ShapeError) { Kiln.zeros(2) + Kiln.zeros(3) }
    assert_tensor [2.0, 2.0], Kiln.ones(2) * 2 # success after failure
    e = assert_raises(Kiln::Error) { Kiln.zeros(2, 2).sum(dim: 5) }
    assert_match(/\Akiln_sum/, e.message)
    refute_match(/kiln_add/, e.message)
  end

  def test_every_error_can_be_rescued_as_kiln_error
    [-> { Kiln.tensor([[1], [2, 3]]) }, -> { Kiln.ones(2).matmul(Kiln.ones(3)) },
     -> { Kiln.ones(2).reshape(3) }, -> { Kiln.ones(2).item }, -> { Kiln.zeros(2, dtype: :complex64) }].each do |f|
      assert_raises(Kiln::Error, &f)
    end
  end

  def test_ruby_argument_errors
    assert_raises(TypeError) { Kiln.ones(2).sum(dim: 1.5) }
    assert_raises(TypeError) { Kiln.ones(2).reshape("2") }
    assert_raises(TypeError) { Kiln.ones(2) + Object.new }
    assert_raises(TypeError) { Kiln.ones(2).sub_scaled!(Kiln.ones(2), "x") }
    assert_raises(TypeError) { Kiln.ones(2).assign!([1, 2]) }
    assert_raises(TypeError) { Kiln::Tensor.allocate }
    assert_raises(TypeError) { Kiln.tensor(["x"]) } # as a bad Ruby argument, not a Kiln::Error
    assert_nil Kiln::Error.new("plain").status
  end
end
