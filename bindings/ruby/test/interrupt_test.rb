# frozen_string_literal: true

require_relative "test_helper"
require "timeout"

# Ctrl-C and Timeout reach a long evaluation: it stops at the next kernel
# boundary (the unblocking function sets Kiln's cancel flag), Ruby raises
# the interrupt, and nothing is lost: the value is still there to compute.
# On the interpreter (KILN_JIT=0), so every op is a kernel boundary and
# every run of the chain takes the same time; 240 ops of 3 MB, under the
# depth and memory caps, so nothing is evaluated before the read.
class InterruptTest < Minitest::Test
  include KilnChild

  # the chain, defined here and in the child processes below alike
  CHAIN = <<~RUBY
    def chain
      Kiln.manual_seed(5)
      x = Kiln.rand(800, 1000)
      60.times { |i| x = (x * (1.0 + i * 1e-6)).tanh.sigmoid + 0.001 }
      x.sum
    end
  RUBY
  class_eval(CHAIN)

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def test_timeout_interrupts_an_evaluation_and_loses_nothing
    jit = ENV["KILN_JIT"]
    ENV["KILN_JIT"] = "0"
    t0 = now
    reference = chain.item
    whole = now - t0
    skip "the evaluation took #{whole.round(3)} s: too short to interrupt" if whole < 0.06
    total = chain
    t0 = now
    assert_raises(Timeout::Error) { Timeout.timeout(0.02) { total.item } }
    elapsed = now - t0
    assert_operator elapsed, :<, 0.02 + (whole - 0.02) * 0.6, "stopped at a kernel boundary (whole: #{whole} s)"
    assert_equal reference, total.item # computed now, from the same pending graph
  ensure
    ENV["KILN_JIT"] = jit
  end

  # The chain again in a process of its own with KILN_JIT=0, timed
  # (whole), its reference value read and a second one recorded (total);
  # body runs after that and prints what the test compares
  CHILD_CHAIN = CHAIN + <<~RUBY
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    reference = chain.item
    whole = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
    total = chain
  RUBY

  def child_output(body) = kiln_child(CHILD_CHAIN + body).strip

  # Ruby runs the unblocking function for signals it handles without
  # raising too: a child process that exits (SIGCHLD; kiln-jitc is one)
  # must not stop the evaluation with Kiln's "interrupted" error.  In a
  # process of its own: Ruby calls the function from its signal handler only
  # when one thread lives (minitest keeps worker threads).
  def test_a_child_exiting_does_not_interrupt_an_evaluation
    out = child_output(<<~RUBY)
      pid = spawn("sleep", (whole / 4).to_s) # its SIGCHLD comes mid-evaluation
      value = total.item
      Process.wait(pid)
      puts value == reference ? "same" : "differs"
    RUBY
    assert_equal "same", out
  end

  # Ctrl-C (SIGINT) reaches an evaluation as Interrupt, and loses nothing.
  # In a process of its own with KILN_JIT=0 (read once per process: in this
  # one another test may have read it first), the signal a quarter into the
  # run, SIGINT's handler Ruby's own (a suite started as a background job
  # inherits SIGINT ignored, and the signal did nothing).
  def test_sigint_interrupts_an_evaluation
    out = child_output(<<~RUBY)
      trap("INT", "DEFAULT") # Ruby's Interrupt, even where SIGINT came in ignored
      killer = Thread.new { sleep whole / 4; Process.kill("INT", Process.pid) }
      begin
        total.item
        puts "not interrupted (\#{whole} s)"
      rescue Interrupt
        killer.join
        puts total.item == reference ? "interrupted, same" : "interrupted, differs"
      end
    RUBY
    assert_equal "interrupted, same", out
  end
end
