#!/usr/bin/env python3
"""perf/peers/gpu_peers.py -- the peers of Kiln's GPU benchmarks (perf/g*.c),
run by `scripts/bench --device cuda`.

    gpu_peers.py --workload G1..G7|G9|G1h..G4h|G6h|G7h|G9h --contender torch|torch.compile|jax [--smoke]

Runs one workload for one peer on the GPU, on the inputs of perf/g*.c (the
formulas of perf/bench.c, through perf/peers.py), with the same repetition
counts, and prints the same tab-separated @result line with the same result
summary, so scripts/bench compares values as well as times.  Timing: after
warm-up, each repetition runs `inner` evaluations back to back between two
CUDA events (torch) or on the host clock ending in block_until_ready (JAX),
as the Kiln programs time theirs (perf/gpu_bench.h); the median is printed.
G5, a replay of a 100-op chain whose 16 values are read back each time, is
timed on the host clock: a read back to the host is part of it.

G9 (rows G9:1024 and G9:4096) is attention forward + backward through
torch's F.scaled_dot_product_attention and autograd: its memory-efficient
kernel in f32, its flash kernel in bf16 (G9h), each forced with
sdpa_kernel so a fallback to the math path cannot pass for it.
torch.compile and JAX have no row (SDPA is already one fused kernel).

G1h-G4h, G6h and G7h are those workloads in bf16, as perf/g*.c run them
with --bf16: G1h-G4h and G6h take the f32 inputs rounded to bf16 (torch:
bf16 tensors; JAX: bf16 arrays) and move half the bytes, G7h runs G7's step under
torch.autocast("cuda", torch.bfloat16) (f32 parameters; JAX has no
autocast: its row is n/a).

TF32 is off everywhere (Kiln's default): torch's matmul and cuDNN flags,
JAX's jax_default_matmul_precision='highest'.  torch.compile runs in its
default mode.  A peer whose framework or CUDA is missing prints an @na line
saying it was skipped and exits 0; so does one that fails (the traceback goes
to stderr): a peer never fails the run.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ["G1", "G2", "G3", "G4", "G5", "G6", "G7", "G9", "G1h", "G2h", "G3h", "G4h", "G6h", "G7h",
             "G9h"]
# (timed repetitions, warm-up evaluations, evaluations per repetition): perf/g*.c's
PLAN = {"G1": (20, 4, 10), "G2": (20, 4, 20), "G3": (20, 4, 20), "G4": (20, 4, 20),
        "G5": (9, 20, 200), "G6": (10, 2, 1), "G7": (10, 4, 20), "G9": (10, 2, 1)}
G5_OPS, G5_ELEMS = 100, 16
ARGS = None
P = None  # perf/peers.py: the input formulas, the summary, the line format
np = None


def load_peers():
    """perf/peers.py as a module (the folder perf/peers/ would shadow its name)"""
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("kiln_perf_peers", os.path.join(HERE, "..", "peers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.np = np
    mod.ARGS = argparse.Namespace(smoke=ARGS.smoke)  # W7's sizes are G7's
    return mod


def na(note):
    print("@na\tworkload=%s\tcontender=%s\tnote=%s" % (ARGS.workload, ARGS.contender,
                                                       str(note).replace("\t", " ").replace("\n", " ")), flush=True)


def base():
    """the f32 workload a bf16 one (G*h) is the same math as"""
    w = ARGS.workload
    return w[:-1] if w.endswith("h") else w


def half():
    return ARGS.workload.endswith("h")


def plan():
    reps, warm, inner = PLAN[base()]
    if ARGS.smoke:
        return 1, 1, 1 if base() in ("G6", "G9") else 2
    return reps, warm, inner


def size():
    s = ARGS.smoke
    return {"G1": 4096 if s else 1 << 27, "G2": (64, 128) if s else (16384, 4096),
            "G3": (64, 128) if s else (16384, 4096), "G4": 4096 if s else 1 << 27,
            "G6": 256 if s else 8192}.get(base())


def inputs():
    """the host arrays of perf/g*.c"""
    w, z = base(), size()
    if w == "G1":  # workloads.h W1_*
        return P.fill_sin(z, 0.001, 0.0, 1.0), P.fill_sin(z, 0.0007, 0.5, 1.5)
    if w == "G2":
        return (P.fill_sin(z[0] * z[1], 0.01, 0.0, 4.0).reshape(z),)
    if w == "G3":
        return (P.fill_sin(z[0] * z[1], 0.003, 0.2, 2.0).reshape(z), P.fill_sin(z[1], 0.9, 0.0, 0.5),
                P.fill_sin(z[1], 0.45, 1.0, 0.1))
    if w == "G4":
        return (P.fill_sin(z, 0.001, 0.0, 1.0),)
    if w == "G5":
        return ((np.arange(G5_ELEMS, dtype=np.float64) * 0.1).astype(np.float32),)
    if w == "G6":
        return (P.fill_sin(z * z, 0.0013, 0.0, 1.0).reshape(z, z), P.fill_sin(z * z, 0.0021, 0.7, 1.0).reshape(z, z))
    if w == "G7":
        return P.inputs("W7")
    raise KeyError(w)


# bytes that must move per evaluation (perf/g*.c): 12 B/elem for G1, 8 for G2 and G3, 4 for G4
BYTES_PER_ELEM = {"G1": 12.0, "G2": 8.0, "G3": 8.0, "G4": 4.0}


def elems():
    z = size()
    return z[0] * z[1] if isinstance(z, tuple) else z


def bandwidth_fields(med, copy_gbs=None):
    n = elems()
    b = BYTES_PER_ELEM[base()] * n / (2 if half() else 1)
    f = {"bytes": "%.0f" % b, "elems": n, "gbs": "%.1f" % (b / med / 1e9)}
    if copy_gbs:
        f.update(copy_gbs="%.1f" % copy_gbs, of_copy="%.3f" % (b / med / 1e9 / copy_gbs))
    return f


def median_min(times):
    return statistics.median(times), min(times)


def chain(x, ops=G5_OPS):
    """W5's chain: x*1.01, then +0.01, 50 times"""
    for k in range(ops):
        x = x + 0.01 if k % 2 else x * 1.01
    return x


