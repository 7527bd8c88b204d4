#!/usr/bin/env python3
"""perf/report_gpu.py -- the table of `scripts/bench --device cuda`: turns the
lines the perf/g*.c programs and perf/peers/gpu_peers.py printed (@result,
@na, @fail) into one table, a CSV, a PNG (matplotlib, when it imports) and a
line per workload saying whether BENCHMARKS.md's GPU target is met.

    report_gpu.py RAW --csv OUT.csv [--png OUT.png] [--summary OUT.tsv] [--header TEXT]

The limit of the memory-bound workloads (G1-G4) is the device-to-device
copy bandwidth that Kiln's own program measured in the same run (a copy of
its input, bytes read + written); torch's copy is the fallback when Kiln's
row has none.  Exit status: 0, or 1 if a Kiln program failed or a Kiln row
disagrees with the reference summary.  Standard library only (plus
matplotlib for the chart); the parsing and agreement rules are report.py's.
"""
import argparse
import csv
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (perf/report.py: parse, agree, fnum)

ORDER = ["kiln", "kiln-autodiff", "torch", "torch.compile", "jax.jit"]
PEERS = ["torch", "torch.compile", "jax.jit"]
WORKLOADS = ["G1", "G1h", "G2", "G2h", "G3", "G3h", "G4", "G4h", "G5", "G6", "G6h", "G7", "G7h", "G8", "G8:W1",
             "G8:W7", "G8:warm", "G9:1024", "G9:4096", "G9h:1024", "G9h:4096"]
TITLES = {
    "G1": "G1 tanh(x*y+0.5)*sigmoid(x)-y*y*0.25, 2^27 f32",
    "G2": "G2 softmax rows, 16384x4096",
    "G3": "G3 layer_norm rows, 16384x4096",
    "G4": "G4 sum(x*x), 2^27",
    "G5": "G5 replay of a cached 100-op trace on 16 elements, values read back",
    "G6": "G6 matmul 8192^3 f32, TF32 off",
    "G1h": "G1h G1 in bf16",
    "G2h": "G2h G2 in bf16",
    "G3h": "G3h G3 in bf16",
    "G4h": "G4h G4 in bf16",
    "G6h": "G6h matmul 8192^3 bf16 (f32 sums)",
    "G7": "G7 MLP training step 784-1024-1024-10, batch 512",
    "G7h": "G7h G7's step under bf16 autocast (f32 parameters)",
    "G8": "G8 NVRTC compile, cold cache: ms per kernel",
    "G9": "G9 attention fwd+bwd, head size 64, 16384 tokens (TFLOP/s by FlashAttention's count)",
    "G9h": "G9h G9 in bf16",
}
# the CPU workload of the same math: its agreement tolerance (report.TOLERANCE)
SAME_AS = {"G1": "W1", "G2": "W2", "G3": "W3", "G4": "W4", "G5": "W5", "G6": "W6", "G7": "W7", "G1h": "W1h",
           "G2h": "W2h", "G3h": "W3h", "G4h": "W4h", "G6h": "W6h", "G7h": "W7h"}
