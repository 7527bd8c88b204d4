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

  # the checkpoint transformers wrote for the tests: loaded strictly under
  # transformers' names, its output equal to transformers' within 1e-4,
  # then fine-tuned until the head has learned the task
  def test_finetune_matches_transformers_and_learns
    out = run_example("finetune.rb", "--fixture")
    diff = out[/last_hidden_state within ([\d.e+-]+) of transformers'/, 1]
    refute_nil diff, out
    assert_operator Float(diff), :<=, 1e-4, out
    m = out.match(/held-out accuracy: ([\d.]+)% before fine-tuning, ([\d.]+)% after/)
    refute_nil m, out
    before, after = m.captures.map(&:to_f)
    assert_operator after, :>=, 90.0, out
    assert_operator after, :>, before + 20, out
  end

  # W17's benchmark (perf/w17_char_rnn.rb) at smoke size: one @result line
  # scripts/bench can read, the same losses with the JIT on and off
  def test_w17_benchmark_reports_a_result
    rows = [{}, { "KILN_JIT" => "0" }].map do |env|
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-I#{LIB}", File.join(ROOT, "perf", "w17_char_rnn.rb"),
                                        "--smoke")
      assert status.success?, "w17_char_rnn.rb failed (#{status}):\n#{err}\n#{out}"
      line = out.lines.grep(/^@result\t/).first
      refute_nil line, out
      line.chomp.split("\t").drop(1).to_h { |kv| kv.split("=", 2) }
    end
    assert_equal %w[W17 W17], rows.map { |r| r["workload"] }
    assert_equal %w[kiln kiln-eager], rows.map { |r| r["contender"] }
    rows.each { |r| assert_operator Float(r["time_s"]), :>, 0 }
    # the memory column, as the C rows report it (Linux)
    rows.each { |r| assert_operator Float(r["peak_mib"]), :>, 1 } if File.readable?("/proc/self/status")
    assert_equal rows[0]["check"], rows[1]["check"] # loss1, bit for bit
    assert_operator Integer(rows[0]["loops_rolled"]), :>, 0 # the GRU's per-step cell rolls
  end
end
