#!/usr/bin/env python3
"""The image experiments' tables, printed from the runs' JSON documents.

    python3 experiments/images/table.py bits RUNS      MNIST at CPU scale: test bits/dim
                                                       at equal epochs and equal time
    python3 experiments/images/table.py seeds RUNS     MNIST at the equal-epochs budget:
                                                       the mean over seeds with a 95%
                                                       interval
    python3 experiments/images/table.py cifar RUNS     CIFAR-10 at CPU scale
    python3 experiments/images/table.py speed SPEED [cpu]   sampling speed (Tables 1, 2,
                                                       5); cpu: in the process's CPU
                                                       seconds (runs at 1 thread on a
                                                       shared machine) instead of wall
    python3 experiments/images/table.py traffic TRAFFIC [GBPS]   the memory traffic of
                                                       sampling's step on the emulator,
                                                       and the images/s it would allow
                                                       at GBPS GB/s (default 3108: the
                                                       H200's measured copy rate)
    python3 experiments/images/table.py curves RUNS [mnist|cifar10]   the validation
                                                       curves as TSV (for
                                                       plots/images-curves.gp)
    python3 experiments/images/table.py pareto RUNS [mnist|cifar10]   bits/dim against
                                                       training CPU hours, validation
                                                       and test, as TSV (for
                                                       plots/pareto.gp)

RUNS holds the training run documents that experiments/images/collect.py copied:
mnist-cpu-VARIANT-epochs.json and -time.json (the document at the end of each budget
of PROTOCOL.md), mnist-cpu-VARIANT-seedS-epochs.json (the further seeds, equal epochs
only), cifar10-cpu-VARIANT.json. SPEED holds SHAPE-VARIANT-bB[-eE]/sample.json
of experiments/images/speed.sh, TRAFFIC SHAPE-VARIANT-bB-tT/sample.json of
experiments/images/traffic.sh. Standard library only.
"""
import glob
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)
from seedstats import fmt_mean_ci  # noqa: E402  (experiments/seedstats.py)

VARIANTS = ["softmax", "linear", "lsh-1", "lsh-4"]
# The paper's numbers (its Tables 1, 2 and 5; ../shared notes): bits/dim, images/s
# (GPU, large batch), seconds per image at batch 1 on the CPU and on the GPU.
PAPER = {
    "mnist": {
        "softmax": (0.621, 0.45, 72.6, 10.2),
        "stateful-softmax": (0.621, 7.56, 7.4, 10.4),
        "lsh-1": (0.745, 0.68, 46.0, 19.2),
        "lsh-4": (0.676, 0.27, 112.0, 55.8),
        "linear": (0.644, 142.8, 5.5, 7.3),
    },
    "cifar10": {
        "softmax": (3.47, 0.004, 8651.4, 300.1),
        "stateful-softmax": (3.47, 0.32, 71.9, 70.4),
        "lsh-1": (3.39, 0.015, 2318.9, 221.6),
        "lsh-4": (3.51, 0.005, 5263.7, 683.9),
        "linear": (3.40, 17.85, 45.1, 61.3),
    },
}
# CPU seconds per training step at 1 thread: the time axis. They are the measurement
# that set the budgets before the runs (steptime.json beside this file, which run-cpu.sh
# reads too): /usr/bin/time of short runs, which no run document holds. The documents'
# own figures are not that quantity: summary.step_s is wall time on a shared machine
# (softmax 2.40 s a step, linear 1.60, lsh-1 1.51, lsh-4 1.37), and only the runs of a
# later binary have step_cpu_s (lsh-4 0.726 a step; CIFAR-10 softmax 1.354, linear 0.399
# against the measured 1.39 and 0.455).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "steptime.json"), encoding="utf-8") as _f:
    _STEPTIME = json.load(_f)
STEP_S = _STEPTIME["mnist"]["seconds_per_step"]
IMAGES = 59000  # training images (the last 1,000 of the 60,000 are the validation split)
# CIFAR-10 at CPU scale (PROTOCOL.md, "CIFAR-10 at CPU scale"): batch 4, 49,000 training
# images (the last 1,000 of 50,000 are the validation split)
CIFAR_STEP_S = _STEPTIME["cifar10"]["seconds_per_step"]
CIFAR_IMAGES, CIFAR_BATCH = 49000, 4


