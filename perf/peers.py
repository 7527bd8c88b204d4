#!/usr/bin/env python3
"""perf/peers.py -- the peers of Kiln's benchmarks, run by scripts/bench.

    peers.py --contender {numpy,torch,jax} --threads T [--smoke] W1 W2 ...

Runs the same workloads as perf/w*.c, on the same inputs (the formulas of
perf/bench.c, reproduced exactly), with the same repetition counts, and prints
the same tab-separated lines (@result / @na) with the same result summary, so
scripts/bench can compare the values.  `torch` also reports torch.compile where
the installed PyTorch has it (and torch.optim.Adam for W12).  W10-W12, W14 (training
loops with autograd) are PyTorch's only; numpy and JAX print nothing for them.  Any failure becomes an @na line: a peer never
fails the run.  Thread settings (OMP/OPENBLAS/MKL_NUM_THREADS, OPENBLAS_CORETYPE)
come from the environment scripts/bench sets; torch.set_num_threads and XLA's
flags are set here.
"""
import argparse
import math
import os
import sys
import time
import traceback

# (timed repetitions, untimed warm-up runs): the defaults of perf/w*.c
REPS = {"W1": (9, 2), "W2": (15, 2), "W3": (15, 2), "W4": (15, 2), "W5": (7, 1),
        "W6": (15, 2), "W7": (9, 0),
        "W10": (3, 1),    # epochs (of sizes()["W10"][5] steps each), not steps
        "W16": (3, 1),    # epochs, as W10
        "W17": (3, 1),    # epochs of 60 steps (perf/w17_char_rnn.rb)
        "W11": (11, 2), "W12": (30, 10), "W14": (5, 2), "W14:cnn": (200, 50),
        "W18": (5, 1), "W18h": (5, 1)}
# W2h-W4h, W6h: W2-W4, W6 in bfloat16 (perf/w*.c --bf16), the same sizes and repetitions
BF16_OF = {"W2h": "W2", "W3h": "W3", "W4h": "W4", "W6h": "W6"}
for _h, _w in BF16_OF.items():
    REPS[_h] = REPS[_w]
REPS["W7h"] = REPS["W7"]  # W7 in bf16 mixed precision (perf/w7_mlp_train.c --bf16)
W5_OPS, W5_CHAINS = 100, 500
ARGS = None
np = None


# --- the inputs and the summary of perf/bench.c ----------------------------------

def fill_sin(n, freq, phase, amp):
    """bench_fill_sin: (float)(amp * sin(i * freq + phase)), i in double"""
    return (amp * np.sin(np.arange(n, dtype=np.float64) * freq + phase)).astype(np.float32)


def fill_hash(n, seed, amp):
    """bench_fill_hash: amp * (2u - 1), u from the lowbias32 hash of i + seed*0x9E3779B9"""
    k = (np.arange(n, dtype=np.uint64) + np.uint64(seed * 0x9E3779B9)) & np.uint64(0xFFFFFFFF)
    h = k.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    h ^= h >> np.uint32(16)
    u = (h >> np.uint32(8)).astype(np.float64) / 16777216.0
    return (amp * (2.0 * u - 1.0)).astype(np.float32)


def hash_u32(k):
    """bench_hash_u32: the lowbias32 hash of one uint32"""
    m = 0xFFFFFFFF
    k &= m
    k ^= k >> 16
    k = (k * 0x7FEB352D) & m
    k ^= k >> 15
    k = (k * 0x846CA68B) & m
    k ^= k >> 16
    return k


def tensor_hash(shape, seed, amp, offset=0.0):
    """bench_tensor_hash: fill_hash over the shape, plus offset added in float32"""
    n = int(np.prod(shape))
    a = fill_hash(n, seed, amp).reshape(shape)
    if offset:
        a = np.float32(offset) + a
    return a


