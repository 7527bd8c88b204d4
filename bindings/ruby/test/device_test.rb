# frozen_string_literal: true

require_relative "test_helper"

# Devices from Ruby: the CPU always; CUDA where a GPU is (on a machine
# without one, asking for it is a Kiln::Error with status :device and the
# reason, never a crash).
class DeviceTest < Minitest::Test
  def test_cpu_tensors_and_moves
    x = Kiln.tensor([1.0, 2.0, 3.0])
    assert_equal :cpu, x.device
    refute x.cuda?
    y = x.cpu
    assert_equal :cpu, y.device
    assert_tensor [1.0, 2.0, 3.0], y
    assert_tensor [1.0, 2.0, 3.0], x.to(:cpu)
    z = x.to(:cpu, :float64)
    assert_equal :float64, z.dtype
    assert_equal :float64, x.to(dtype: :float64).dtype
  end

  def test_device_info
    assert_match(/CPU, .*threads/, Kiln.device_info(:cpu))
    refute_empty Kiln::CUDA.info
    assert_raises(ArgumentError) { Kiln.device_info(:tpu) }
    assert_raises(Kiln::DTypeError) { Kiln.ones(2).to(:tpu) } # neither a device nor a dtype
  end

  def test_cuda_without_a_gpu_is_a_device_error
    skip "a CUDA device is present: the GPU suite (scripts/gpu-check) covers it" if Kiln::CUDA.available?
    x = Kiln.ones(3) * 2
    e = assert_raises(Kiln::Error) { x.cuda }
    assert_equal :device, e.status
    assert_match(/no CUDA device is available/, e.message)
    assert_raises(Kiln::Error) { x.to(:cuda) }
    assert_tensor [2.0, 2.0, 2.0], x # nothing lost
  end

  def test_cuda_round_trip
    skip "no CUDA device here" unless Kiln::CUDA.available?
    x = Kiln.tensor([[1.0, -2.0], [3.5, 4.0]])
    g = x.cuda
    assert_equal :cuda, g.device
    y = ((g * 2).relu + 1).sum(1)
    assert_equal :cuda, y.device
    assert_tensor [3.0, 16.0], y.cpu
    e = assert_raises(Kiln::Error) { g + x }
    assert_equal :device, e.status
  end
end