def fmt(x, digits=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def records(doc, kind):
    return [r for r in doc["records"] if r.get("kind") == kind]


def last_test(doc):
    t = records(doc, "test")
    return t[-1] if t else None


def machine_line(doc):
    m = doc.get("machine", {})
    return (f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('threads', '?')} thread(s); "
            f"OpenBLAS core {m.get('blas_core', '?')} (OPENBLAS_CORETYPE {m.get('openblas_coretype_env') or 'unset'}), "
            f"{m.get('blas_threads', '?')} BLAS thread(s) ({m.get('blas_parallel_model', '?')})")


def cmd_bits(runs):
    rows, first = [], None
    for v in VARIANTS:
        ep, tm = (os.path.join(runs, f"mnist-cpu-{v}-{b}.json") for b in ("epochs", "time"))
        if not (os.path.exists(ep) and os.path.exists(tm)):
            rows.append((v, None, None))
            continue
        rows.append((v, load(ep), load(tm)))
        first = first or rows[-1][1]
    if first is None:
        sys.exit(f"table.py: no MNIST runs in {runs}")
    # the equal-epochs budget: the steps of the runs' epochs documents (3 epochs = 11,063
    # in the protocol; its log entry 3 says the reported runs stopped at 4,500)
    budget = first["summary"]["steps_done"]
    ep_txt = f"{budget * 16 / IMAGES:.2f} epochs"
    for m in sorted({machine_line(d) for _, ep, tm in rows for d in (ep, tm) if d is not None}):
        print(m + "  ")
    print(f"Budgets (PROTOCOL.md): equal epochs = {budget} steps of 16 images ({ep_txt}); equal time = the CPU "
          f"time of softmax's {budget} steps, {budget * STEP_S['softmax'] / 3600:.2f} h at 1 thread")
    print()
    print(f"| variant | test bits/dim, {ep_txt} | test bits/dim, equal time | steps at equal time (epochs) "
          "| best validation bits/dim (step) | wall time, h | paper (250 epochs, 27x the parameters) |")
    print("|---|---|---|---|---|---|---|")
    res = {}
    for v, ep, tm in rows:
        if ep is None:
            print(f"| {v} | not run | | | | | {PAPER['mnist'][v][0]} |")
            continue
        te, tt = last_test(ep), last_test(tm)
        steps_t = tm["summary"]["steps_done"]
        if ep["summary"]["steps_done"] != budget:
            sys.exit(f"table.py: {v}'s equal-epochs run has {ep['summary']['steps_done']} steps, softmax's {budget}")
        evals = records(tm, "eval") + records(ep, "eval")
        best = min(evals, key=lambda r: r["eval_bits_per_dim"])
        wall = max(ep["summary"]["wall_s"], tm["summary"]["wall_s"]) / 3600
        b_e, b_t = te["test_bits_per_dim"], tt["test_bits_per_dim"]
        res[v] = (b_e, b_t)
        print(f"| {provenance.mark(v, [ep, tm])} | {b_e:.4f} | {b_t:.4f} | {steps_t} ({steps_t * 16 / IMAGES:.2f}) "
              f"| {best['eval_bits_per_dim']:.4f} ({best['step']}) | {wall:.2f} | {PAPER['mnist'][v][0]} |")
    for line in provenance.notes([d for _, ep, tm in rows for d in (ep, tm) if d]):
        print()
        print(line)
    if "softmax" in res and "linear" in res:
        print()
        de = res["linear"][0] - res["softmax"][0]
        dt = res["linear"][1] - res["softmax"][1]
        print(f"linear - softmax: {de:+.4f} bits/dim at {ep_txt} (paper, 250 epochs: {0.644 - 0.621:+.3f}), "
              f"{dt:+.4f} at equal time")
        worst = max(res, key=lambda v: res[v][0])
        print(f"worst at {ep_txt}: {worst}; below 1.0 bits/dim at {ep_txt}: "
              + (", ".join(v for v in res if res[v][0] < 1.0) or "none"))