def summary(values):
    """bench_summary_f32"""
    v = np.asarray(values, dtype=np.float32).ravel().astype(np.float64)
    n = v.size
    w = (np.arange(n) % 17 - 8).astype(np.float64)
    mid = n // 2 + 5 if n // 2 + 5 < n else n - 1
    idx = [0, n // 7, mid, n - 1]
    return ("n=%d,sum=%.9g,abs=%.9g,wsum=%.9g,s0=%.9g,s1=%.9g,s2=%.9g,s3=%.9g"
            % (n, v.sum(), np.abs(v).sum(), (v * w).sum(), v[idx[0]], v[idx[1]], v[idx[2]], v[idx[3]]))


# --- sizes (perf/w*.c) -----------------------------------------------------------

def sizes():
    s = ARGS.smoke
    return {
        "W1": 4096 if s else 1 << 24,
        "W2": (64, 128) if s else (4096, 1024),
        "W3": (64, 128) if s else (4096, 1024),
        "W4": 4096 if s else 1 << 24,
        "W6": 64 if s else 1024,
        "W7": (16, 64, 32, 32, 10) if s else (512, 784, 1024, 1024, 10),
        # V, E, H, B, length span (5 .. 5+span-1), steps per epoch
        "W10": (16, 8, 16, 4, 8, 3) if s else (64, 32, 128, 32, 36, 15),
        "W16": (16, 8, 16, 4, 8, 3) if s else (64, 32, 128, 32, 396, 8),
        "W11": (2, 8, 32, 4) if s else (8, 64, 128, 4),   # B, S, D, heads
        "W12": (16, 64, 32, 10) if s else (128, 784, 256, 10),  # batch, in, hidden, classes
        "W14": (2, 8, 12) if s else (32, 64, 56),  # batch, channels in = out, height = width
    }


def inputs(w):
    z = sizes()
    if w == "W1":
        n = z["W1"]
        return fill_sin(n, 0.001, 0.0, 1.0), fill_sin(n, 0.0007, 0.5, 1.5)
    if w == "W2":
        r, c = z["W2"]
        return (fill_sin(r * c, 0.01, 0.0, 4.0).reshape(r, c),)
    if w == "W3":
        r, c = z["W3"]
        return (fill_sin(r * c, 0.003, 0.2, 2.0).reshape(r, c), fill_sin(c, 0.9, 0.0, 0.5),
                fill_sin(c, 0.45, 1.0, 0.1))
    if w == "W4":
        return (fill_sin(z["W4"], 0.001, 0.0, 1.0),)
    if w == "W5":
        return ((np.arange(16, dtype=np.float64) * 0.1).astype(np.float32),)
    if w == "W6":
        n = z["W6"]
        return fill_sin(n * n, 0.0013, 0.0, 1.0).reshape(n, n), fill_sin(n * n, 0.0021, 0.7, 1.0).reshape(n, n)
    if w == "W7":
        b, d, h1, h2, c = z["W7"]
        x = fill_hash(b * d, 1, 1.0).reshape(b, d)
        params = [fill_hash(d * h1, 2, math.sqrt(6.0 / d)).reshape(d, h1), fill_hash(h1, 3, 0.01),
                  fill_hash(h1 * h2, 4, math.sqrt(6.0 / h1)).reshape(h1, h2), fill_hash(h2, 5, 0.01),
                  fill_hash(h2 * c, 6, math.sqrt(6.0 / h2)).reshape(h2, c), fill_hash(c, 7, 0.01)]
        target = (np.arange(b, dtype=np.int64) * 7 + 3) % c
        return x, params, target
    if w == "W10":  # perf/w10_gru_lm.c: Emb, Wx, bx, Wh, bh, Wout, bout
        V, E, H, B, span, epoch = z["W10"]
        a = 1.0 / math.sqrt(H)
        return [tensor_hash((V, E), 21, 1.0), tensor_hash((E, 3 * H), 22, a), tensor_hash((3 * H,), 23, a),
                tensor_hash((H, 3 * H), 24, a), tensor_hash((3 * H,), 25, a), tensor_hash((H, V), 26, a),
                tensor_hash((V,), 27, 0.01)]
    if w == "W16":  # perf/w10_gru_lm.c built as perf_w16_lstm_lm: the same order, 4 gates
        V, E, H, B, span, epoch = z["W16"]
        a = 1.0 / math.sqrt(H)
        return [tensor_hash((V, E), 31, 1.0), tensor_hash((E, 4 * H), 32, a), tensor_hash((4 * H,), 33, a),
                tensor_hash((H, 4 * H), 34, a), tensor_hash((4 * H,), 35, a), tensor_hash((H, V), 36, a),
                tensor_hash((V,), 37, 0.01)]
    if w == "W11":  # perf/w11_transformer.c: x, then the 16 parameters in its order
        B, S, D, heads = z["W11"]
        F = 4 * D
        a, af = 1.0 / math.sqrt(D), 1.0 / math.sqrt(F)
        x = tensor_hash((B, S, D), 40, 1.0)
        params = [tensor_hash((D,), 41, 0.1, 1.0), tensor_hash((D,), 42, 0.1),
                  tensor_hash((D, D), 43, a), tensor_hash((D,), 44, 0.01),
                  tensor_hash((D, D), 45, a), tensor_hash((D,), 46, 0.01),
                  tensor_hash((D, D), 47, a), tensor_hash((D,), 48, 0.01),
                  tensor_hash((D, D), 49, a), tensor_hash((D,), 50, 0.01),
                  tensor_hash((D,), 51, 0.1, 1.0), tensor_hash((D,), 52, 0.1),
                  tensor_hash((D, F), 53, a), tensor_hash((F,), 54, 0.01),
                  tensor_hash((F, D), 55, af), tensor_hash((D,), 56, 0.01)]
        return x, params
    if w == "W12":  # perf/w12_adam.c
        b, d, h, c = z["W12"]
        x = tensor_hash((b, d), 61, 1.0)
        params = [tensor_hash((d, h), 62, math.sqrt(6.0 / d)), tensor_hash((h,), 63, 0.01),
                  tensor_hash((h, c), 64, math.sqrt(6.0 / h)), tensor_hash((c,), 65, 0.01)]
        target = (np.arange(b, dtype=np.int64) * 7 + 3) % c
        return x, params, target
    if w == "W14":  # perf/w14_conv2d.c: x, w, b
        n, c, hw = z["W14"]
        return (fill_hash(n * c * hw * hw, 1, 1.0).reshape(n, c, hw, hw),
                fill_hash(c * c * 9, 2, 0.05).reshape(c, c, 3, 3), fill_hash(c, 3, 0.1))
    raise KeyError(w)


def w10_len(step, w="W10"):
    """perf/w10_gru_lm.c seq_len"""
    span = sizes()[w][4]
    return 5 + hash_u32(step + 0x5EED) % span


def w10_tokens(step, L, w="W10"):
    """perf/w10_gru_lm.c make_tokens: [L+1, B] int64"""
    V, _, _, B = sizes()[w][:4]
    tok = np.empty((L + 1, B), np.int64)
    for b in range(B):
        x = hash_u32(step * 7919 + b) % V
        for p in range(L + 1):
            tok[p, b] = x
            x = (5 * x + 7) % V
    return tok


W7_LR = 0.05


def torch_w7_loss(torch, F, x, target, w1, b1, w2, b2, w3, b3):
    """W7's forward and loss in PyTorch (perf/peers/gpu_peers.py's G7 too)"""
    h1 = torch.relu(x @ w1 + b1)
    h2 = torch.relu(h1 @ w2 + b2)
    return F.cross_entropy(h2 @ w3 + b3, target)


def jax_w7_step(jax, jnp):
    """W7's SGD step in JAX, step(params, x, target) -> (loss, new params)
    (perf/peers/gpu_peers.py's G7 too)"""
    def loss_fn(params, x, target):
        w1, b1, w2, b2, w3, b3 = params
        h1 = jax.nn.relu(x @ w1 + b1)
        h2 = jax.nn.relu(h1 @ w2 + b2)
        ls = jax.nn.log_softmax(h2 @ w3 + b3, axis=1)
        return -jnp.mean(jnp.take_along_axis(ls, target[:, None], axis=1))

    def step(params, x, target):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, target)
        return loss, [p - W7_LR * g for p, g in zip(params, grads)]
    return step
W10_LR, W11_LR = 0.5, 0.01
W12_ADAM = (1e-3, 0.9, 0.999, 1e-8)  # lr, b1, b2, eps


# --- output ----------------------------------------------------------------------

MACHINE = {"threads": 1, "isa": "unknown", "blas": "unknown"}


def emit(kind, workload, contender, fields):
    f = {"workload": workload, "contender": contender}
    f.update(fields)
    for k in ("threads", "isa", "blas"):
        f.setdefault(k, MACHINE[k])
    note = f.pop("note", None)
    check = f.pop("check", None)
    parts = ["@" + kind] + ["%s=%s" % (k, v) for k, v in f.items()]
    if note is not None:
        parts.append("note=" + str(note).replace("\t", " ").replace("\n", " "))
    if check is not None:
        parts.append("check=" + check)
    print("\t".join(parts), flush=True)


def na(workload, contender, note):
    emit("na", workload, contender, {"note": note})


def timed(fn, reps, warmup, per=1.0):
    """median and min of reps timed calls after warmup untimed ones; returns (median, min, last)"""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) / per)
    s = sorted(times)
    m = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
    return m, s[0], out


def peak_mib():
    """the process's peak resident set (Linux VmHWM) in MiB, None where unknown"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def peak_reset():
    """a new peak from the present resident set (perf/bench.c's bench_peak_reset)"""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def result(workload, contender, med, mn, reps, check, **extra):
    f = {"time_s": "%.9g" % med, "min_s": "%.9g" % mn, "reps": reps}
    peak = peak_mib()
    if peak is not None:  # the peak since the row before (perf/bench.c: bench_result_with)
        f["peak_mib"] = "%.1f" % peak
    f.update(extra)
    f["check"] = check
    emit("result", workload, contender, f)
    peak_reset()


def reps_of(w):
    return (1, 1) if ARGS.smoke else REPS[w]


def w5_chains():
    return 1 if ARGS.smoke else W5_CHAINS


def extra_bytes(w):
    if w in BF16_OF:  # half the bytes of f32; the same flops
        e = extra_bytes(BF16_OF[w])
        if "bytes" in e:
            e["bytes"] = "%.0f" % (float(e["bytes"]) / 2)
        return e
    z = sizes()
    if w == "W1":
        return {"bytes": "%.0f" % (12.0 * z["W1"]), "elems": z["W1"]}
    if w in ("W2", "W3"):
        n = z[w][0] * z[w][1]
        return {"bytes": "%.0f" % (8.0 * n), "elems": n}
    if w == "W4":
        return {"bytes": "%.0f" % (4.0 * z["W4"]), "elems": z["W4"]}
    if w == "W6":
        return {"flops": "%.0f" % (2.0 * z["W6"] ** 3)}
    return {}


def w7_check(step_once, params_np):
    """runs steps 1 and 2 through step_once(), which returns (loss, params as numpy)"""
    before = [p.copy() for p in params_np]
    loss1, after = step_once()
    d = [float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).sum()) for a, b in zip(after, before)]
    loss2, _ = step_once()
    return ("loss1=%.9g,loss2=%.9g,dw1=%.9g,db1=%.9g,dw2=%.9g,db2=%.9g,dw3=%.9g,db3=%.9g"
            % (loss1, loss2, d[0], d[1], d[2], d[3], d[4], d[5]))


