#!/usr/bin/env python3
"""perf/report.py -- turns the lines the perf/ programs and perf/peers.py
printed (@limit, @result, @na, @fail) into the table scripts/bench prints, a
CSV, and a PNG bar chart (matplotlib, when it is installed).

    report.py RAW --csv OUT.csv [--png OUT.png] [--header TEXT]

Exit status: 0, or 1 if a Kiln program failed or kiln-eager and kiln disagree.
Uses the standard library only, apart from matplotlib for the chart.
"""
import argparse
import csv
import math
import sys

ORDER = ["kiln-eager", "kiln", "kiln-autodiff", "openblas", "numpy", "torch", "torch.nn.GRU", "torch.nn.LSTM",
         "torch.optim", "torch.compile", "jax.jit"]
WORKLOADS = ["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8:W1", "W8:W7", "W8:warm", "W10", "W11", "W12", "W13",
             "W13:exit", "W14", "W14:cnn", "W16", "W17", "W18:infer", "W18:train", "W2h", "W3h", "W4h", "W6h", "W7h",
             "W18h:infer", "W18h:train"]
TITLES = {
    "W1": "W1 tanh(x*y+0.5)*sigmoid(x)-y*y*0.25, 2^24",
    "W2": "W2 softmax rows, 4096x1024",
    "W3": "W3 layer_norm rows, 4096x1024",
    "W4": "W4 sum(x*x), 2^24",
    "W5": "W5 100 scalar ops on 16 elements",
    "W6": "W6 matmul 1024^3",
    "W7": "W7 MLP train step, batch 512",
    "W8": "W8 compile: ms per kernel (first sight to compiled plan)",
    "W10": "W10 GRU LM, autodiff + SGD, lengths 5..40, batch 32, hidden 128",
    "W11": "W11 pre-LN transformer block fwd+bwd+SGD (4 heads, dim 128, seq 64, batch 8)",
    "W12": "W12 MLP 784-256-10 with hand-written Adam, batch 128",
    "W13": "W13 the demo (mlp_digits) from a cold cache: whole process",
    "W13:exit": "W13 exit: main's return to process end",
    "W14": "W14 conv2d 3x3 fwd+bwd (x, w, b), batch 32, 64->64 channels, 56x56",
    "W14:cnn": "W14 the digits CNN training step (conv-relu-pool x2, linear, Adam), batch 64",
    "W16": "W16 LSTM LM, autodiff + SGD, lengths 5..400, batch 32, hidden 128",
    "W17": "W17 char GRU LM from Ruby (Embedding, GRU 128, Linear; Adam), one epoch: 60 steps, batch 16, lengths 32..64",
    "W18:infer": "W18 BERT encoder (6x384, 12 heads) inference, batch 32 x 128 tokens (padded)",
    "W18:train": "W18 BERT encoder fine-tuning step (fwd, loss, bwd, SGD), batch 32 x 128",
    "W2h": "W2h softmax rows in bf16, 4096x1024",
    "W3h": "W3h layer_norm rows in bf16, 4096x1024",
    "W4h": "W4h sum(x*x) in bf16, 2^24",
    "W6h": "W6h matmul 1024^3 in bf16 (f32 accumulation)",
    "W7h": "W7h MLP train step in bf16 mixed precision (autocast, f32 parameters), batch 512",
    "W18h:infer": "W18h W18's inference under bf16 autocast (f32 parameters)",
    "W18h:train": "W18h W18's fine-tuning step under bf16 autocast (f32 parameters)",
}
# how a row's median is shown: unit, value from the median seconds, higher is better
UNITS = {"W1": "ms", "W2": "ms", "W3": "ms", "W4": "ms", "W5": "us/op", "W6": "GFLOP/s",
         "W7": "steps/s", "W8": "ms", "W10": "steps/s", "W11": "ms", "W12": "ms", "W13": "s",
         "W13:exit": "ms", "W14": "ms", "W14:cnn": "ms", "W16": "steps/s", "W17": "s", "W18": "ms",
         "W2h": "ms", "W3h": "ms", "W4h": "ms", "W6h": "GFLOP/s", "W7h": "steps/s", "W18h": "ms"}
