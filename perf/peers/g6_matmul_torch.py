"""G6 peer: torch.matmul float32 8192^3 on the GPU, TF32 off (as Kiln by
default), timed with CUDA events, median of 10 after 2 warm-ups; prints an
@result line like perf/g6_matmul.c's."""
import statistics
import sys

try:
    import torch
except ImportError as e:  # pragma: no cover - the GPU machine has torch
    print(f"@result\tworkload=G6\tcontender=torch\tnote=no torch ({e})")
    sys.exit(0)

if not torch.cuda.is_available():
    print("@result\tworkload=G6\tcontender=torch\tnote=no CUDA device")
    sys.exit(0)
torch.backends.cuda.matmul.allow_tf32 = False
n = 8192
i = torch.arange(n * n, dtype=torch.float64, device="cuda")
a = torch.sin(0.0013 * i).float().reshape(n, n)
b = torch.sin(0.0021 * i + 0.7).float().reshape(n, n)
times = []
for r in range(12):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    c = a @ b
    end.record()
    torch.cuda.synchronize()
    if r >= 2:
        times.append(start.elapsed_time(end) / 1e3)
med = statistics.median(times)
flops = 2.0 * n ** 3
print(f"@result\tworkload=G6\tcontender=torch\ttime_s={med:.6f}\tflops={flops:.0f}\t"
      f"tflops={flops / med / 1e12:.1f}\tdevice={torch.cuda.get_device_name()}\t"
      f"check=c00={c[0, 0].item():.6g}")