# --- numpy -----------------------------------------------------------------------

def numpy_machine():
    MACHINE["threads"] = ARGS.threads
    try:
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        best = [t for t in ("AVX512_SPR", "AVX512_ICL", "AVX512_CNL", "AVX512_CLX", "AVX512_SKX",
                            "AVX512F", "AVX2", "SSE42")
                if t in __cpu_dispatch__ and __cpu_features__.get(t)]
        MACHINE["isa"] = "numpy-" + (best[0] if best else "baseline")
    except Exception:
        MACHINE["isa"] = "unknown"
    MACHINE["blas"] = blas_from_threadpoolctl() or numpy_config_blas()


def blas_from_threadpoolctl():
    try:
        from threadpoolctl import threadpool_info
    except Exception:
        return None
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            arch = lib.get("architecture") or "?"
            MACHINE["threads"] = lib.get("num_threads", MACHINE["threads"])
            return "%s:%s" % (lib.get("internal_api", "blas"), arch)
    return None


def numpy_config_blas():
    try:
        cfg = np.__config__
        info = getattr(cfg, "blas_opt_info", None) or getattr(cfg, "blas_ilp64_opt_info", None)
        if info and info.get("libraries"):
            return "%s:unknown-core" % info["libraries"][0]
    except Exception:
        pass
    return "unknown"


def run_numpy(workloads):
    numpy_machine()
    c = "numpy"
    for w in workloads:
        if w == "W8":  # numpy compiles nothing: no row
            continue
        try:
            reps, warm = reps_of(w)
            if w == "W1":
                x, y = inputs(w)

                def f():
                    t = x * y
                    t += 0.5
                    np.tanh(t, out=t)
                    s = np.negative(x)
                    np.exp(s, out=s)
                    s += 1.0
                    t /= s                      # tanh(...) * sigmoid(x)
                    u = y * y
                    u *= 0.25
                    t -= u
                    return t
                med, mn, out = timed(f, reps, warm)
                result(w, c, med, mn, reps, summary(out), note="in-place ufuncs", **extra_bytes(w))
            elif w == "W2":
                (x,) = inputs(w)

                def f():
                    e = x - x.max(axis=1, keepdims=True)
                    np.exp(e, out=e)
                    e /= e.sum(axis=1, keepdims=True)
                    return e
                med, mn, out = timed(f, reps, warm)
                result(w, c, med, mn, reps, summary(out), **extra_bytes(w))
            elif w == "W3":
                x, wt, b = inputs(w)

                def f():
                    xc = x - x.mean(axis=1, keepdims=True)
                    var = np.einsum("ij,ij->i", xc, xc)[:, None] / np.float32(x.shape[1])
                    xc *= 1.0 / np.sqrt(var + np.float32(1e-5))
                    xc *= wt
                    xc += b
                    return xc
                med, mn, out = timed(f, reps, warm)
                result(w, c, med, mn, reps, summary(out), **extra_bytes(w))
            elif w == "W4":
                (x,) = inputs(w)
                med, mn, out = timed(lambda: float(np.dot(x, x)), reps, warm)
                result(w, c, med, mn, reps, "value=%.9g" % out, note="np.dot(x, x)", **extra_bytes(w))
            elif w == "W5":
                (x0,) = inputs(w)

                def f():
                    for _ in range(w5_chains()):
                        x = x0
                        for k in range(W5_OPS):
                            x = x + 0.01 if k % 2 else x * 1.01
                        out = x.tolist()
                    return out
                med, mn, out = timed(f, reps, warm, per=w5_chains() * W5_OPS)
                result(w, c, med, mn, reps, summary(out), ops=W5_OPS, chains=w5_chains())
            elif w == "W6":
                a, b = inputs(w)
                med, mn, out = timed(lambda: a @ b, reps, warm)
                result(w, c, med, mn, reps, summary(out), **extra_bytes(w))
            elif w == "W7":
                run_numpy_w7(reps, warm)
        except Exception as e:  # a peer never fails the run
            na(w, c, "error: %s" % e)
            traceback.print_exc(file=sys.stderr)


def run_numpy_w7(reps, warm):
    x, params, target = inputs("W7")
    bsz, classes = x.shape[0], params[5].shape[0]
    onehot = np.zeros((bsz, classes), np.float32)
    onehot[np.arange(bsz), target] = 1.0

    def step():
        w1, b1, w2, b2, w3, b3 = params
        h1 = np.maximum(x @ w1 + b1, 0)
        h2 = np.maximum(h1 @ w2 + b2, 0)
        logits = h2 @ w3 + b3
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) + m[:, 0] - logits[np.arange(bsz), target]))
        g3 = (e / s - onehot) * np.float32(1.0 / bsz)
        g2 = (g3 @ w3.T) * (h2 > 0)
        g1 = (g2 @ w2.T) * (h1 > 0)
        grads = [x.T @ g1, g1.sum(0), h1.T @ g2, g2.sum(0), h2.T @ g3, g3.sum(0)]
        for p, g in zip(params, grads):
            p -= np.float32(W7_LR) * g
        return loss

    check = w7_check(lambda: (step(), params), params)
    med, mn, _ = timed(step, reps, warm)
    result("W7", "numpy", med, mn, reps, check, batch=bsz, note="hand-written backward (numpy has no autodiff)")


# --- PyTorch ---------------------------------------------------------------------