MEMORY_BOUND = {"G1", "G2", "G3", "G4", "G1h", "G2h", "G3h", "G4h"}
G5_BUDGET_S = 20e-6   # a replay in <= 20 µs
G8_BUDGET_S = 60e-3   # <= 60 ms per kernel
# BENCHMARKS.md "GPU" targets: a share of the limit (copy bandwidth, or
# G5's 20 µs budget) and/or a speedup over named peers (peer time / kiln time)
TARGETS = {
    "G1": {"of_limit": 0.85, "peers": {"torch.compile": 1.0}, "text": ">= 0.85 of copy bandwidth; >= torch.compile"},
    "G2": {"of_limit": 0.75, "peers": {"torch.compile": 1.0}, "text": ">= 0.75 of copy bandwidth; >= torch.compile"},
    "G3": {"of_limit": 0.75, "peers": {"torch.compile": 1.0}, "text": ">= 0.75 of copy bandwidth; >= torch.compile"},
    "G4": {"of_limit": 0.85, "peers": {}, "text": ">= 0.85 of copy bandwidth"},
    "G5": {"of_limit": 1.0, "peers": {}, "text": "a replay in <= 20 us"},
    "G6": {"of_limit": None, "peers": {"torch": 0.95}, "text": ">= 0.95x torch.matmul (TF32 off)"},
    "G7": {"of_limit": None, "peers": {"torch": 1.5, "torch.compile": 1.0}, "text": ">= 1.5x PyTorch eager; >= torch.compile"},
    # issue 41: memory-bound work in bf16 >= 1.6x Kiln's own f32 time and >= PyTorch's bf16 (W2h-W4h's
    # rule); bf16 GEMM >= 0.9x torch's bf16 matmul; the bf16 step >= 1.3x Kiln's own f32 G7
    "G1h": {"of_limit": None, "peers": {"torch": 1.0}, "over": ("G1", 1.6), "text": ">= 1.6x Kiln's G1; >= torch in bf16"},
    "G2h": {"of_limit": None, "peers": {"torch": 1.0}, "over": ("G2", 1.6), "text": ">= 1.6x Kiln's G2; >= torch in bf16"},
    "G3h": {"of_limit": None, "peers": {"torch": 1.0}, "over": ("G3", 1.6), "text": ">= 1.6x Kiln's G3; >= torch in bf16"},
    "G4h": {"of_limit": None, "peers": {"torch": 1.0}, "over": ("G4", 1.6), "text": ">= 1.6x Kiln's G4; >= torch in bf16"},
    "G6h": {"of_limit": None, "peers": {"torch": 0.9}, "text": ">= 0.9x torch.matmul in bf16"},
    "G7h": {"of_limit": None, "peers": {}, "over": ("G7", 1.3), "text": ">= 1.3x Kiln's f32 G7"},
    "G8": {"text": "<= 60 ms per kernel; a warm start compiles 0 kernels"},
    # BENCHMARKS.md: >= 0.7x PyTorch's SDPA (its flash kernel: bf16, G9h); f32 against its memory-efficient one
    "G9:1024": {"of_limit": None, "peers": {"torch": 0.7}, "text": ">= 0.7x torch SDPA (memory-efficient, f32)"},
    "G9:4096": {"of_limit": None, "peers": {"torch": 0.7}, "text": ">= 0.7x torch SDPA (memory-efficient, f32)"},
    "G9h:1024": {"of_limit": None, "peers": {"torch": 0.7}, "text": ">= 0.7x torch SDPA (flash, bf16)"},
    "G9h:4096": {"of_limit": None, "peers": {"torch": 0.7}, "text": ">= 0.7x torch SDPA (flash, bf16)"},
}


def base(w):
    return w.split(":")[0]


def num(d, k):
    try:
        return float(d[k])
    except (KeyError, TypeError, ValueError):
        return None


def value_of(w, d, t):
    """the median shown, in the workload's unit"""
    if w == "G5":
        return t * 1e6, "us/replay"
    if w in ("G6", "G6h") or base(w) in ("G9", "G9h"):
        f = num(d, "flops")
        return (f / t / 1e12 if f else None), "TFLOP/s"
    if w == "G8:warm":
        return num(d, "kernels_compiled"), "kernels compiled"
    if base(w) == "G8":
        return t * 1e3, "ms/kernel"
    if w in ("G7", "G7h"):
        return t * 1e3, "ms/step"
    return t * 1e3, "ms"


def copy_limit(raw):
    """per memory-bound workload: the copy bandwidth (GB/s) and whose it is"""
    out = {}
    for who in ("kiln", "torch"):
        for d in raw:
            w = d.get("workload")
            if d["kind"] == "result" and d.get("contender") == who and w in MEMORY_BOUND and w not in out:
                gbs = num(d, "copy_gbs")
                if gbs:
                    out[w] = (gbs, who)
    return out


