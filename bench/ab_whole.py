#!/usr/bin/env python3
"""Whole-process A/B of two `specrpc` binaries from one learned state.

Each binary gets its own copy of one seed cache directory (SPECRPC_CACHE_DIR: the cost curve and
the learned acceptance, probe ledger included), so both start from the same history and neither
sees what the other's processes learn. copy_bench.py's cold section starts from an empty cache
instead, where a drafter's first looks and probes decide much of a short run. Every (prompt,
binary, configuration) runs once per repetition, the order reversed every other repetition.

Per binary and configuration: mean time to the first byte on stdout, mean whole process, mean
decode time (as `specrpc generate` reports it), and the speed-ups over the same binary's plain.
A seed cache whose probe ledger is spent (its `ledger` line's second number above the budget
share of the first) runs no probes: what is left between plain and a drafter judged off is the
engine's own per-round work. Logs on stderr, Markdown on stdout.

    ab_whole.py --bin-a build/specrpc --bin-b OLD/specrpc --seed-cache DIR --prompts DIR
                [--names edit-0,ordinary-3] [--reps 4] [--temp 0.8] [--configs plain,draft]
"""
import argparse, os, shutil, sys, tempfile

from benchlib import add_model_args, decode_s, gen_cmd, timed

ap = argparse.ArgumentParser()
ap.add_argument("--bin-a", required=True)
ap.add_argument("--bin-b", required=True)
ap.add_argument("--seed-cache", required=True, help="a SPECRPC_CACHE_DIR to copy for each binary")
ap.add_argument("--prompts", required=True, help="directory of prompt files (copy_bench --dump-prompts)")
ap.add_argument("--names", default="", help="prompt file names without .txt (default: all)")
add_model_args(ap, "stories260K-copy-x100M-Q8_0.gguf", "stories260K-copy-F32.gguf", reps=4, n=128)
ap.add_argument("--temp", default="0.8")
ap.add_argument("--configs", default="plain,draft")
a = ap.parse_args()

draft = os.path.join(a.models, a.draft)
CONFIGS = {"plain": [], "lookup": ["--spec-type", "lookup"], "draft": ["-md", draft, "--spec-type", "draft"],
           "chain": ["-md", draft, "--spec-type", "lookup,draft"], "suffix": ["--spec-type", "suffix"]}
configs = a.configs.split(",")
if "plain" not in configs:
    configs.insert(0, "plain")
if any(c not in CONFIGS for c in configs):
    sys.exit(f"--configs: choose from {','.join(CONFIGS)}")
names = a.names.split(",") if a.names else sorted(f[:-4] for f in os.listdir(a.prompts) if f.endswith(".txt"))
bins = {"A": a.bin_a, "B": a.bin_b}
work = tempfile.mkdtemp(prefix="ab-whole-")
caches = {}
for b in bins:
    caches[b] = os.path.join(work, b)
    shutil.copytree(a.seed_cache, caches[b])


def run(binary, extra, prompt, cache):
    cmd = gen_cmd(binary, os.path.join(a.models, a.target), ["-f", prompt], a.n, a.temp, a.threads, extra=extra)
    t_first, whole, err = timed(cmd, dict(os.environ, SPECRPC_CACHE_DIR=cache))
    return t_first, whole, decode_s(err)


order = [(b, c) for b in bins for c in configs]
res = {k: [] for k in order}
for rep in range(a.reps):
    for name in names:
        for b, c in (order if rep % 2 == 0 else order[::-1]):
            res[(b, c)].append(run(bins[b], CONFIGS[c], os.path.join(a.prompts, name + ".txt"), caches[b]))
    print(f"[ab] rep {rep + 1}/{a.reps} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
shutil.rmtree(work, ignore_errors=True)

print(f"{a.target}, prompts {','.join(names)}, {a.n} tokens, T = {a.temp}, seed 7, -t {a.threads}, {a.reps} reps; "
      f"A = {a.bin_a}, B = {a.bin_b}, each from a copy of {a.seed_cache}; means per process\n")
print("| bin | configuration | first token (ms) | whole process (ms) | decode (ms) | speed-up (whole) | speed-up (decode) |")
print("|---|---|---:|---:|---:|---:|---:|")
for b in bins:
    mean = lambda c, j: sum(x[j] for x in res[(b, c)]) / len(res[(b, c)])
    for c in configs:
        print(f"| {b} | {c} | {1e3 * mean(c, 0):.1f} | {1e3 * mean(c, 1):.1f} | {1e3 * mean(c, 2):.1f} | "
              f"**{mean('plain', 1) / mean(c, 1):.3f}x** | {mean('plain', 2) / mean(c, 2):.3f}x |")