def run_torch(workloads):
    c, cc = "torch", "torch.compile"
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:
        for w in workloads:
            for name in (c, cc) + (("torch.optim",) if w in ("W12", "W14") else ()):
                if w == "W8" and name == c:
                    continue
                subs = {"W8": ["W8:W1", "W8:W7"], "W14": ["W14", "W14:cnn"]}.get(w, [w])
                for ww in subs:
                    na(ww, name, "PyTorch not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
        return
    torch.set_num_threads(ARGS.threads)
    MACHINE["threads"] = torch.get_num_threads()
    cap = "unknown"
    try:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage" in line:
                cap = line.split(":", 1)[1].strip()
    except Exception:
        pass
    MACHINE["isa"] = "torch-" + cap
    blas = None
    try:  # pip wheels link MKL statically: threadpoolctl would show numpy's BLAS instead
        import re
        m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
        if m:
            blas = "torch:" + m.group(1)
    except Exception:
        pass
    if blas is None or blas == "torch:open":
        blas = blas_from_threadpoolctl() or blas or "unknown"
    MACHINE["blas"] = blas
    has_compile = hasattr(torch, "compile")
    no_compile = "PyTorch %s has no torch.compile (2.0+)" % torch.__version__
    torch.set_grad_enabled(False)

    def both(w, fn, args, check_of, per=1.0, **extra):
        """eager, then torch.compile of the same function"""
        reps, warm = reps_of(w)
        med, mn, out = timed(lambda: fn(*args), reps, warm, per)
        result(w, c, med, mn, reps, check_of(out), **extra)
        if not has_compile:
            na(w, cc, no_compile)
            return
        try:
            cfn = torch.compile(fn)
            med, mn, out = timed(lambda: cfn(*args), reps, warm + 1, per)
            result(w, cc, med, mn, reps, check_of(out), **extra)
        except Exception as e:
            na(w, cc, "torch.compile failed: %s" % str(e).splitlines()[0][:200])

    t = torch.from_numpy
    for w in workloads:
        try:
            if w == "W1":
                x, y = map(t, inputs(w))
                both(w, lambda x, y: torch.tanh(x * y + 0.5) * torch.sigmoid(x) - y * y * 0.25, (x, y),
                     lambda o: summary(o.numpy()), **extra_bytes(w))
            elif w == "W2":
                (x,) = map(t, inputs(w))
                both(w, lambda x: torch.softmax(x, 1), (x,), lambda o: summary(o.numpy()), **extra_bytes(w))
            elif w == "W3":
                x, wt, b = map(t, inputs(w))
                both(w, lambda x, wt, b: F.layer_norm(x, (x.shape[1],), wt, b, 1e-5), (x, wt, b),
                     lambda o: summary(o.numpy()), **extra_bytes(w))
            elif w == "W4":
                (x,) = map(t, inputs(w))
                both(w, lambda x: torch.dot(x, x).item(), (x,), lambda o: "value=%.9g" % o,
                     note="torch.dot(x, x)", **extra_bytes(w))
            elif w == "W5":
                (x0,) = map(t, inputs(w))

                def chain(x0):
                    for _ in range(w5_chains()):
                        x = x0
                        for k in range(W5_OPS):
                            x = x + 0.01 if k % 2 else x * 1.01
                        out = x.tolist()
                    return out
                reps, warm = reps_of(w)
                med, mn, out = timed(lambda: chain(x0), reps, warm, w5_chains() * W5_OPS)
                result(w, c, med, mn, reps, summary(out), ops=W5_OPS, chains=w5_chains())
                na(w, cc, no_compile if not has_compile else
                   "not measured: a compiled chain is not per-op dispatch")
            elif w == "W6":
                a, b = map(t, inputs(w))
                both(w, torch.mm, (a, b), lambda o: summary(o.numpy()), **extra_bytes(w))
            elif w in BF16_OF:  # the f32 workload's inputs rounded to bf16; eager and compiled
                base = BF16_OF[w]
                args = tuple(t(a).to(torch.bfloat16) for a in inputs(base))
                fn = {"W2": lambda x: torch.softmax(x, 1),
                      "W3": lambda x, wt, b: F.layer_norm(x, (x.shape[1],), wt, b, 1e-5),
                      "W4": lambda x: (x * x).sum().item(),
                      "W6": torch.mm}[base]
                check = (lambda o: "value=%.9g" % o) if base == "W4" else (lambda o: summary(o.float().numpy()))
                both(w, fn, args, check, note="bfloat16", **extra_bytes(w))
            elif w == "W7":
                run_torch_w7(torch, F, has_compile, no_compile)
            elif w == "W7h":
                run_torch_w7(torch, F, has_compile, no_compile, bf16=True)
            elif w == "W10" and ARGS.device != "cpu":  # nn.GRU on the GPU alone (scripts/gpu-check)
                run_torch_w10_gru(torch, lambda hs, wout, bout, y: F.cross_entropy(hs @ wout + bout, y))
            elif w == "W10":
                run_torch_w10(torch, F, has_compile, no_compile)
            elif w == "W16":
                run_torch_w16(torch, F)
            elif w == "W17":
                run_torch_w17(torch, F)
            elif w == "W11":
                run_torch_w11(torch, F, has_compile, no_compile)
            elif w == "W12":
                run_torch_w12(torch, F, has_compile, no_compile)
            elif w == "W14":
                run_torch_w14(torch, F, has_compile, no_compile)
            elif w == "W18":
                run_torch_w18(torch, has_compile, no_compile)
            elif w == "W18h":
                run_torch_w18(torch, has_compile, no_compile, bf16=True)
            elif w == "W8":
                na("W8:W1", cc, no_compile if not has_compile else "not measured yet")
                na("W8:W7", cc, no_compile if not has_compile else "not measured yet")
        except Exception as e:
            na(w, c, "error: %s" % e)
            traceback.print_exc(file=sys.stderr)


def run_torch_w18(torch, has_compile, no_compile, bf16=False):
    """perf/w18_bert.c: transformers' BertModel (6 layers, 384 wide, 12 heads,
    1536 intermediate, vocabulary 30522), batch 32 x 128 tokens padded from
    lengths 64..128: W18:infer the forward under no_grad (mean(h*h) read),
    W18:train a fine-tuning step (forward, loss mean(h*h) read, backward,
    SGD).  The same weights, tokens and mask as Kiln's.  bf16 (W18h): both
    under torch.autocast("cpu", torch.bfloat16), f32 parameters."""
    w = "W18h" if bf16 else "W18"
    names = (w + ":infer", w + ":train")
    rows = [(wl, n) for wl in names for n in ("torch", "torch.compile")]
    try:
        import transformers
    except Exception as e:
        for wl, n in rows:
            na(wl, n, "transformers not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
        return
    smoke = ARGS.smoke
    B, T = (2, 16) if smoke else (32, 128)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32 if smoke else 384, num_hidden_layers=2 if smoke else 6,
        num_attention_heads=4 if smoke else 12, intermediate_size=64 if smoke else 1536,
        max_position_embeddings=512, layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    ids = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.float32)
    for b in range(B):
        n = 8 + hash_u32(b) % 9 if smoke else 64 + hash_u32(b) % 65
        for t in range(T):
            ids[b, t] = hash_u32(b * T + t + 7777) % 30522
        mask[b, :n] = 1
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    reps, warm = reps_of("W18")
    base = transformers.BertModel(config, add_pooling_layer=False).eval()
    # perf/w18_bert.c's weights: tensor_hash in its order, seeds from 100
    H, I, a = config.hidden_size, config.intermediate_size, 0.02 * math.sqrt(3.0)
    order = [("embeddings.word_embeddings.weight", (30522, H), a, 0.0),
             ("embeddings.position_embeddings.weight", (512, H), a, 0.0),
             ("embeddings.token_type_embeddings.weight", (2, H), a, 0.0),
             ("embeddings.LayerNorm.weight", (H,), 0.1, 1.0), ("embeddings.LayerNorm.bias", (H,), 0.1, 0.0)]
    lin = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
           "intermediate.dense", "output.dense"]
    for layer in range(config.num_hidden_layers):
        for j, name in enumerate(lin):
            out, inp = (I if j == 4 else H), (I if j == 5 else H)
            pre = "encoder.layer.%d." % layer
            order += [(pre + name + ".weight", (out, inp), a, 0.0), (pre + name + ".bias", (out,), 0.01, 0.0)]
            if j in (3, 5):
                ln = pre + ("attention.output.LayerNorm" if j == 3 else "output.LayerNorm")
                order += [(ln + ".weight", (H,), 0.1, 1.0), (ln + ".bias", (H,), 0.1, 0.0)]
    state = {n: torch.from_numpy(tensor_hash(shape, 100 + i, amp, off)) for i, (n, shape, amp, off) in enumerate(order)}
    base.load_state_dict(state, strict=True)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    def run(name, model):
        base.load_state_dict(state, strict=True)  # the same start for each contender
        params = [p for p in model.parameters()]

        def infer():
            with torch.no_grad(), autocast():
                h = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                return (h.float() * h.float()).mean().item()

        def train():
            with torch.enable_grad():
                with autocast():
                    h = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                loss = (h.float() * h.float()).mean()
                value = loss.item()
                loss.backward()
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad, alpha=0.01)
                    p.grad = None
            return value
        for wl, fn in ((names[0], infer), (names[1], train)):
            first = fn()
            med, mn, last = timed(fn, reps, warm)
            result(wl, name, med, mn, reps, "first=%.9g" % first, batch=B, seq=T,
                   hidden=config.hidden_size, layers=config.num_hidden_layers,
                   heads=config.num_attention_heads, value_last="%.6g" % last,
                   note="transformers %s BertModel (attn_implementation %s)%s"
                   % (transformers.__version__, getattr(config, "_attn_implementation", "?"),
                      ", autocast bfloat16" if bf16 else ""))

    run("torch", base)
    if not has_compile:
        for wl in names:
            na(wl, "torch.compile", no_compile)
        return
    try:
        run("torch.compile", torch.compile(base))
    except Exception as e:
        for wl in names:
            na(wl, "torch.compile", "torch.compile failed: %s" % first_line(e))
        traceback.print_exc(file=sys.stderr)