# higher-is-better units: the value is 1 / time or work / time
RATE_UNITS = ("GFLOP/s", "steps/s")
# the fields of a row's line shown under the table (and in the CSV's details)
DETAILS = {
    "W10": ["compile_ms", "kernels", "plans", "disk_hits", "traces_seen", "traces_timed", "families",
            "cold_s_per_step", "loss_first_epoch", "loss_last_epoch", "steps"],
    "W16": ["compile_ms", "kernels", "plans", "traces_seen", "traces_timed", "families", "cold_s_per_step",
            "loss_first_epoch", "loss_last_epoch", "steps"],
    "W17": ["cold_s", "kernels", "traces_seen", "loops_rolled", "loss_first", "loss_last_epoch"],
    "W11": ["blas_per_iter", "blas_fwd", "compile_ms", "kernels", "disk_hits", "traces_seen"],
    "W12": ["traces_timed", "compiles_timed", "compile_ms", "kernels", "disk_hits", "loss_last"],
    "W13": ["train_s", "exit_ms", "compiles", "compile_ms"],
}
MEMORY_BOUND = {"W1", "W2", "W3", "W4", "W2h", "W3h", "W4h"}
# agreement tolerance of the result summaries, relative (see agree())
TOLERANCE = {"W1": 1e-4, "W2": 1e-4, "W3": 1e-4, "W4": 1e-4, "W5": 1e-5, "W6": 1e-4, "W7": 1e-3,
             "W10": 1e-3, "W16": 1e-3, "W11": 1e-3, "W12": 1e-3, "W13": 0.02, "W14": 1e-3, "W18": 1e-3,
             "W1h": 1e-2, "W2h": 1e-2, "W3h": 1e-2, "W4h": 1e-2, "W6h": 1e-2, "W7h": 1e-2, "W18h": 5e-2,
             # GPU attention's dq (perf/report_gpu.py): sums of T terms; in bf16, Kiln computes in
             # f32 and rounds once while a peer may keep bf16 intermediates (torch's math path)
             "G9": 1e-3, "G9h": 5e-2}


def unit_of(w):
    return UNITS.get(w, UNITS.get(base(w), ""))


def panel_of(w):
    """the chart panel a row goes to: its base workload, W13's exit time on its own"""
    return w if w in UNITS else base(w)


def base(w):
    return w.split(":")[0]