def build(raw):
    limits = copy_limit(raw)
    table = []
    for d in raw:
        w, c = d.get("workload", "?"), d.get("contender", "?")
        r = {"workload": w, "contender": c, "status": d["kind"], "note": d.get("note", ""), "check": d.get("check", ""),
             "reps": d.get("reps", ""), "time_s": None, "value": None, "unit": "", "of_limit": None, "limit": "",
             "vs_kiln": None, "copy_gbs": d.get("copy_gbs", ""), "bytes": d.get("bytes", ""),
             "flops": d.get("flops", ""), "device": d.get("device", ""), "version": d.get("isa", ""),
             "launches": d.get("launches_per_eval", d.get("launches_per_replay", d.get("launches_per_step", ""))),
             "fields": d}
        if d["kind"] == "result":
            r["status"] = "ok"
            t = float(d["time_s"])
            r["time_s"] = t
            r["value"], r["unit"] = value_of(w, d, t)
            if w in limits and num(d, "bytes"):
                gbs, who = limits[w]
                r["of_limit"] = num(d, "bytes") / (gbs * 1e9) / t
                r["limit"] = "copy %.0f GB/s (%s)" % (gbs, who)
            elif w == "G5":
                r["of_limit"], r["limit"] = G5_BUDGET_S / t, "20 us"
            elif w in ("G8:W1", "G8:W7"):
                r["of_limit"], r["limit"] = G8_BUDGET_S / t, "60 ms/kernel"
        elif d["kind"] == "fail":
            r["status"] = "FAILED"
        table.append(r)

    for w in sorted({r["workload"] for r in table}):
        rows = [r for r in table if r["workload"] == w]
        kiln, ref = report.judge(rows, SAME_AS.get(base(w), w), "vs_kiln", ratios=w != "G8:warm")
        # Kiln is the reference; when two peers or more check it and all disagree, the odd one out is Kiln
        judged = [r for r in rows if r is not ref and r.get("agree") and not r["contender"].startswith("kiln")]
        if ref is kiln and kiln is not None and len(judged) >= 2 and all(r["status"] == "MISMATCH" for r in judged):
            kiln["status"] = "MISMATCH"
            kiln["agree"] = "MISMATCH: every peer (%s) disagrees" % ", ".join(r["contender"] for r in judged)
    ckey = {c: i for i, c in enumerate(ORDER)}
    wkey = {w: i for i, w in enumerate(WORKLOADS)}
    table.sort(key=lambda r: (wkey.get(r["workload"], 99), r["workload"], ckey.get(r["contender"], 99), r["contender"]))
    return table, report.kiln_failed(table)


def ok_row(rows, contender):
    return next((r for r in rows if r["contender"] == contender and r["status"] == "ok"), None)


def g8_verdict(table):
    rows = [r for r in table if base(r["workload"]) == "G8"]
    parts, fails, missing = [], [], []
    for w in ("G8:W1", "G8:W7"):
        r = ok_row([x for x in rows if x["workload"] == w], "kiln")
        if r is None:
            missing.append(w)
            continue
        parts.append("%s %s ms/kernel (%s kernels, %s)" % (w[3:], report.fnum(r["value"]), r["fields"].get("kernels", "?"),
                                                           r["fields"].get("source", "?")))
        if r["time_s"] > G8_BUDGET_S:
            fails.append(w)
    warm = ok_row([x for x in rows if x["workload"] == "G8:warm"], "kiln")
    if warm is None:
        missing.append("G8:warm")
    else:
        parts.append("warm start compiled %s (%s loaded from disk)" % (report.fnum(warm["value"]),
                                                                       warm["fields"].get("disk_loads", "?")))
        if warm["value"] != 0:
            fails.append("G8:warm")
    return "; ".join(parts) or "no Kiln row", verdict(fails, missing)


def verdict(fails, missing):
    if fails:
        return "NOT met (%s)" % ", ".join(fails)
    if missing:
        return "unknown (no %s)" % ", ".join(missing)
    return "met"