def run_torch_w14(torch, F, has_compile, no_compile):
    """perf/w14_conv2d.c: conv2d 3x3 pad 1 forward, backward of the sum into x, w, b"""
    x, w, b = [torch.from_numpy(a.copy()).requires_grad_(True) for a in inputs("W14")]

    def step():
        with torch.enable_grad():
            F.conv2d(x, w, b, 1, 1).sum().backward()
        grads = (x.grad, w.grad, b.grad)
        gw = w.grad.numpy().copy()
        for p in (x, w, b):
            p.grad = None
        del grads
        return gw
    reps, warm = reps_of("W14")
    med, mn, gw = timed(step, reps, warm)
    result("W14", "torch", med, mn, reps, summary(gw))
    na("W14", "torch.compile", no_compile if not has_compile else "not measured yet")
    run_torch_w14_cnn(torch, F)


def w14_cnn_inputs():
    """perf/w14_cnn.c: x [64, 64], labels, conv1.w, conv1.b, conv2.w, conv2.b, fc.w, fc.b"""
    n = 64
    x = tensor_hash((n, 64), 70, 0.5, 0.5)
    target = (np.arange(n, dtype=np.int64) * 7 + 3) % 10
    params = [tensor_hash((16, 1, 3, 3), 71, math.sqrt(6.0 / 9)), tensor_hash((16,), 72, 0.01),
              tensor_hash((32, 16, 3, 3), 73, math.sqrt(6.0 / 144)), tensor_hash((32,), 74, 0.01),
              tensor_hash((128, 10), 75, math.sqrt(6.0 / 128)), tensor_hash((10,), 76, 0.01)]
    return x, target, params


def run_torch_w14_cnn(torch, F):
    """perf/w14_cnn.c: the digits CNN step with the same hand-written Adam (row torch),
    and with torch.optim.Adam (row torch.optim)"""
    x_np, target_np, params_np = w14_cnn_inputs()
    x, target = torch.from_numpy(x_np), torch.from_numpy(target_np)

    def loss_of(p):
        h = x.reshape(64, 1, 8, 8)
        h = F.max_pool2d(torch.relu(F.conv2d(h, p[0], p[1], 1, 1)), 2)
        h = F.max_pool2d(torch.relu(F.conv2d(h, p[2], p[3], 1, 1)), 2)
        return F.cross_entropy(h.reshape(64, 128) @ p[4] + p[5], target)

    run_adam_steps(torch, "W14:cnn", loss_of, params_np, (3e-3, 0.9, 0.999, 1e-8), 64)


def run_torch_w7(torch, F, has_compile, no_compile, bf16=False):
    """W7, or with bf16 W7h: the same step under torch.autocast("cpu",
    torch.bfloat16) (matmuls in bf16, f32 parameters and gradients)"""
    import contextlib
    w = "W7h" if bf16 else "W7"
    x_np, params_np, target_np = inputs("W7")
    x, target = torch.from_numpy(x_np), torch.from_numpy(target_np)
    params = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params_np]

    def step():
        with torch.enable_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                loss = torch_w7_loss(torch, F, x, target, *params)
            loss.backward()
        with torch.no_grad():
            for p in params:
                p.sub_(p.grad, alpha=W7_LR)
                p.grad = None
        return loss

    def once():
        loss = step().item()
        return loss, [p.detach().numpy().copy() for p in params]

    check = w7_check(once, [p.detach().numpy() for p in params])
    reps, warm = reps_of(w)
    med, mn, _ = timed(step, reps, warm)
    result(w, "torch", med, mn, reps, check, batch=x_np.shape[0],
           note="autograd under torch.autocast(cpu, bfloat16)" if bf16 else "autograd")
    na(w, "torch.compile", no_compile if not has_compile else "not measured yet")


def first_line(e):
    return (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200]


def run_torch_w10(torch, F, has_compile, no_compile):
    """perf/w10_gru_lm.c: the GRU written per time step, autograd, SGD; epochs of
    fresh lengths, the first one the warm-up; seconds per step, median of epochs.
    torch.compile: the GRU cell compiled with static shapes (one graph whatever
    the length; compiling the whole unrolled model would recompile per length)
    and the output layer + loss over the stacked states compiled with dynamic=True."""
    V, E, H, B, span, epoch = sizes()["W10"]

    def cell(xt, h, wx, bx, wh, bh):
        gx = xt @ wx + bx
        gh = h @ wh + bh
        r = torch.sigmoid(gx[:, :H] + gh[:, :H])
        z = torch.sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
        n = torch.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
        return n + z * (h - n)

    def head(hs_all, wout, bout, targets):  # hs_all: the hidden states stacked, [L*B, H]
        return F.cross_entropy(hs_all @ wout + bout, targets)

    def run(name, cell_fn, head_fn, note):
        params = [torch.from_numpy(p.copy()).requires_grad_(True) for p in inputs("W10")]
        emb_w, wx, bx, wh, bh, wout, bout = params
        state = {"step": 0}

        def train_step():
            step = state["step"]
            state["step"] += 1
            L = w10_len(step)
            tok = torch.from_numpy(w10_tokens(step, L))
            with torch.enable_grad():
                inputs_, targets = tok[:L].reshape(-1), tok[1:].reshape(-1)
                emb = emb_w.index_select(0, inputs_).reshape(L, B, E)
                h = torch.zeros(B, H)
                hs = []
                for t in range(L):
                    h = cell_fn(emb[t], h, wx, bx, wh, bh)
                    hs.append(h)
                loss = head_fn(torch.stack(hs).reshape(L * B, H), wout, bout, targets)
                value = loss.item()
                loss.backward()
            lm_sgd(torch, params)
            return value, L

        lm_timed("W10", name, train_step, note)

    run("torch", cell, head, "autograd, GRU cell per time step")
    run_torch_w10_gru(torch, head)
    if not has_compile:
        na("W10", "torch.compile", no_compile)
        return
    try:
        run("torch.compile", torch.compile(cell), torch.compile(head, dynamic=True),
            "torch.compile(cell) static shapes + torch.compile(output layer + loss, dynamic=True); cold_s_per_step includes compiling")
    except Exception as e:
        na("W10", "torch.compile", "torch.compile failed: %s" % first_line(e))
        traceback.print_exc(file=sys.stderr)


def lm_sgd(torch, params):
    """W10/W16's SGD step, the gradients dropped after it"""
    with torch.no_grad():
        for p in params:
            p.sub_(p.grad, alpha=W10_LR)
            p.grad = None


