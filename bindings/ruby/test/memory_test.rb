# frozen_string_literal: true

require_relative "test_helper"

# Ruby's GC is paced by the bytes Kiln holds for live handles (issue 17,
# item 1; kiln_ext.c: gc_pace), so a loop whose results are never read makes
# the GC run and free them.
class MemoryTest < Minitest::Test
  RSS_GROWTH_BOUND = 256 << 20 # without the reporting: 0.8-2.3 GB (issue 17)

  def rss
    File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i * 1024
  end

  def test_never_read_results_stay_bounded
    loop_rss_growth(sync_every: nil)
  end

  def test_synced_but_never_read_results_stay_bounded
    loop_rss_growth(sync_every: 64) # each sync computes the live results
  end

  def loop_rss_growth(sync_every:)
    skip "needs /proc/self/status" unless File.exist?("/proc/self/status")
    x = Kiln.rand(65_536) # 256 KiB of float32
    Kiln.sync
    GC.start
    before = rss
    peak = before
    20_000.times do |i|
      x * 2.0 # a 256 KiB result nobody reads
      peak = [peak, rss].max if (i % 1000).zero?
      Kiln.sync if sync_every && (i % sync_every).zero?
    end
    Kiln.sync
    peak = [peak, rss].max
    assert_operator peak - before, :<, RSS_GROWTH_BOUND,
                    "RSS grew by #{(peak - before) >> 20} MiB over 20k never-read 256 KiB results"
  end

  def test_memory_in_use_follows_tensors
    GC.start
    Kiln.sync
    base = Kiln.memory_in_use
    t = Kiln.zeros(1 << 20) + 1 # 4 MiB once evaluated
    Kiln.sync
    assert_operator Kiln.memory_in_use, :>=, base + (4 << 20)
    t = nil # rubocop:disable Lint/UselessAssignment
    GC.start
    Kiln.sync
    assert_operator Kiln.memory_in_use, :<, base + (4 << 20)
  end
end
