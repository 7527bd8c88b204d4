# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"
require_relative "test_helper"

# Kiln::Distributed: outside mpirun every call is a Kiln::Error with status
# :state saying how to start the job; under `mpirun -np 2` (where Open MPI is
# installed) a DataParallel model trains the same parameters on every rank,
# equal to one process training on the whole batch.
class DistributedTest < Minitest::Test
  def test_outside_mpirun_every_call_says_why
    skip "running under mpirun" if ENV["OMPI_COMM_WORLD_SIZE"]
    refute Kiln::Distributed.initialized?
    e = assert_raises(Kiln::Error) { Kiln::Distributed.rank }
    assert_equal :state, e.status
    assert_raises(Kiln::Error) { Kiln::Distributed.all_reduce(Kiln.ones(2)) }
    assert_raises(ArgumentError) { Kiln::Distributed.all_reduce(Kiln.ones(2), :median) }
    e = assert_raises(Kiln::Error) { Kiln::Distributed.init }
    assert_match(/mpirun -np N/, e.message)
    assert_raises(Kiln::Error) { Kiln::Distributed::DataParallel.new(Kiln::NN::Linear.new(2, 2)) }
  end

  SCRIPT = <<~'RUBY'
    require "digest"
    require "kiln"
    Kiln::Distributed.init
    rank, size = Kiln::Distributed.rank, Kiln::Distributed.size
    x = Kiln.tensor((0...32).map { |i| (0...4).map { |j| Math.sin(i * 7 + j) } })
    y = Kiln.tensor((0...32).map { |i| i % 3 }, dtype: :int64)
    Kiln.manual_seed(rank) # different inits: DataParallel starts every rank from rank 0's
    model = Kiln::Distributed::DataParallel.new(Kiln::NN::Sequential.new(
      Kiln::NN::Linear.new(4, 8), Kiln::NN::ReLU.new, Kiln::NN::Linear.new(8, 3)))
    ref = Kiln::NN::Sequential.new(Kiln::NN::Linear.new(4, 8), Kiln::NN::ReLU.new, Kiln::NN::Linear.new(8, 3))
    ref.load_state_dict(model.state_dict)
    opt = Kiln::Optim::SGD.new(model.parameters, lr: 0.3)
    ropt = Kiln::Optim::SGD.new(ref.parameters, lr: 0.3)
    shard = 32 / size
    first = last = nil
    20.times do
      opt.zero_grad
      xs, ys = x[rank * shard...(rank + 1) * shard], y[rank * shard...(rank + 1) * shard]
      loss = Kiln::NN::Functional.cross_entropy(model.(xs), ys)
      loss.backward
      model.average_grads
      opt.step
      mean = Kiln::Distributed.all_reduce(loss.detach, :mean).item
      first ||= mean
      last = mean
      ropt.zero_grad
      Kiln::NN::Functional.cross_entropy(ref.(x), y).backward
      ropt.step
    end
    diff = model.parameters.zip(ref.parameters).map { |a, b| (a - b).abs.max.item }.max
    bits = model.parameters.map { |p| p.to_a.flatten.pack("g*") }.join
    puts "rank=#{rank} first=#{first} last=#{last} diff=#{diff} digest=#{Digest::SHA256.hexdigest(bits)}"
    Kiln::Distributed.finalize
  RUBY

  def test_data_parallel_under_mpirun
    mpirun = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "mpirun") }
                .find { |f| File.executable?(f) }
    skip "mpirun not found (apt-get install openmpi-bin)" unless mpirun
    skip "already under mpirun" if ENV["OMPI_COMM_WORLD_SIZE"]
    Dir.mktmpdir do |dir|
      script = File.join(dir, "dp.rb")
      File.write(script, SCRIPT)
      lib = File.expand_path("../lib", __dir__)
      out, status = Open3.capture2e(mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                                    RbConfig.ruby, "-I", lib, script)
      assert status.success?, out
      lines = out.lines.grep(/^rank=/)
      assert_equal 2, lines.size, out
      ranks = lines.map { |l| l.scan(/(\w+)=(\S+)/).to_h }
      assert_equal ranks[0]["digest"], ranks[1]["digest"], "ranks hold different parameters:\n#{out}"
      ranks.each do |r|
        assert_operator r["diff"].to_f, :<, 1e-5, "differs from one process on the whole batch:\n#{out}"
        assert_operator r["last"].to_f, :<, r["first"].to_f, out # it learns
      end
    end
  end
end