def lm_timed(w, name, train_step, note):
    """W10/W16's timing (perf/w10_gru_lm.c): epochs of steps with fresh lengths,
    the first the warm-up; train_step() -> (loss, length); seconds per step,
    median of the epochs"""
    V, E, H, B, span, epoch = sizes()[w]
    reps, warm = (1, 1) if ARGS.smoke else REPS[w]
    losses, tokens = [], 0
    t0 = time.perf_counter()
    first = 0.0
    for e in range(warm):
        for _ in range(epoch):
            v, L = train_step()
            tokens += L
            losses.append(v)
            if e == 0:
                first += v / epoch
    cold = (time.perf_counter() - t0) / (warm * epoch)
    times, last = [], 0.0
    for _ in range(reps):
        t1 = time.perf_counter()
        s = 0.0
        for _ in range(epoch):
            v, L = train_step()
            tokens += L
            s += v
        times.append((time.perf_counter() - t1) / epoch)
        last = s / epoch
    srt = sorted(times)
    med = srt[len(srt) // 2] if len(srt) % 2 else 0.5 * (srt[len(srt) // 2 - 1] + srt[len(srt) // 2])
    result(w, name, med, srt[0], reps, "loss1=%.9g,loss2=%.9g" % (losses[0], losses[1]),
           steps=(warm + reps) * epoch, tokens=tokens, batch=B, hidden=H, lengths="5..%d" % (4 + span),
           cold_s_per_step="%.6g" % cold, loss_first_epoch="%.4f" % first,
           loss_last_epoch="%.4f" % last, note=note)


def lm_module_run(torch, w, rnn, head, name, note):
    """W10 (nn.GRU) or W16 (nn.LSTM) through PyTorch's module, the whole
    sequence in one call (ATen's loop: the input projection is one GEMM over
    every step).  The same model as the per-step cell: PyTorch's gates are
    r, z, n (GRU; n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n
    + z h) and i, f, g, o (LSTM), so weight_ih = Wx^T, weight_hh = Wh^T,
    bias_ih = bx, bias_hh = bh; SGD on those is the same update."""
    V, E, H, B, span, epoch = sizes()[w]
    dev = torch.device(ARGS.device)  # --device cuda: W10 on the GPU (scripts/gpu-check)
    emb_np, wx, bx, wh, bh, wout_np, bout_np = [p.copy() for p in inputs(w)]
    rnn = rnn.to(dev)
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(torch.from_numpy(wx.T.copy()))
        rnn.weight_hh_l0.copy_(torch.from_numpy(wh.T.copy()))
        rnn.bias_ih_l0.copy_(torch.from_numpy(bx))
        rnn.bias_hh_l0.copy_(torch.from_numpy(bh))
    emb_w, wout, bout = [torch.from_numpy(p).to(dev).requires_grad_(True) for p in (emb_np, wout_np, bout_np)]
    params = [emb_w, wout, bout] + list(rnn.parameters())
    state = {"step": 0}

    def train_step():
        step = state["step"]
        state["step"] += 1
        L = w10_len(step, w)
        tok = torch.from_numpy(w10_tokens(step, L, w)).to(dev)
        with torch.enable_grad():
            inputs_, targets = tok[:L].reshape(-1), tok[1:].reshape(-1)
            emb = emb_w.index_select(0, inputs_).reshape(L, B, E)
            zero = torch.zeros(1, B, H, device=dev)
            hs, _ = rnn(emb, (zero, zero) if isinstance(rnn, torch.nn.LSTM) else zero)
            loss = head(hs.reshape(L * B, H), wout, bout, targets)
            value = loss.item()
            loss.backward()
        lm_sgd(torch, params)
        return value, L

    lm_timed(w, name, train_step, note)


def run_torch_w10_gru(torch, head):
    V, E, H, B, span, epoch = sizes()["W10"]
    lm_module_run(torch, "W10", torch.nn.GRU(E, H), head, "torch.nn.GRU",
                  "torch.nn.GRU over the whole sequence (one call)")


def run_torch_w17(torch, F):
    """perf/w17_char_rnn.rb's model from Python: Embedding(V, 64), torch.nn.GRU(64,
    128, batch_first), Linear(128, V) over data/a_scandal_in_bohemia.txt's
    characters, Adam (lr 3e-3), clip_grad_norm_ 1.0, the loss read every step;
    epochs of 60 steps of batch 16, lengths 32..64, on the same windows
    (hash_u32); seconds per epoch, median of epochs after a warm-up one"""
    s = ARGS.smoke
    steps, batch, hidden, embed, lo, hi = (2, 2, 16, 8, 4, 6) if s else (60, 16, 128, 64, 32, 64)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "data", "a_scandal_in_bohemia.txt"), encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = [index[c] for c in text]
    V = len(vocab)
    torch.manual_seed(1)
    emb, gru, head = torch.nn.Embedding(V, embed), torch.nn.GRU(embed, hidden, batch_first=True), \
        torch.nn.Linear(hidden, V)
    params = list(emb.parameters()) + list(gru.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    state = {"step": 0, "first": None}

    def train_step():
        step = state["step"]
        state["step"] += 1
        L = lo + hash_u32(2 * step + 1) % (hi - lo + 1)
        starts = [hash_u32(1000003 * step + b + 7) % (len(data) - L - 1) for b in range(batch)]
        x = torch.tensor([data[t:t + L] for t in starts], dtype=torch.int64)
        y = torch.tensor([data[t + 1:t + 1 + L] for t in starts], dtype=torch.int64)
        with torch.enable_grad():
            out, _ = gru(emb(x))
            loss = F.cross_entropy(head(out).reshape(batch * L, V), y.reshape(batch * L))
            opt.zero_grad()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = loss.item()
        if state["first"] is None:
            state["first"] = value
        return value

    def epoch():
        return sum(train_step() for _ in range(steps)) / steps

    reps, warm = reps_of("W17")
    t0 = time.perf_counter()
    epoch()  # the first warm-up epoch, timed as cold_s
    cold = time.perf_counter() - t0
    med, mn, last = timed(epoch, reps, max(warm - 1, 0))
    # no check: its weights start from PyTorch's own init, so its losses are not Kiln's
    result("W17", "torch", med, mn, reps, "", steps=steps, batch=batch, hidden=hidden,
           lengths="%d..%d" % (lo, hi), cold_s="%.4g" % cold, loss_first="%.6f" % state["first"],
           loss_last_epoch="%.4f" % last,
           note="torch.nn.GRU eager, the same model and windows from Python")
    na("W17", "torch.compile", "not measured: W17's target is PyTorch eager (BENCHMARKS.md)")


def run_torch_w16(torch, F):
    """perf_w16_lstm_lm (perf/w10_gru_lm.c with KILN_W16): the LSTM written per
    time step, autograd, SGD; and torch.nn.LSTM over the whole sequence"""
    V, E, H, B, span, epoch = sizes()["W16"]

    def cell(xt, h, c, wx, bx, wh, bh):
        g = xt @ wx + bx + (h @ wh + bh)
        i, f = torch.sigmoid(g[:, :H]), torch.sigmoid(g[:, H:2 * H])
        gg, o = torch.tanh(g[:, 2 * H:3 * H]), torch.sigmoid(g[:, 3 * H:])
        c = f * c + i * gg
        return o * torch.tanh(c), c

    def head(hs_all, wout, bout, targets):
        return F.cross_entropy(hs_all @ wout + bout, targets)

    params = [torch.from_numpy(p.copy()).requires_grad_(True) for p in inputs("W16")]
    emb_w, wx, bx, wh, bh, wout, bout = params
    state = {"step": 0}

    def train_step():
        step = state["step"]
        state["step"] += 1
        L = w10_len(step, "W16")
        tok = torch.from_numpy(w10_tokens(step, L, "W16"))
        with torch.enable_grad():
            inputs_, targets = tok[:L].reshape(-1), tok[1:].reshape(-1)
            emb = emb_w.index_select(0, inputs_).reshape(L, B, E)
            h = c = torch.zeros(B, H)
            hs = []
            for t in range(L):
                h, c = cell(emb[t], h, c, wx, bx, wh, bh)
                hs.append(h)
            loss = head(torch.stack(hs).reshape(L * B, H), wout, bout, targets)
            value = loss.item()
            loss.backward()
        lm_sgd(torch, params)
        return value, L

    lm_timed("W16", "torch", train_step, "autograd, LSTM cell per time step")
    lm_module_run(torch, "W16", torch.nn.LSTM(E, H), head, "torch.nn.LSTM",
                  "torch.nn.LSTM over the whole sequence (one call)")


def run_torch_w11(torch, F, has_compile, no_compile):
    """perf/w11_transformer.c: pre-LN block, loss read, backward, SGD"""
    B, S, D, heads = sizes()["W11"]
    dh = D // heads
    x_np, params_np = inputs("W11")
    x = torch.from_numpy(x_np)

    def forward_loss(x, p):
        ln1w, ln1b, wq, bq, wk, bk, wv, bv, wo, bo, ln2w, ln2b, w1, b1, w2, b2 = p
        h = F.layer_norm(x, (D,), ln1w, ln1b, 1e-5)

        def split(t):
            return t.reshape(B, S, heads, dh).permute(0, 2, 1, 3)
        q, k, v = split(h @ wq + bq), split(h @ wk + bk), split(h @ wv + bv)
        att = torch.softmax((q @ k.transpose(2, 3)) * (1.0 / math.sqrt(dh)), dim=3)
        o = (att @ v).permute(0, 2, 1, 3).reshape(B, S, D)
        x1 = x + (o @ wo + bo)
        f = F.gelu(F.layer_norm(x1, (D,), ln2w, ln2b, 1e-5) @ w1 + b1)
        y = x1 + (f @ w2 + b2)
        return (y * y).mean()

    def run(name, fn, note):
        params = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params_np]
        with torch.no_grad():
            loss0 = fn(x, params).item()

        def iteration():
            with torch.enable_grad():
                loss = fn(x, params)
                value = loss.item()
                loss.backward()
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad, alpha=W11_LR)
                    p.grad = None
            return value
        loss1, loss2 = iteration(), iteration()
        reps, warm = reps_of("W11")
        med, mn, last = timed(iteration, reps, warm)
        result("W11", name, med, mn, reps, "loss0=%.9g,loss1=%.9g,loss2=%.9g" % (loss0, loss1, loss2),
               batch=B, seq=S, dim=D, heads=heads, loss_last="%.6g" % last, note=note)

    run("torch", forward_loss, "autograd, fwd+bwd+SGD")
    if not has_compile:
        na("W11", "torch.compile", no_compile)
        return
    try:
        run("torch.compile", torch.compile(forward_loss), "torch.compile(forward + loss); backward by AOTAutograd")
    except Exception as e:
        na("W11", "torch.compile", "torch.compile failed: %s" % first_line(e))
        traceback.print_exc(file=sys.stderr)