def cmd_seeds(runs):
    """Per variant: seed 1's equal-epochs document and those of its further seeds, all at
    the same step count; the test bits/dim's mean over the seeds with a 95% interval."""
    rows, steps = [], None
    for v in VARIANTS:
        paths = glob.glob(os.path.join(runs, f"mnist-cpu-{v}-epochs.json"))
        paths += glob.glob(os.path.join(runs, f"mnist-cpu-{v}-seed*-epochs.json"))
        docs = []
        for p in paths:
            d = load(p)
            t = last_test(d)
            if t is None:
                sys.exit(f"table.py: {p} has no test record")
            n = d["summary"]["steps_done"]
            if steps is not None and n != steps:
                sys.exit(f"table.py: {p} has {n} steps, the other equal-epochs runs {steps}")
            steps = n
            docs.append((d.get("config", {}).get("seed"), t["test_bits_per_dim"], d, p))
        seeds = [s for s, _, _, _ in docs]
        if len(set(seeds)) != len(seeds):
            sys.exit(f"table.py: {v}: a seed twice among {', '.join(p for _, _, _, p in docs)}")
        if docs:
            rows.append((v, sorted(docs, key=lambda x: (x[0] is None, x[0] or 0))))
    if not rows:
        sys.exit(f"table.py: no MNIST equal-epochs runs in {runs}")
    for m in sorted({machine_line(d) for _, docs in rows for _, _, d, _ in docs}):
        print(m + "  ")
    print(f"Equal epochs: {steps} steps of 16 images ({steps * 16 / IMAGES:.2f} epochs); mean over the seeds "
          "[95% interval, Student's t over the seeds; none for one seed]")
    print()
    print("| variant | seeds | test bits/dim | each seed's | paper (250 epochs) |")
    print("|---|---|---|---|---|")
    for v, docs in rows:
        print(f"| {provenance.mark(v, [d for _, _, d, _ in docs])} | {', '.join(str(s) for s, _, _, _ in docs)} "
              f"| {fmt_mean_ci([b for _, b, _, _ in docs], digits=4)} | {', '.join(f'{b:.4f}' for _, b, _, _ in docs)} "
              f"| {PAPER['mnist'][v][0]} |")
    for line in provenance.notes([d for _, docs in rows for _, _, d, _ in docs]):
        print()
        print(line)


def cmd_cifar(runs):
    docs = [(v, os.path.join(runs, f"cifar10-cpu-{v}.json")) for v in ("softmax", "linear")]
    docs = [(v, load(p)) for v, p in docs if os.path.exists(p)]
    if not docs:
        sys.exit(f"table.py: no CIFAR-10 runs in {runs}")
    for m in sorted({machine_line(d) for _, d in docs}):  # every machine the runs used
        print(m + "  ")
    budget = {v: d["summary"]["steps_done"] * CIFAR_STEP_S[v] / 3600 for v, d in docs}
    print("Data: CIFAR-10 (JPEG q75 re-encoding: its bits/dim is not the paper's data); equal training time, "
          + ", ".join(f"{v} {h:.2f}" for v, h in budget.items())
          + " CPU-hours at 1 thread (steps x the protocol's CPU s/step; PROTOCOL.md log entry 5)")
    print()
    print("| variant | steps | images seen (epochs) | test bits/dim | best validation bits/dim (step) "
          "| wall time, h | paper (7 days on a P40, 16 layers) |")
    print("|---|---|---|---|---|---|---|")
    res = {}
    for v, d in docs:
        s = d["summary"]["steps_done"]
        te = last_test(d)
        best = min(records(d, "eval"), key=lambda r: r["eval_bits_per_dim"])
        tb = f"{te['test_bits_per_dim']:.4f}" if te else "-"
        if te:
            res[v] = te["test_bits_per_dim"]
        n = s * CIFAR_BATCH
        print(f"| {provenance.mark(v, [d])} | {s} | {n} ({n / CIFAR_IMAGES:.2f}) | {tb} | {best['eval_bits_per_dim']:.4f} ({best['step']}) "
              f"| {d['summary']['wall_s'] / 3600:.2f} | {PAPER['cifar10'][v][0]} |")
    for line in provenance.notes([d for _, d in docs]):
        print()
        print(line)
    if "softmax" in res and "linear" in res:
        print()
        print(f"linear - softmax at equal time: {res['linear'] - res['softmax']:+.4f} bits/dim "
              f"(paper, 7 days each: {PAPER['cifar10']['linear'][0] - PAPER['cifar10']['softmax'][0]:+.2f})")