def summaries(table):
    """per workload: (kiln text, best peer text, target text, verdict)"""
    out = []
    for w in ["G1", "G1h", "G2", "G2h", "G3", "G3h", "G4", "G4h", "G5", "G6", "G6h", "G7", "G7h", "G8", "G9:1024",
              "G9:4096", "G9h:1024", "G9h:4096"]:
        rows = [r for r in table if (r["workload"] if w.startswith("G9") else base(r["workload"])) == w]
        if not rows:
            continue
        tgt = TARGETS[w]
        if w == "G8":
            kiln_text, v = g8_verdict(table)
            out.append((w, kiln_text, "none (Kiln's own compiler)", tgt["text"], v))
            continue
        kiln = next((r for r in rows if r["contender"] == "kiln" and r["status"] in ("ok", "MISMATCH")), None)
        peers = [r for r in rows if r["contender"] in PEERS and r["status"] in ("ok", "MISMATCH")]
        best = min(peers, key=lambda r: r["time_s"]) if peers else None
        if kiln is None:
            why = next((r["note"] or r["status"] for r in rows if r["contender"] == "kiln"), "no row")
            out.append((w, "kiln: %s" % why[:120], best_text(best, None), tgt["text"], "unknown (no Kiln result)"))
            continue
        ktext = "%s %s" % (report.fnum(kiln["value"]), kiln["unit"])
        if kiln["of_limit"] is not None:
            ktext += " = %s of %s" % (report.fnum(kiln["of_limit"]), "copy" if w in MEMORY_BOUND else "the 20 us budget")
        fails, missing = [], []
        if tgt["of_limit"] is not None:
            if kiln["of_limit"] is None:
                missing.append("limit")
            elif kiln["of_limit"] < tgt["of_limit"] and w == "G5":
                fails.append("%s us > 20 us" % report.fnum(kiln["value"]))
            elif kiln["of_limit"] < tgt["of_limit"]:
                fails.append("%s of copy < %s" % (report.fnum(kiln["of_limit"]), tgt["of_limit"]))
        for p, need in tgt["peers"].items():
            pr = ok_row(rows, p) or next((r for r in rows if r["contender"] == p and r["status"] == "MISMATCH"), None)
            if pr is None:
                missing.append(p)
            elif pr["time_s"] / kiln["time_s"] < need:
                fails.append("%sx %s < %s" % (report.fnum(pr["time_s"] / kiln["time_s"]), p, need))
        if tgt.get("over"):  # Kiln against its own row of another workload
            other, need = tgt["over"]
            o = ok_row([r for r in table if r["workload"] == other], "kiln")
            if o is None:
                missing.append("kiln's %s" % other)
            elif o["time_s"] / kiln["time_s"] < need:
                fails.append("%sx Kiln's %s < %s" % (report.fnum(o["time_s"] / kiln["time_s"]), other, need))
        if kiln["status"] == "MISMATCH":
            fails.append("Kiln's result disagrees with the peers")
        out.append((w, ktext, best_text(best, kiln), tgt["text"], verdict(fails, missing)))
    return out


def best_text(best, kiln):
    if best is None:
        return "no peer result"
    t = "%s %s %s" % (best["contender"], report.fnum(best["value"]), best["unit"])
    if kiln is not None:
        t += " (kiln %sx)" % report.fnum(best["time_s"] / kiln["time_s"])
    return t


def print_table(table, header):
    if header:
        print(header)
    print("of limit = limit time / time: G1-G4 the copy bandwidth (1.00 = at it), G5 20 us a replay,"
          " G8 60 ms a kernel (>= 1 meets it)")
    print("vs kiln  = this contender's time / kiln's time: above 1, Kiln is faster; below 1, slower")
    print()
    cols = ["workload", "contender", "median", "of limit", "vs kiln", "check", "launches", "device / version"]
    lines = []
    for r in table:
        st = r["status"]
        chk = {"ok": "ok", "MISMATCH": "MISMATCH", "FAILED": "FAILED", "na": "n/a"}.get(st, st)
        if st == "ok" and r.get("agree") == "reference":
            chk = "ref"
        elif st == "ok" and not r.get("agree"):
            chk = "-"
        med = "n/a" if st == "na" else "FAILED" if st == "FAILED" else "%s %s" % (report.fnum(r["value"], 4), r["unit"])
        lines.append([r["workload"], r["contender"], med,
                      report.fnum(r["of_limit"], 3) if r["of_limit"] is not None else "",
                      report.fnum(r["vs_kiln"], 3) if r["vs_kiln"] is not None else "", chk, r["launches"],
                      " ".join(x for x in (r["version"] if not r["contender"].startswith("kiln") else "", r["device"]) if x)[:60]])
    width = [max([len(c)] + [len(l[i]) for l in lines]) for i, c in enumerate(cols)]
    fmt = "  ".join("%%-%ds" % wd for wd in width)
    print(fmt % tuple(cols))
    print("  ".join("-" * wd for wd in width))
    prev = None
    for r, l in zip(table, lines):
        if prev is not None and base(r["workload"]) != prev:
            print()
        prev = base(r["workload"])
        print((fmt % tuple(l)).rstrip())
    limits = sorted({(r["workload"], r["limit"]) for r in table if r["limit"] and r["workload"] in MEMORY_BOUND})
    if limits:
        print("\nlimits: " + "; ".join("%s %s" % wl for wl in limits))
    mism = [(r["workload"], r["contender"], r["agree"]) for r in table if r["status"] == "MISMATCH"]
    if mism:
        print("\nmismatches:")
        for w, c, a in mism:
            print("  %-8s %-14s %s" % (w, c, a))
    notes = [(r["workload"], r["contender"], r["note"]) for r in table if r["note"]]
    if notes:
        print("\nnotes:")
        for w, c, n in notes:
            print("  %-8s %-14s %s" % (w, c, n))
    print("\ntargets (BENCHMARKS.md, GPU):")
    for w, k, b, t, v in summaries(table):
        print("  %-3s %s: %s\n      kiln %s; best peer %s" % (w, t, v, k, b))


