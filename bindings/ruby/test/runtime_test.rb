# frozen_string_literal: true

require_relative "test_helper"

class RuntimeTest < Minitest::Test
  STAT_KEYS = %i[ops_recorded flushes traces_seen cache_hits cache_misses compiles compile_failures
                 disk_hits eager_ops kernels_launched compile_ms flush_ms kernels_compiled plans_built
                 blas_calls recomputed kernel_threads_max kernel_cache_hits code_objects code_unloads
                 view_ops compiler_processes loops_found loops_rolled loop_sums loop_steps
                 trace_cache_entries trace_cache_bytes loop_hoists loop_maps loop_joins trace_families
                 attention_rewrites loop_packs loop_pack_reads].freeze

  def test_stats_has_every_field
    s = Kiln.stats
    assert_equal STAT_KEYS.sort, s.keys.sort
    STAT_KEYS.each { |k| assert_kind_of(k.to_s.end_with?("_ms") ? Float : Integer, s[k], k.to_s) }
  end

  def test_trace_cache_gauges_count_what_it_holds
    (Kiln.ones(3) * 2 + 1).to_a # at least one key seen
    s = Kiln.stats
    assert_operator s[:trace_cache_entries], :>=, 1
    assert_operator s[:trace_cache_bytes], :>, s[:trace_cache_entries] # each entry holds its key bytes
    assert_operator s[:trace_cache_bytes], :<=, 64 << 20 # KILN_TRACE_CACHE_MB's default
  end

  def test_lazy_ops_and_sync
    before = Kiln.stats
    x = Kiln.ones(4) * 3 + 1
    mid = Kiln.stats
    assert_operator mid[:ops_recorded], :>, before[:ops_recorded]
    assert_equal before[:flushes], mid[:flushes] # recorded, not evaluated
    assert_nil Kiln.sync
    assert_operator Kiln.stats[:flushes], :>, mid[:flushes]
    assert_tensor [4.0, 4.0, 4.0, 4.0], x
  end

  def test_jit_wait_then_compiled
    x = Kiln.arange(0, 4096, dtype: :float32)
    Kiln.sync # x is a leaf of the trace below
    step = -> { ((x * 0.001).tanh * 2 + 1).sum.item }
    want = step.call
    2.times { step.call } # hot: queued for the background compiler
    assert_nil Kiln.jit_wait
    before = Kiln.stats[:eager_ops]
    assert_in_delta want, step.call, want.abs * 1e-5
    assert_equal before, Kiln.stats[:eager_ops] # compiled: nothing ran on the interpreter
  end

  def test_reset_stats_and_machine_info
    Kiln.ones(2).sum.item
    Kiln.reset_stats
    assert_equal 0, Kiln.stats[:flushes]
    assert_kind_of String, Kiln.library_version
    assert_equal Kiln.library_version, Kiln::LIBRARY_VERSION
    assert_kind_of String, Kiln::VERSION
    assert_operator Kiln.num_threads, :>=, 1
    assert_kind_of String, Kiln.blas_core
    assert_kind_of String, Kiln.cpu_isa
    assert_equal 8, Kiln::MAX_DIMS
    assert_equal :float64, Kiln.dtype("double")
  end

  def test_repeated_steps_hit_the_trace_cache
    w = Kiln.ones(8, 8)
    x = Kiln.ones(4, 8)
    hist = 6.times.map do |i|
      s0 = Kiln.stats
      ((x * (i + 1)).matmul(w).tanh.sum * 0.5).item # the scalar is a runtime value
      s1 = Kiln.stats
      [s1[:cache_hits] - s0[:cache_hits], s1[:cache_misses] - s0[:cache_misses]]
    end
    assert_equal [[1, 0]] * 4, hist.last(4)
  end

  # a long evaluation runs without the GVL: another Ruby thread makes progress during it
  def test_flush_releases_the_gvl
    a = Kiln.randn(512, 512)
    b = Kiln.randn(512, 512) * 0.05
    a.sum.item
    ticks = []
    stop = false
    ticker = Thread.new do
      until stop
        ticks << Process.clock_gettime(Process::CLOCK_MONOTONIC)
        sleep 0.0005
      end
    end
    sleep 0.01
    n = 4
    loop do
      y = a
      n.times { y = y.matmul(b).tanh }
      s = y.sum
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      s.item
      t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      if t1 - t0 >= 0.05 || n >= 512
        stop = true
        ticker.join
        inside = ticks.count { |t| t > t0 + 0.005 && t < t1 - 0.005 }
        assert_operator inside, :>, 0, "no other thread ran during a #{((t1 - t0) * 1e3).round} ms flush"
        break
      end
      n *= 2
    end
  ensure
    stop = true
    ticker&.join
  end

  def test_threads_have_their_own_pending_graphs
    results = 4.times.map do |k|
      Thread.new { 50.times.map { |i| (Kiln.arange(10) * (k + i)).sum.item } }
    end.map(&:value)
    results.each_with_index do |r, k|
      assert_equal 50.times.map { |i| 45 * (k + i) }, r
    end
  end
end