def run_docs(runs, dataset, v):
    """The documents of variant v's run in RUNS: CIFAR-10's one, MNIST's two budgets."""
    names = [f"cifar10-cpu-{v}.json"] if dataset == "cifar10" else [f"mnist-cpu-{v}-{b}.json" for b in ("epochs", "time")]
    return [load(os.path.join(runs, n)) for n in names if os.path.exists(os.path.join(runs, n))]


def by_step(docs, kind, key, first=0):
    """{step: record[key]} of the documents' records of this kind from step `first` on (a
    step in two documents of one run once)."""
    return {r["step"]: r[key] for d in docs for r in records(d, kind) if r["step"] >= first}


def dataset_variants(dataset):
    if dataset not in ("mnist", "cifar10"):
        sys.exit(f"table.py: unknown dataset '{dataset}' (mnist, cifar10)")
    return list(CIFAR_STEP_S) if dataset == "cifar10" else VARIANTS


def cmd_curves(runs, dataset="mnist"):
    """TSV: run, x (epochs), cpu_h (step x the protocol's CPU s/step), valid bits/dim."""
    variants = dataset_variants(dataset)
    step_s, batch, images = (CIFAR_STEP_S, CIFAR_BATCH, CIFAR_IMAGES) if dataset == "cifar10" else (STEP_S, 16, IMAGES)
    print("run\tepochs\tcpu_h\tbits_per_dim")
    for v in variants:
        seen = by_step(run_docs(runs, dataset, v), "eval", "eval_bits_per_dim")
        for step in sorted(seen):
            print(f"{dataset}-{v}\t{step * batch / images:.5f}\t{step * step_s[v] / 3600:.5f}\t{seen[step]:.6f}")


def cmd_pareto(runs, dataset="mnist"):
    """TSV: run, kind (valid: an evaluation; test: a test record), cpu_h, value (bits/dim).
    CPU hours as in the curves and the budgets: step x the protocol's CPU s/step at 1
    thread (four MNIST documents have no measured CPU time). A test record repeated in
    two documents of one run (softmax's budgets are one run) is printed once."""
    variants = dataset_variants(dataset)
    step_s = CIFAR_STEP_S if dataset == "cifar10" else STEP_S
    print("run\tkind\tcpu_h\tvalue")
    found = False
    for v in variants:
        docs = run_docs(runs, dataset, v)
        found = found or bool(docs)
        for kind, seen in (("valid", by_step(docs, "eval", "eval_bits_per_dim", first=1)),
                           ("test", by_step(docs, "test", "test_bits_per_dim"))):
            for step in sorted(seen):
                print(f"{dataset}-{v}\t{kind}\t{step * step_s[v] / 3600:.5f}\t{seen[step]:.6f}")
    if not found:
        sys.exit(f"table.py: no {dataset} runs in {runs}")


def per_image(d, cpu):
    """Seconds per image and images per second on the chosen clock."""
    if not cpu:
        return d["s_per_image"], d["images_per_s"]
    if d.get("cpu_s_per_image") is None:
        sys.exit(f"table.py: {d['run']} (batch {d['batch']}) has no CPU time (a sample.json of an older attnbench)")
    c = d["cpu_s_per_image"]
    return c, (1.0 / c if c > 0 else None)