def parse(path):
    limit, rows, fails = None, [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.startswith("@"):
                continue
            kind, *fields = line.split("\t")
            d = {}
            for fld in fields:
                k, _, v = fld.partition("=")
                d[k] = v
            if kind == "@limit":
                limit = d
            elif kind in ("@result", "@na", "@fail"):
                d["kind"] = kind[1:]
                rows.append(d)
    return limit, best_of_runs(rows)


def best_of_runs(rows):
    """A peer run more than once (PyTorch under each OpenMP wait policy) keeps
    its fastest result per (workload, contender); a result beats an n/a or a
    failure of the same row in another run.  Kiln's rows are run once."""
    kept, order = {}, []
    for d in rows:
        k = (d.get("workload"), d.get("contender"))
        if k not in kept:
            kept[k] = d
            order.append(k)
            continue
        old = kept[k]
        if d["kind"] == "result" and (old["kind"] != "result" or
                                      float(d["time_s"]) < float(old["time_s"])):
            kept[k] = d
    return [kept[k] for k in order]


def parse_check(s):
    out = {}
    for part in (s or "").split(","):
        k, _, v = part.partition("=")
        if k and v:
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def agree(w, a, b):
    """returns the fields on which two summaries disagree"""
    tol = TOLERANCE.get(base(w), 1e-3)
    bad = []
    keys = [k for k in a if k in b]
    if "abs" in a and "abs" in b:  # bench_summary_f32: scale sums by the L1 norm
        if a.get("n") != b.get("n"):
            return ["n"]
        l1 = max(a["abs"], b["abs"], 1e-30)
        mean_mag = l1 / max(a["n"], 1)
        for k in keys:
            if k == "n":
                continue
            if k in ("sum", "wsum"):
                ok = abs(a[k] - b[k]) <= tol * l1
            else:
                ok = abs(a[k] - b[k]) <= tol * max(abs(a[k]), abs(b[k])) + tol * mean_mag
            if not ok:
                bad.append(k)
    else:
        for k in keys:
            if abs(a[k] - b[k]) > tol * max(abs(a[k]), abs(b[k])) + 1e-30:
                bad.append(k)
    if not keys:
        bad.append("no common fields")
    return bad


def judge(rows, tol_w, ratio_key, ratios=True):
    """One workload's rows: each ok row's time over Kiln's (r[ratio_key],
    unless ratios is false) and whether its check agrees, within workload
    tol_w's tolerance, with the reference: Kiln's row, else the first ok
    row with a check.  A row that disagrees becomes MISMATCH.  Returns
    (kiln, ref); either may be None."""
    kiln = next((r for r in rows if r["contender"] == "kiln" and r["status"] == "ok"), None)
    ref = kiln if kiln and kiln["check"] else next((r for r in rows if r["status"] == "ok" and r["check"]), None)
    for r in rows:
        if r["status"] != "ok":
            continue
        if ratios and kiln and kiln["time_s"]:
            r[ratio_key] = r["time_s"] / kiln["time_s"]
        if ref is None or r is ref or not r["check"]:
            r["agree"] = "reference" if r is ref else ""
            continue
        bad = agree(tol_w, parse_check(ref["check"]), parse_check(r["check"]))
        if bad:
            r["status"] = "MISMATCH"
            r["agree"] = "MISMATCH vs %s on %s" % (ref["contender"], ",".join(bad))
        else:
            r["agree"] = "agrees with %s" % ref["contender"]
    return kiln, ref


def kiln_failed(table):
    """whether a Kiln row failed or disagrees with its reference"""
    return any(r["status"] in ("FAILED", "MISMATCH") and r["contender"].startswith("kiln") for r in table)


def fnum(v, digits=3):
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return ""
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    if mag >= digits:
        return "%.0f" % v
    return "%.*f" % (max(0, digits - 1 - mag), v)


def build(limit, raw):
    gbs = float(limit["best_gbs"]) if limit and limit.get("best_gbs") else None
    table = []
    for d in raw:
        w, c = d.get("workload", "?"), d.get("contender", "?")
        r = {"workload": w, "contender": c, "status": d["kind"], "note": d.get("note", ""),
             "threads": d.get("threads", ""), "isa": d.get("isa", ""), "blas": d.get("blas", ""),
             "reps": d.get("reps", ""), "check": d.get("check", ""), "time_s": None,
             "value": None, "unit": unit_of(w), "limit_s": None, "of_limit": None,
             "kiln_speedup": None, "bytes": d.get("bytes", ""), "flops": d.get("flops", ""),
             "peak_mib": d.get("peak_mib", ""),
             "details": ";".join("%s=%s" % (k, d[k]) for k in DETAILS.get(base(w), []) + ["omp_wait"]
                                 if k in d)}
        if d["kind"] == "result":
            r["status"] = "ok"
            t = float(d["time_s"])
            r["time_s"] = t
            u = base(w)
            if u == "W5":
                r["value"] = t * 1e6
            elif u in ("W6", "W6h"):
                r["value"] = float(d["flops"]) / t / 1e9 if d.get("flops") else None
            elif u in ("W7", "W7h", "W10", "W16"):
                r["value"] = 1.0 / t
            elif w in ("W13", "W17"):
                r["value"] = t
            else:
                r["value"] = t * 1e3
            if u in MEMORY_BOUND and gbs and d.get("bytes"):
                r["limit_s"] = float(d["bytes"]) / (gbs * 1e9)
                r["of_limit"] = r["limit_s"] / t
        elif d["kind"] == "fail":
            r["status"] = "FAILED"
        table.append(r)

    # ratios to kiln, and the agreement of results with Kiln's
    for w in sorted({r["workload"] for r in table}):
        judge([r for r in table if r["workload"] == w], w, "kiln_speedup")
    key = {c: i for i, c in enumerate(ORDER)}
    wkey = {w: i for i, w in enumerate(WORKLOADS)}
    table.sort(key=lambda r: (wkey.get(r["workload"], 99), r["workload"], key.get(r["contender"], 99), r["contender"]))
    return table, kiln_failed(table)


def median_text(r):
    if r["status"] in ("n/a", "na"):
        return "n/a"
    if r["status"] == "FAILED":
        return "FAILED"
    return "%s %s" % (fnum(r["value"], 4), r["unit"])


def print_table(table, limit, header):
    if header:
        print(header)
    if limit:
        print("limit: STREAM triad %s GB/s best (median %s GB/s), %s threads, 3 x %s MiB arrays"
              % (limit.get("best_gbs"), limit.get("median_gbs"), limit.get("threads"), limit.get("array_mib")))
    print("of limit = (bytes that must move / triad bandwidth) / time: 1.00 is at the limit (W1-W4 only)")
    print("vs kiln  = this contender's time / kiln's time: above 1, Kiln is faster; below 1, slower")
    print("peak MiB = the process's peak resident set over the row's runs (Linux VmHWM, reset after each row:")
    print("           what the process still holds from its earlier rows counts; W18:train's holds the model)")
    print()
    cols = ["workload", "contender", "median", "of limit", "vs kiln", "peak MiB", "check", "threads", "isa",
            "blas"]
    lines = []
    for r in table:
        status = r["status"]
        chk = {"ok": "ok", "MISMATCH": "MISMATCH", "FAILED": "FAILED", "na": "n/a"}.get(status, status)
        if status == "ok" and r.get("agree") == "reference":
            chk = "ref"
        elif status == "ok" and not r.get("agree"):
            chk = "-"
        lines.append([r["workload"], r["contender"], "n/a" if status == "na" else median_text(r),
                      fnum(r["of_limit"], 3) if r["of_limit"] is not None else ("" if status == "na" else "-"),
                      fnum(r["kiln_speedup"], 3) if r["kiln_speedup"] is not None else "",
                      "%.0f" % float(r["peak_mib"]) if r.get("peak_mib") else "", chk, str(r["threads"]), r["isa"], r["blas"]])
    width = [max(len(c), *(len(l[i]) for l in lines)) if lines else len(c) for i, c in enumerate(cols)]
    fmt = "  ".join("%%-%ds" % wd for wd in width)
    print(fmt % tuple(cols))
    print("  ".join("-" * wd for wd in width))
    prev = None
    for r, l in zip(table, lines):
        if prev is not None and base(r["workload"]) != prev:
            print()
        prev = base(r["workload"])
        print(fmt % tuple(l))
    details = [(r["workload"], r["contender"], r["details"]) for r in table if r.get("details")]
    notes = [(r["workload"], r["contender"], r["note"]) for r in table if r["note"]]
    mism = [(r["workload"], r["contender"], r["agree"]) for r in table if r["status"] == "MISMATCH"]
    if mism:
        print("\nmismatches:")
        for w, c, a in mism:
            print("  %-6s %-14s %s" % (w, c, a))
    if details:
        print("\ndetails (W10-W17):")
        for w, c, dt in details:
            print("  %-8s %-14s %s" % (w, c, dt.replace(";", "  ")))
    if notes:
        print("\nnotes:")
        for w, c, n in notes:
            print("  %-6s %-14s %s" % (w, c, n))


def earlier_rows(path, fields, replaced):
    """the rows of an earlier CSV whose workloads this run did not measure"""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error):
        return []
    return [[r.get(k, "") for k in fields] for r in rows if base(r.get("workload", "")) not in replaced]


