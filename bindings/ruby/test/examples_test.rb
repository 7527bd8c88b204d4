# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "rbconfig"

# The Ruby examples run as a user runs them (a separate Ruby process with
# this checkout's gem), briefly: they finish, report, and learn.
class ExamplesTest < Minitest::Test
  ROOT = File.expand_path("../../..", __dir__)
  LIB = File.expand_path("../lib", __dir__)

  def run_example(name, *args)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{LIB}", File.join(ROOT, "examples", "ruby", name), *args)
    assert status.success?, "#{name} failed (#{status}):\n#{err}\n#{out}"
    out
  end

  def test_char_rnn_learns_the_text_and_samples_it
    out = run_example("char_rnn.rb", "--epochs", "3", "--steps", "15", "--hidden", "64", "--sample", "60",
                      "--seed", "2")
    losses = out.scan(/^epoch +\d+ +loss ([\d.]+)/).flatten.map(&:to_f)
    assert_equal 3, losses.size, out
    assert_operator losses.last, :<, losses.first - 0.3, out # from ~ln(vocab) down
    sample = out.split("--- sampled at temperature 0.8 ---\n", 2)[1]
    refute_nil sample, out
    assert_equal 61, sample.chomp.size, "the seed character and 60 sampled ones"
    assert_match(/^\d+ characters, \d+ distinct/, out)
  end
end