def cmd_speed(speed, clock="wall"):
    if clock not in ("wall", "cpu"):
        sys.exit(f"table.py: speed: unknown clock '{clock}' (wall, cpu)")
    cpu = clock == "cpu"
    pts, graphed = {}, {}
    for p in sorted(glob.glob(os.path.join(speed, "*", "sample.json"))):
        d = load(p)
        shape = "mnist" if d["values_per_row"] == 784 else "cifar10"
        key = (shape, d["variant"] if d["variant"] != "lsh" else lsh_name(d), d["batch"], d["method"])
        # steps run as a CUDA graph (sample --graph) are compared apart, below the tables
        (graphed if (d.get("graph") or {}).get("launches") else pts)[key] = d
    if not pts:
        sys.exit(f"table.py: no sample.json under {speed}")
    any_doc = next(iter(pts.values()))
    m = any_doc["machine"]
    print(f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {any_doc['threads']} threads; OpenBLAS core "
          f"{m.get('blas_core', '?')} (OPENBLAS_CORETYPE {m.get('openblas_coretype_env') or 'unset'}); models of the "
          f"paper's shapes with initialised weights (`sample --config`); "
          + (f"on the GPU ({(m.get('gpu') or {}).get('name', '?')}, CUDA {(m.get('gpu') or {}).get('cuda_runtime', '?')}); "
             if any_doc.get("device") == "cuda" else "")
          + ("the process's CPU seconds" if cpu else "wall-clock seconds"))
    for shape, title in (("mnist", "MNIST shape: 8 layers, d_model 256, 784 values (Tables 1 and 5)"),
                         ("cifar10", "CIFAR-10 shape: 16 layers, d_model 256, 3,072 values (Tables 2 and 5)")):
        if not any(k[0] == shape for k in pts):
            continue  # no table of headers alone
        print()
        print(title)
        print()
        print("| variant | mode | s/image, batch 1 | images/s, large batch (batch) | paper s/image, CPU / GPU "
              "| paper images/s (GPU) |")
        print("|---|---|---|---|---|---|")
        rate = {}
        for v in ["softmax", "stateful-softmax", "lsh-1", "lsh-4", "linear"]:
            one = best_point(pts, shape, v, lambda b: b == 1)
            big = best_point(pts, shape, v, lambda b: b > 1)
            if not one and not big:
                continue
            mode = (one or big)["mode"]
            s1 = f"{fmt(per_image(one, cpu)[0])}{mark(one)}" if one else "-"
            ib = f"{fmt(per_image(big, cpu)[1])}{mark(big)} ({big['batch']})" if big else "-"
            pp = PAPER[shape][v]
            rate[v] = (per_image(one, cpu)[0] if one else None, per_image(big, cpu)[1] if big else None)
            print(f"| {provenance.mark(v, [x for x in (one, big) if x])} | {mode} | {s1} | {ib} | {pp[2]} / {pp[3]} | {pp[1]} |")
        print()
        lin = rate.get("linear")
        for other in ("softmax", "stateful-softmax"):
            o = rate.get(other)
            if lin and o and lin[0] and o[0] and lin[1] and o[1]:
                pp_big = PAPER[shape]["linear"][1] / PAPER[shape][other][1]
                pp_one = PAPER[shape][other][2] / PAPER[shape]["linear"][2]
                print(f"linear / {other}: {o[0] / lin[0]:.1f}x faster at batch 1 (paper CPU: {pp_one:.1f}x), "
                      f"{lin[1] / o[1]:.1f}x the images/s at the large batch (paper GPU: {pp_big:.1f}x)  ")
    chk = [pts.get(("mnist", "softmax", 1, m)) for m in ("sampled", "estimated")]
    if all(chk):
        print()
        a, b = per_image(chk[0], cpu)[0], per_image(chk[1], cpu)[0]
        print(f"The estimate's check (MNIST shape, softmax, batch 1): sampled {a:.1f} s/image, "
              f"estimated {b:.1f} (every {chk[1]['estimate']['every']}th position), ratio {b / a:.3f}")
    if graphed:
        print()
        print("With each step's layers and head as one CUDA graph (`sample --graph`), against the same point "
              "without it:")
        print()
        print("| shape | variant | batch | images/s without | images/s with the graph | with / without |")
        print("|---|---|---|---|---|---|")
        for k in sorted(graphed, key=lambda k: (k[0] != "mnist", k[1], k[2], k[3])):
            g, plain = graphed[k], pts.get(k)
            gi = per_image(g, cpu)[1]
            pi = per_image(plain, cpu)[1] if plain else None
            print(f"| {k[0]} | {k[1]} | {k[2]} | {fmt(pi) if pi else '-'} | {fmt(gi)} | "
                  f"{f'{gi / pi:.2f}' if gi and pi else '-'} |")
    print()
    print("(e: estimated from timed positions, `sample --estimate`; otherwise whole images sampled)")
    for line in provenance.notes(list(pts.values()) + list(graphed.values())):
        print()
        print(line)