def run_adam_steps(torch, workload, loss_of, params_np, adam, batch):
    """a training step (loss read, backward, Adam) timed as the C programs time it:
    the same hand-written Adam as Kiln's bench_adam_step (row torch), and
    torch.optim.Adam (row torch.optim, fused when this PyTorch has it)"""
    lr, b1, b2, eps = adam

    def run(name, make_update, note):
        params = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params_np]
        update = make_update(params)
        note_text = note() if callable(note) else note

        def step():
            with torch.enable_grad():
                loss = loss_of(params)
                value = loss.item()
                loss.backward()
            update()
            return value
        loss1, loss2 = step(), step()
        reps, warm = reps_of(workload)
        med, mn, last = timed(step, reps, warm)
        result(workload, name, med, mn, reps, "loss1=%.9g,loss2=%.9g" % (loss1, loss2),
               steps=reps + warm + 2, batch=batch, loss_last="%.6g" % last, note=note_text)

    def hand_written(params):
        st = {"t": 0, "m": [torch.zeros_like(p) for p in params], "v": [torch.zeros_like(p) for p in params]}

        def update():
            with torch.no_grad():
                st["t"] += 1
                bc1, bc2 = 1.0 - b1 ** st["t"], 1.0 - b2 ** st["t"]
                for i, p in enumerate(params):
                    g = p.grad
                    st["m"][i] = b1 * st["m"][i] + (1 - b1) * g       # rebound, as in the C program
                    st["v"][i] = b2 * st["v"][i] + (1 - b2) * (g * g)
                    upd = (st["m"][i] / bc1) / (torch.sqrt(st["v"][i] / bc2) + eps)
                    p.sub_(upd, alpha=lr)
                    p.grad = None
        return update

    def optim(params):
        try:
            opt = torch.optim.Adam(params, lr=lr, betas=(b1, b2), eps=eps, fused=True)
            optim.kind = "fused=True"
        except Exception:
            opt = torch.optim.Adam(params, lr=lr, betas=(b1, b2), eps=eps)
            optim.kind = "default"

        def update():
            opt.step()
            opt.zero_grad(set_to_none=True)
        return update

    run("torch", hand_written, "the same hand-written Adam, eager")
    try:
        run("torch.optim", optim, lambda: "torch.optim.Adam(%s)" % optim.kind)
    except Exception as e:
        na(workload, "torch.optim", "torch.optim.Adam failed: %s" % first_line(e))
        traceback.print_exc(file=sys.stderr)


def run_torch_w12(torch, F, has_compile, no_compile):
    """perf/w12_adam.c: the same hand-written Adam (row torch), and torch.optim.Adam"""
    x_np, params_np, target_np = inputs("W12")
    x, target = torch.from_numpy(x_np), torch.from_numpy(target_np)

    def loss_of(p):
        h = torch.relu(x @ p[0] + p[1])
        return F.cross_entropy(h @ p[2] + p[3], target)

    run_adam_steps(torch, "W12", loss_of, params_np, W12_ADAM, x_np.shape[0])
    na("W12", "torch.compile", no_compile if not has_compile else "not measured: the peer is eager Adam")


# --- JAX -------------------------------------------------------------------------