def g5_host_timed(replay, reps, warm, inner):
    """G5: seconds per replay whose 16 values come back to the host"""
    out = None
    for _ in range(warm):
        out = replay()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = replay()
        times.append((time.perf_counter() - t0) / inner)
    return times, out


# --- PyTorch -----------------------------------------------------------------------

def run_torch(compiled):
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:
        return na("skipped: PyTorch is not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
    cuda = ARGS.device == "cuda"
    if cuda and not torch.cuda.is_available():
        return na("skipped: no CUDA device (torch %s: torch.cuda.is_available() is False)" % torch.__version__)
    if compiled and not hasattr(torch, "compile"):
        return na("skipped: PyTorch %s has no torch.compile (2.0+)" % torch.__version__)
    # TF32 off, as Kiln's default (KILN_TF32=0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device(ARGS.device)
    if cuda:
        cap = torch.cuda.get_device_capability()
        name = "%s, sm_%d%d" % (torch.cuda.get_device_name(), cap[0], cap[1])
    else:
        name = "cpu"
    P.MACHINE.update(threads=torch.get_num_threads(), isa="torch-" + torch.__version__.split("+")[0],
                     blas="cublas" if cuda else "cpu")
    contender = "torch.compile" if compiled else "torch"
    # torch.compile in its default mode (no max-autotune, no CUDA graphs)
    opt = torch.compile if compiled else (lambda f: f)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(fn, reps, warm, inner):
        """CUDA events around `inner` back-to-back evaluations (host clock on the CPU)"""
        out = None
        for _ in range(warm + (1 if compiled else 0)):  # torch.compile's first call compiles
            out = fn()
        sync()
        times = []
        for _ in range(reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    out = fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    out = fn()
                times.append((time.perf_counter() - t0) / inner)
        return times, out

    def result(times, check, **extra):
        med, mn = median_min(times)
        P.result(ARGS.workload, contender, med, mn, len(times), check, device=name, **extra)

    w = base()
    reps, warm, inner = plan()
    if w == "G9":
        return run_torch_g9(torch, F, dev, timed, name, reps, warm, compiled)
    on = [torch.from_numpy(a).to(dev) for a in inputs()] if w != "G7" else None
    if half() and on is not None:
        on = [a.to(torch.bfloat16) for a in on]
    torch.set_grad_enabled(w == "G7")
    if w in BYTES_PER_ELEM:
        # the copy bandwidth through torch, for the record (the table's limit is Kiln's, same run)
        copy_times, _ = timed(lambda: on[0].clone(), reps, warm, inner)
        copy_gbs = 2.0 * on[0].element_size() * on[0].numel() / statistics.median(copy_times) / 1e9
        fns = {"G1": lambda x, y: torch.tanh(x * y + 0.5) * torch.sigmoid(x) - y * y * 0.25,
               "G2": lambda x: torch.softmax(x, 1),
               "G3": lambda x, wt, b: F.layer_norm(x, (x.shape[1],), wt, b, 1e-5),
               # eager at its best: one pass through cuBLAS's dot; compiled: one fused reduction
               "G4": (lambda x: (x * x).sum()) if compiled else (lambda x: torch.dot(x, x))}
        f = opt(fns[w])
        times, out = timed(lambda: f(*on), reps, warm, inner)
        check = "value=%.9g" % out.item() if w == "G4" else P.summary(out.float().cpu().numpy())
        result(times, check, note="torch.dot(x, x)" if w == "G4" and not compiled else None,
               **bandwidth_fields(statistics.median(times), copy_gbs))
    elif w == "G5":
        f = opt(chain)
        x0 = on[0]
        times, out = g5_host_timed(lambda: f(x0).cpu(), reps, warm + (1 if compiled else 0), inner)
        result(times, P.summary(out.numpy()), ops=G5_OPS, replays=inner,
               us_per_replay="%.2f" % (1e6 * statistics.median(times)),
               note="host clock: each replay reads its 16 values back")
    elif w == "G6":
        f = opt(torch.matmul)
        times, out = timed(lambda: f(*on), reps, warm, inner)
        flops = 2.0 * size() ** 3
        result(times, P.summary(out.float().cpu().numpy()), flops="%.0f" % flops,
               tflops="%.1f" % (flops / statistics.median(times) / 1e12), tf32="n/a (bf16)" if half() else "off")
    elif w == "G7":
        run_torch_g7(torch, F, dev, opt, timed, result, reps, warm, inner, compiled, bf16=half())
    sync()


def g9_shapes():
    """perf/g9_attention.c's (row, batch, heads, T, head size): 16384 tokens at each T"""
    if ARGS.smoke:
        return [("%s:%d" % (ARGS.workload, t), 1, 2, 128, 64) for t in (1024, 4096)]
    return [("%s:%d" % (ARGS.workload, t), 16384 // t, 16, t, 64) for t in (1024, 4096)]


def g9_na(contender, note):
    """an @na line for each G9 row (the @na of na(), per row)"""
    for row, *_ in g9_shapes():
        print("@na\tworkload=%s\tcontender=%s\tnote=%s" % (row, contender, note), flush=True)


def run_torch_g9(torch, F, dev, timed, name, reps, warm, compiled):
    """attention forward + backward: dq, dk, dv of sum(out * g) through autograd"""
    import contextlib
    if compiled:
        return g9_na("torch.compile", "not measured: SDPA is already one fused kernel")
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:
        SDPBackend = sdpa_kernel = None
    cuda = ARGS.device == "cuda"
    for row, b, h, t, d in g9_shapes():
        n = b * h * t * d
        arrays = [P.fill_sin(n, 0.0013 * (i + 1), 0.3 * i, 1.0).reshape(b, h, t, d) for i in range(4)]
        q, k, v, g = [torch.from_numpy(a).to(dev) for a in arrays]
        if half():
            q, k, v, g = [a.to(torch.bfloat16) for a in (q, k, v, g)]
        for a in (q, k, v):
            a.requires_grad_(True)
        kernel, ctx = "math (cpu)", contextlib.nullcontext()
        if cuda:
            if sdpa_kernel is None:
                print("@na\tworkload=%s\tcontender=torch\tnote=skipped: torch %s has no "
                      "torch.nn.attention.sdpa_kernel (2.3+)" % (row, torch.__version__), flush=True)
                continue
            kernel = "flash" if half() else "memory-efficient"
            ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION if half() else SDPBackend.EFFICIENT_ATTENTION)

        def step():
            out = F.scaled_dot_product_attention(q, k, v)
            return torch.autograd.grad(out, (q, k, v), g)[0]
        with ctx:
            times, dq = timed(step, reps, warm, 1)
        med, mn = median_min(times)
        flops = 3.5 * 4.0 * b * h * t * t * d
        P.result(row, "torch", med, mn, len(times), P.summary(dq.float().detach().cpu().numpy()), device=name,
                 flops="%.0f" % flops, tflops="%.2f" % (flops / med / 1e12), batch=b, heads=h, T=t, d=d,
                 note="F.scaled_dot_product_attention (%s kernel) + autograd" % kernel)


def run_torch_g7(torch, F, dev, opt, timed, result, reps, warm, inner, compiled, bf16=False):
    """W7's step: autograd through the (compiled) forward + loss, SGD as one foreach update;
    bf16 (G7h): the forward under torch.autocast("cuda", torch.bfloat16)"""
    import contextlib
    x_np, params_np, target_np = inputs()
    x, target = torch.from_numpy(x_np).to(dev), torch.from_numpy(target_np).to(dev)
    params = [torch.from_numpy(p.copy()).to(dev).requires_grad_(True) for p in params_np]

    def loss_fn(x, target, w1, b1, w2, b2, w3, b3):
        return P.torch_w7_loss(torch, F, x, target, w1, b1, w2, b2, w3, b3)
    floss = opt(loss_fn)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = floss(x, target, *params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-P.W7_LR)
        return loss

    def once():
        loss = step().item()
        return loss, [p.detach().cpu().numpy().copy() for p in params]

    check = P.w7_check(once, [p.detach().cpu().numpy().copy() for p in params])
    times, _ = timed(step, reps, warm, inner)
    result(times, check, batch=x_np.shape[0], steps=inner,
           note="autograd%s%s, SGD by torch._foreach_add_" % (" through the compiled forward" if compiled else "",
                                                                " under torch.autocast(bfloat16)" if bf16 else ""))


# --- JAX ---------------------------------------------------------------------------

def run_jax():
    if base() == "G9":  # two rows, neither measured
        return g9_na("jax.jit", "not measured yet (G9's peer is torch's SDPA)")
    if ARGS.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:
        return na("skipped: JAX is not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
    try:
        backend = jax.default_backend()
    except Exception as e:
        return na("skipped: JAX has no usable backend (%s)" % str(e).splitlines()[0][:160])
    if ARGS.device == "cuda" and backend != "gpu":
        return na("skipped: no CUDA device for JAX %s (its backend is %s)" % (jax.__version__, backend))
    jax.config.update("jax_default_matmul_precision", "highest")  # TF32 off
    devs = jax.devices()
    name = getattr(devs[0], "device_kind", str(devs[0]))
    P.MACHINE.update(threads=os.cpu_count() or 1, isa="jax-" + jax.__version__, blas="xla")
    ready = jax.block_until_ready

    def timed(fn, reps, warm, inner):
        """host clock around `inner` back-to-back calls, the last waited for"""
        out = None
        for _ in range(warm + 1):  # the first call compiles
            out = ready(fn())
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                out = fn()
            ready(out)
            times.append((time.perf_counter() - t0) / inner)
        return times, out

    def result(times, check, **extra):
        med, mn = median_min(times)
        P.result(ARGS.workload, "jax.jit", med, mn, len(times), check, device=name, **extra)

    def w3(x, wt, b):
        mu = jnp.mean(x, axis=1, keepdims=True)
        xc = x - mu
        var = jnp.mean(xc * xc, axis=1, keepdims=True)
        return xc * jax.lax.rsqrt(var + 1e-5) * wt + b

    w = base()
    reps, warm, inner = plan()
    if ARGS.workload == "G7h":
        return na("n/a: JAX has no autocast (a bf16 recipe would be another program)")
    if w in BYTES_PER_ELEM or w == "G6":
        fns = {"G1": lambda x, y: jnp.tanh(x * y + 0.5) * jax.nn.sigmoid(x) - y * y * 0.25,
               "G2": lambda x: jax.nn.softmax(x, axis=1), "G3": w3, "G4": lambda x: jnp.sum(x * x),
               "G6": lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)}
        if half() and w == "G6":  # bf16 operands and result, f32 sums
            fns["G6"] = lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        f = jax.jit(fns[w])
        on = [jnp.asarray(a) for a in inputs()]
        if half():
            on = [a.astype(jnp.bfloat16) for a in on]
        times, out = timed(lambda: f(*on), reps, warm, inner)
        if w == "G6":
            flops = 2.0 * size() ** 3
            result(times, P.summary(np.asarray(out.astype(jnp.float32))), flops="%.0f" % flops,
                   tflops="%.1f" % (flops / statistics.median(times) / 1e12), tf32="n/a (bf16)" if half() else "off")
        else:
            check = ("value=%.9g" % float(out) if w == "G4"
                     else P.summary(np.asarray(out.astype(jnp.float32))))
            result(times, check, **bandwidth_fields(statistics.median(times)))
    elif w == "G5":
        f = jax.jit(chain)
        x0 = jnp.asarray(inputs()[0])
        times, out = g5_host_timed(lambda: np.asarray(f(x0)), reps, warm + 1, inner)
        result(times, P.summary(out), ops=G5_OPS, replays=inner, us_per_replay="%.2f" % (1e6 * statistics.median(times)),
               note="host clock: each replay reads its 16 values back; the chain is one jitted call")
    elif w == "G7":
        x_np, params_np, target_np = inputs()
        jstep = jax.jit(P.jax_w7_step(jax, jnp), donate_argnums=(0,))
        x, target = jnp.asarray(x_np), jnp.asarray(target_np)
        state = {"p": [jnp.array(p) for p in params_np]}  # copies: they are donated

        def one():
            loss, state["p"] = jstep(state["p"], x, target)
            return loss

        def once():
            loss = float(ready(one()))
            return loss, [np.asarray(p) for p in state["p"]]
        check = P.w7_check(once, [p.copy() for p in params_np])
        times, _ = timed(one, reps, warm, inner)
        result(times, check, batch=x_np.shape[0], steps=inner, note="jax.value_and_grad + jit, params donated")


def main():
    global ARGS, P, np
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, choices=WORKLOADS)
    ap.add_argument("--contender", required=True, choices=["torch", "torch.compile", "jax"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (checks that it runs)")
    # the same code on the CPU: proves it runs on a machine without a GPU; measures nothing
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help=argparse.SUPPRESS)
    ARGS = ap.parse_args()
    if ARGS.contender == "jax":
        ARGS.contender = "jax.jit"  # the row's name, as in the CPU table
    try:
        import numpy
        np = numpy
    except Exception as e:
        na("skipped: numpy is not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
        return 0
    P = load_peers()
    try:
        if ARGS.contender == "jax.jit":
            run_jax()
        else:
            run_torch(ARGS.contender == "torch.compile")
    except Exception as e:  # a peer never fails the run
        na("error: %s" % (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200])
        traceback.print_exc(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