def cmd_traffic(traffic, gbps="3108"):
    try:
        bw = float(gbps) * 1e9
    except ValueError:
        bw = -1
    if not bw > 0:
        sys.exit(f"table.py: traffic: GBPS '{gbps}' is not a positive number")
    docs = []
    for p in sorted(glob.glob(os.path.join(traffic, "*", "sample.json"))):
        d = load(p)
        if d.get("method") != "traffic":
            continue
        docs.append(d)
    if not docs:
        sys.exit(f"table.py: no sample.json of `sample --traffic` under {traffic}")
    gpu = (docs[0]["machine"].get("gpu") or {})
    print(f"Device: {gpu.get('name', '?')}, traffic counted: {str(gpu.get('traffic_counted', '?')).lower()}; "
          f"models of the paper's shapes with initialised weights (`sample --config ... --traffic T`); "
          f"one step at position T and its draw")
    print(f"Source: {'; '.join(sorted(set(provenance.source_line(d) for d in docs)))}")
    print()
    print(f"| shape | variant | batch | position | operations | DRAM MiB | min MiB | DRAM / min | requested / min "
          f"| most DRAM bytes | us a position at {float(gbps):g} GB/s: DRAM, min | images/s at that rate: DRAM, min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = {"linear": 0, "stateful-softmax": 1}
    docs.sort(key=lambda d: (d["values_per_row"] != 784, order.get(d["variant"], 2), d["batch"],
                             d["traffic"]["position"]))
    for d in docs:
        t = d["traffic"]
        dram = t["dram_read_bytes"] + t["dram_write_bytes"]
        req = t["requested_read_bytes"] + t["requested_write_bytes"]
        mn = t["min_read_bytes"] + t["min_write_bytes"]
        top = sorted(t["by_name"], key=lambda e: -(e["dram_read_bytes"] + e["dram_write_bytes"]))[:2]
        most = ", ".join(f"{e['name']} ({100.0 * (e['dram_read_bytes'] + e['dram_write_bytes']) / dram:.0f}%)"
                         for e in top)
        n, b = d["values_per_row"], d["batch"]
        us = [x / bw * 1e6 for x in (dram, mn)]
        ips = [b / (n * x * 1e-6) for x in us]
        shape = "MNIST" if n == 784 else "CIFAR-10"
        print(f"| {shape} | {provenance.mark(d['variant'], [d])} | {b} | {t['position']} | {t['launches']} "
              f"| {fmt(dram / 2**20)} | {fmt(mn / 2**20)} | {dram / mn:.2f} | {req / mn:.2f} | {most} "
              f"| {fmt(us[0])}, {fmt(us[1])} | {fmt(ips[0])}, {fmt(ips[1])} |")
    print()
    print("(images/s at that rate: batch / (values a row x the step's bytes / the rate): what a step "
          "bound by memory alone would allow, every position moving what position T moves; a key/value "
          "cache's mean over a row is its point at half the row)")
    for line in provenance.notes(docs):
        print()
        print(line)


def lsh_name(d):
    """lsh-1 or lsh-4: the paper configs' run names end in the label (mnist-lsh-4)."""
    return d["run"].split("-", 1)[1]


def mark(d):
    return " e" if d["method"] == "estimated" else ""


def best_point(pts, shape, v, batch_ok):
    """The sampled point if there is one, else the estimated one."""
    cand = [(k, d) for k, d in pts.items() if k[0] == shape and k[1] == v and batch_ok(k[2])]
    cand.sort(key=lambda kd: (kd[0][3] != "sampled", -kd[0][2]))
    return cand[0][1] if cand else None


def main(argv):
    cmds = {"bits": cmd_bits, "seeds": cmd_seeds, "cifar": cmd_cifar, "speed": cmd_speed, "curves": cmd_curves,
            "pareto": cmd_pareto, "traffic": cmd_traffic}
    if len(argv) < 2 or argv[0] not in cmds or \
            len(argv) > (3 if argv[0] in ("speed", "curves", "pareto", "traffic") else 2):
        sys.exit(__doc__)
    cmds[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