def write_csv(table, path, run):
    fields = ["workload", "contender", "status", "median", "unit", "time_s", "reps", "of_limit", "limit", "vs_kiln",
              "copy_gbs", "bytes", "flops", "launches", "device", "version", "agreement", "check", "note", "run"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f)
        wr.writerow(fields)
        for r in table:
            g = lambda v, fmt="%.6g": fmt % v if v is not None else ""  # noqa: E731
            wr.writerow([r["workload"], r["contender"], "n/a" if r["status"] == "na" else r["status"], g(r["value"]),
                         r["unit"], g(r["time_s"]), r["reps"], g(r["of_limit"], "%.4f"), r["limit"],
                         g(r["vs_kiln"], "%.4f"), r["copy_gbs"], r["bytes"], r["flops"], r["launches"], r["device"],
                         r["version"], r.get("agree", ""), r["check"], r["note"], run])


COLORS = {"kiln": "#e76f51", "kiln-autodiff": "#c1121f", "torch": "#457b9d", "torch.compile": "#1d3557",
          "jax.jit": "#8e7dbe"}


def plot(table, path, header):
    import contextlib
    import io
    said = io.StringIO()
    try:  # a matplotlib built for another numpy prints pages of warnings: one line says it
        with contextlib.redirect_stderr(said):
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
    except Exception as e:
        print("chart: matplotlib does not import for %s (%s: %s); no PNG written"
              % (sys.executable, e.__class__.__name__, str(e).strip().splitlines()[0][:120] if str(e).strip() else ""))
        return False
    panels = [w for w in TITLES if any(base(r["workload"]) == w and r["workload"] != "G8:warm" for r in table)]
    if not panels:
        return False
    ncols = 2 if len(panels) > 1 else 1
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 2.8 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, w in zip(axes.flat, panels):
        rows = [r for r in table if base(r["workload"]) == w and r["workload"] != "G8:warm"]
        labels = [r["contender"] + (" (%s)" % r["workload"].split(":")[1] if ":" in r["workload"] else "") for r in rows]
        vals = [r["value"] if r["value"] is not None and r["status"] in ("ok", "MISMATCH") else 0.0 for r in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, vals, color=[COLORS.get(r["contender"], "#999999") for r in rows], edgecolor="black", linewidth=0.4)
        vmax = max(vals) if any(vals) else 1.0
        for yy, v, r in zip(y, vals, rows):
            t = ("n/a" if r["status"] == "na" else r["status"]) if not v else report.fnum(v, 3)
            if v and r["of_limit"] is not None:
                t += "  (%s of limit)" % report.fnum(r["of_limit"], 2)
            ax.text(v + vmax * 0.01, yy, t, va="center", fontsize=8)
        # the limit or target as a line, in the panel's unit
        kiln = next((r for r in rows if r["of_limit"] is not None and r["value"]), None)
        if kiln is not None:
            line = kiln["value"] * kiln["of_limit"]
            ax.axvline(line, color="black", linestyle="--", linewidth=1)
            ax.text(line, len(rows) - 0.45, " %s %s" % ("limit" if w in MEMORY_BOUND else "target", report.fnum(line, 3)),
                    fontsize=7, va="bottom")
            vmax = max(vmax, line)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlim(0, vmax * 1.45)
        unit = next((r["unit"] for r in rows if r["unit"]), "")
        better = "higher is better" if unit == "TFLOP/s" else "lower is better"
        ax.set_title("%s\n%s, %s" % (TITLES[w], unit, better), fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(header.splitlines()[0] if header else "Kiln GPU benchmarks", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png")
    ap.add_argument("--summary", help="a line per workload: workload, kiln, best peer, target, verdict (tab-separated)")
    ap.add_argument("--header", default="")
    a = ap.parse_args()
    _, raw = report.parse(a.raw)
    table, bad = build(raw)
    print_table(table, a.header)
    write_csv(table, a.csv, a.header)
    print("\ncsv: %s" % a.csv)
    if a.summary:
        with open(a.summary, "w", encoding="utf-8") as f:
            for s in summaries(table):
                f.write("\t".join(s) + "\n")
    if a.png and plot(table, a.png, a.header):
        print("chart: %s" % a.png)
    if bad:
        print("report: a Kiln program failed, or a Kiln row disagrees with the reference", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