def write_csv(table, limit, path, run):
    """this run's rows, after the rows of the workloads it did not run (kept
    from the file's earlier runs, which their run column names)"""
    fields = ["workload", "contender", "status", "median", "unit", "time_s", "reps", "limit_s",
              "of_limit", "kiln_speedup", "threads", "isa", "blas", "triad_gbs", "bytes", "flops",
              "peak_mib", "agreement", "check", "details", "note", "run"]
    kept = earlier_rows(path, fields, {base(r["workload"]) for r in table})
    with open(path, "w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f)
        wr.writerow(fields)
        wr.writerows(kept)
        for r in table:
            wr.writerow([r["workload"], r["contender"], "n/a" if r["status"] == "na" else r["status"],
                         "%.6g" % r["value"] if r["value"] is not None else "", r["unit"],
                         "%.6g" % r["time_s"] if r["time_s"] is not None else "", r["reps"],
                         "%.6g" % r["limit_s"] if r["limit_s"] is not None else "",
                         "%.4f" % r["of_limit"] if r["of_limit"] is not None else "",
                         "%.4f" % r["kiln_speedup"] if r["kiln_speedup"] is not None else "",
                         r["threads"], r["isa"], r["blas"], limit.get("best_gbs", "") if limit else "",
                         r["bytes"], r["flops"], r.get("peak_mib", ""), r.get("agree", ""), r["check"], r.get("details", ""),
                         r["note"], run])


COLORS = {"kiln-eager": "#f4a261", "kiln": "#e76f51", "kiln-autodiff": "#c1121f",
          "openblas": "#6c757d", "numpy": "#2a9d8f", "torch": "#457b9d", "torch.optim": "#a8dadc",
          "torch.compile": "#1d3557", "jax.jit": "#8e7dbe"}


def plot(table, limit, path, header):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print("chart: matplotlib is not available (%s); no PNG written" % e.__class__.__name__)
        return False
    panels = [w for w in ["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W10", "W11", "W12", "W13", "W13:exit", "W14",
                        "W14:cnn", "W16", "W17"]
              if any(panel_of(r["workload"]) == w for r in table)]
    if not panels:
        return False
    ncols = 2 if len(panels) > 1 else 1
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 3.1 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, w in zip(axes.flat, panels):
        rows = [r for r in table if panel_of(r["workload"]) == w]
        labels, vals, colors, texts, hatches = [], [], [], [], []
        for r in rows:
            lab = r["contender"] + ((" (" + r["workload"].split(":")[1] + ")")
                                    if ":" in r["workload"] and r["workload"] != w else "")
            labels.append(lab)
            ok = r["value"] is not None and r["status"] in ("ok", "MISMATCH")
            vals.append(r["value"] if ok else 0.0)
            colors.append("#d62828" if r["status"] == "MISMATCH" else COLORS.get(r["contender"], "#999999"))
            hatches.append("//" if r["status"] == "MISMATCH" else "")
            if not ok:
                texts.append("n/a" if r["status"] == "na" else r["status"])
            else:
                t = "%s" % fnum(r["value"], 3)
                if r["of_limit"] is not None:
                    t += "  (%s of limit)" % fnum(r["of_limit"], 2)
                if r["status"] == "MISMATCH":
                    t += "  MISMATCH"
                texts.append(t)
        y = list(range(len(rows)))[::-1]
        bars = ax.barh(y, vals, color=colors, edgecolor="black", linewidth=0.4)
        for b, h in zip(bars, hatches):
            b.set_hatch(h)
        vmax = max(vals) if any(vals) else 1.0
        lim_ms = None
        if w in MEMORY_BOUND:
            lim = next((r["limit_s"] for r in rows if r["limit_s"]), None)
            if lim:
                lim_ms = lim * 1e3
                ax.axvline(lim_ms, color="black", linestyle="--", linewidth=1)
                ax.text(lim_ms, len(rows) - 0.45, " limit %s ms" % fnum(lim_ms, 2), fontsize=7, va="bottom")
        for yy, v, t in zip(y, vals, texts):
            ax.text(v + vmax * 0.01, yy, t, va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlim(0, vmax * 1.45)
        better = "higher is better" if UNITS[w] in RATE_UNITS else "lower is better"
        ax.set_title("%s\n%s, %s" % (TITLES[w], UNITS[w], better), fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    sup = header.splitlines()[0] if header else "Kiln benchmarks"
    if limit:
        sup += "  |  STREAM triad %s GB/s, %s threads" % (limit.get("best_gbs"), limit.get("threads"))
    fig.suptitle(sup, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png")
    ap.add_argument("--header", default="")
    a = ap.parse_args()
    limit, raw = parse(a.raw)
    table, bad = build(limit, raw)
    print_table(table, limit, a.header)
    write_csv(table, limit, a.csv, a.header)
    print("\ncsv: %s" % a.csv)
    if a.png and plot(table, limit, a.png, a.header):
        print("chart: %s" % a.png)
    if bad:
        print("report: a Kiln program failed, or kiln-eager and kiln disagree", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