def run_jax_lm(jax, jnp, w):
    """W10 (GRU) or W16 (LSTM) in JAX as a JAX user writes it: the cell under
    jax.lax.scan over the time steps, jax.value_and_grad, SGD, the whole step
    jitted.  Shapes are static, so each new length compiles a new executable
    (its cost shows in cold_s_per_step and the timed epochs' first sightings)."""
    V, E, H, B, span, epoch = sizes()[w]
    lstm = w == "W16"

    def loss_fn(params, tok):
        emb_w, wx, bx, wh, bh, wout, bout = params
        L = tok.shape[0] - 1
        x = emb_w[tok[:-1]]  # [L, B, E]

        def cell(carry, xt):
            g = xt @ wx + bx
            u = carry[0] @ wh + bh
            if lstm:
                h, c = carry
                s = g + u
                i, f = jax.nn.sigmoid(s[:, :H]), jax.nn.sigmoid(s[:, H:2 * H])
                gg, o = jnp.tanh(s[:, 2 * H:3 * H]), jax.nn.sigmoid(s[:, 3 * H:])
                c = f * c + i * gg
                h = o * jnp.tanh(c)
                return (h, c), h
            h = carry[0]
            r = jax.nn.sigmoid(g[:, :H] + u[:, :H])
            z = jax.nn.sigmoid(g[:, H:2 * H] + u[:, H:2 * H])
            n = jnp.tanh(g[:, 2 * H:] + r * u[:, 2 * H:])
            h = n + z * (h - n)
            return (h,), h

        zero = jnp.zeros((B, H), jnp.float32)
        _, hs = jax.lax.scan(cell, (zero, zero) if lstm else (zero,), x)
        logits = hs.reshape(L * B, H) @ wout + bout
        ls = jax.nn.log_softmax(logits, axis=1)
        return -jnp.mean(jnp.take_along_axis(ls, tok[1:].reshape(-1, 1), axis=1))

    @jax.jit
    def step(params, tok):
        loss, grads = jax.value_and_grad(loss_fn)(params, tok)
        return loss, [p - W10_LR * g for p, g in zip(params, grads)]

    state = {"step": 0, "p": [jnp.asarray(p) for p in inputs(w)]}

    def train_step():
        k = state["step"]
        state["step"] += 1
        L = w10_len(k, w)
        loss, state["p"] = step(state["p"], jnp.asarray(w10_tokens(k, L, w)))
        return float(loss), L

    lm_timed(w, "jax.jit", train_step, "jax.lax.scan over the steps, value_and_grad + SGD jitted "
             "(one executable per length)")


def run_jax(workloads):
    c = "jax.jit"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        flags += " --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=%d" % ARGS.threads
    os.environ["XLA_FLAGS"] = flags.strip()
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:
        for w in workloads:
            for ww in (["W8:W1", "W8:W7"] if w == "W8" else [w]):
                na(ww, c, "JAX not installed for %s (%s)" % (sys.executable, e.__class__.__name__))
        return
    MACHINE["threads"] = ARGS.threads
    MACHINE["isa"] = "xla-host-native"
    MACHINE["blas"] = "xla-builtin"  # XLA:CPU's own dot kernels (Eigen), not OpenBLAS

    def ready(o):
        return jax.block_until_ready(o)

    def run(w, fn, args, check_of, **extra):
        reps, warm = reps_of(w)
        jf = jax.jit(fn)
        dargs = [jnp.asarray(a) for a in args]
        med, mn, out = timed(lambda: ready(jf(*dargs)), reps, warm + 1)
        result(w, c, med, mn, reps, check_of(np.asarray(out)), **extra)

    def w1(x, y):
        return jnp.tanh(x * y + 0.5) * jax.nn.sigmoid(x) - y * y * 0.25

    def w3(x, wt, b):
        mu = jnp.mean(x, axis=1, keepdims=True)
        xc = x - mu
        var = jnp.mean(xc * xc, axis=1, keepdims=True)
        return xc * jax.lax.rsqrt(var + 1e-5) * wt + b

    def w7_parts():
        x_np, params_np, target_np = inputs("W7")
        return jax_w7_step(jax, jnp), x_np, params_np, target_np

    for w in workloads:
        try:
            if w == "W1":
                run(w, w1, inputs(w), summary, **extra_bytes(w))
            elif w == "W2":
                run(w, lambda x: jax.nn.softmax(x, axis=1), inputs(w), summary, **extra_bytes(w))
            elif w == "W3":
                run(w, w3, inputs(w), summary, **extra_bytes(w))
            elif w == "W4":
                run(w, lambda x: jnp.sum(x * x), inputs(w), lambda o: "value=%.9g" % float(o), **extra_bytes(w))
            elif w == "W5":
                (x0,) = inputs(w)

                def chain(x):
                    for k in range(W5_OPS):
                        x = x + 0.01 if k % 2 else x * 1.01
                    return x
                jf = jax.jit(chain)
                dx = jnp.asarray(x0)

                def f():
                    for _ in range(w5_chains()):
                        out = np.asarray(jf(dx))
                    return out
                reps, warm = reps_of(w)
                med, mn, out = timed(f, reps, warm + 1, w5_chains() * W5_OPS)
                result(w, c, med, mn, reps, summary(out), ops=W5_OPS, chains=w5_chains(),
                       note="the whole 100-op chain is one jitted call")
            elif w == "W6":
                run(w, jnp.matmul, inputs(w), summary, **extra_bytes(w))
            elif w in ("W10", "W16"):
                run_jax_lm(jax, jnp, w)
            elif w == "W7":
                step, x_np, params_np, target_np = w7_parts()
                jstep = jax.jit(step, donate_argnums=(0,))
                x, target = jnp.asarray(x_np), jnp.asarray(target_np)
                state = {"p": [jnp.array(p) for p in params_np]}  # copies: they are donated

                def one():
                    loss, state["p"] = jstep(state["p"], x, target)
                    return ready(loss)

                def once():
                    loss = float(one())
                    return loss, [np.asarray(p) for p in state["p"]]
                check = w7_check(once, [p.copy() for p in params_np])
                reps, warm = reps_of(w)
                med, mn, _ = timed(one, reps, warm)
                result(w, c, med, mn, reps, check, batch=x_np.shape[0], note="jax.value_and_grad + jit")
            elif w == "W8":
                # ms from first sight (trace + lower) to an executable, fresh functions
                x, y = [jnp.asarray(a) for a in inputs("W1")]
                t0 = time.perf_counter()
                jax.jit(lambda x, y: w1(x, y)).lower(x, y).compile()
                dt = time.perf_counter() - t0
                result("W8:W1", c, dt, dt, 1, "", note="trace + lower + compile, first time in this process")
                step, x_np, params_np, target_np = w7_parts()
                args = ([jnp.asarray(p) for p in params_np], jnp.asarray(x_np), jnp.asarray(target_np))
                t0 = time.perf_counter()
                jax.jit(lambda p, x, t: step(p, x, t)).lower(*args).compile()
                dt = time.perf_counter() - t0
                result("W8:W7", c, dt, dt, 1, "", note="trace + lower + compile, first time in this process")
        except Exception as e:
            na(w, c, "error: %s" % str(e).splitlines()[0][:200])
            traceback.print_exc(file=sys.stderr)


def main():
    global ARGS, np
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contender", required=True, choices=["numpy", "torch", "jax"])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--device", default="cpu", help="torch W10 only: cuda runs torch.nn.GRU there alone")
    ap.add_argument("workloads", nargs="*",
                    default=["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W10", "W11", "W12", "W14", "W16",
                             "W18"])
    ARGS = ap.parse_args()
    try:
        import numpy
        np = numpy
    except Exception as e:
        names = {"numpy": ["numpy"], "torch": ["torch", "torch.compile"], "jax": ["jax.jit"]}[ARGS.contender]
        for w in ARGS.workloads:
            for ww in (["W8:W1", "W8:W7"] if w == "W8" else [w]):
                for name in names:
                    if w == "W8" and name in ("numpy", "torch"):
                        continue
                    na(ww, name, "numpy not installed for %s" % sys.executable)
        return 0
    {"numpy": run_numpy, "torch": run_torch, "jax": run_jax}[ARGS.contender](ARGS.workloads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
