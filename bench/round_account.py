#!/usr/bin/env python3
"""Where a request's time went, round by round, against plain decoding of the same tokens.

Reads the engine's per-round debug lines ("round: slot .. depth .. gamma .. drafted .. accepted ..",
from `SPECRPC_LOG=debug` or `--log-level debug`) from the files given, or stdin, one process per
file. Each file's plain round is the mean time of a round with nothing drafted that follows
three such rounds (a steady plain round, its sampling included; the mean, not the median, since
time adds up and a plain round's stalls are part of what plain decoding costs); every round is
then set against that many plain rounds for the tokens it emitted (accepted + 1). Rounds of several slots are left
out (their time is shared).

  python3 bench/round_account.py [--min-speedup 1.05] [--json] LOG...

Tables (stdout, markdown): the rounds by kind (drafted; gamma > 0 with nothing drafted, such as a
confidence stop that cut the draft before its first token or a lookup without a match; plain),
with the time spent against the time plain rounds would have taken; drafted rounds by chain
length (tokens, cost in plain rounds, S = tokens / cost); drafted rounds whose predicted S was
at least --min-speedup and those below (achieved against predicted); plain rounds by how many
rounds after a drafted one they ran.
"""

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"round: slot (\d+) depth (\d+) gamma (\d+) drafted (\d+) accepted (\d+) off (\d) "
                  r"predicted ([\d.]+) verify ([\d.]+) draft ([\d.]+) all ([\d.]+) ms slots (\d+) stop_cut (\d) "
                  r"empty_share ([\d.]+)")
KEYS = ("slot", "depth", "gamma", "drafted", "accepted", "off", "predicted", "verify", "draft", "all", "slots",
        "stop_cut", "empty_share")


def parse(lines):
    rounds = []
    for line in lines:
        m = LINE.search(line)
        if m:
            r = dict(zip(KEYS, (float(x) for x in m.groups())))
            rounds.append(r)
    return rounds


def steady_plain_ms(rounds):
    """Mean time of a plain round after three plain rounds (gamma 0, nothing drafted); None with
    fewer than five such rounds."""
    ms = []
    for i in range(3, len(rounds)):
        window = rounds[i - 3:i + 1]
        if all(r["drafted"] == 0 and r["gamma"] == 0 for r in window):
            ms.append(rounds[i]["all"])
    return statistics.fmean(ms) if len(ms) >= 5 else None


def account(files, min_speedup):
    kinds = defaultdict(lambda: {"rounds": 0, "ms": 0.0, "plain_ms": 0.0, "tokens": 0})
    by_len = defaultdict(lambda: {"rounds": 0, "tokens": 0, "cost": 0.0, "verify": 0.0, "draft": 0.0, "full": 0})
    by_pred = defaultdict(lambda: {"rounds": 0, "tokens": 0, "cost": 0.0, "predicted": 0.0})
    after = defaultdict(lambda: {"rounds": 0, "ms": 0.0, "plain_ms": 0.0})
    skipped = []
    for name, rounds in files:
        rounds = [r for r in rounds if r["slots"] == 1]
        tp = steady_plain_ms(rounds)
        if tp is None:
            skipped.append(name)
            continue
        since = None  # rounds since the last drafted one
        for r in rounds:
            tokens = int(r["accepted"]) + 1
            kind = "drafted" if r["drafted"] > 0 else ("gamma > 0, nothing drafted" if r["gamma"] > 0 else "plain")
            k = kinds[kind]
            k["rounds"] += 1
            k["ms"] += r["all"]
            k["plain_ms"] += tokens * tp
            k["tokens"] += tokens
            if r["drafted"] > 0:
                n = int(r["drafted"])
                b = by_len[n]
                b["rounds"] += 1
                b["tokens"] += tokens
                b["cost"] += r["all"] / tp
                b["verify"] += r["verify"] / tp
                b["draft"] += r["draft"] / tp
                b["full"] += tokens == n + 1
                p = by_pred[f"predicted >= {min_speedup:g}" if r["predicted"] >= min_speedup else f"predicted < {min_speedup:g}"]
                p["rounds"] += 1
                p["tokens"] += tokens
                p["cost"] += r["all"] / tp
                p["predicted"] += r["predicted"]
                since = 0
                continue
            if since is not None:
                since += 1
                a = after[str(since) if since <= 3 else "4+"]
                a["rounds"] += 1
                a["ms"] += r["all"]
                a["plain_ms"] += tp
    return kinds, by_len, by_pred, after, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", help="debug logs, one process each (default: stdin)")
    ap.add_argument("--min-speedup", type=float, default=1.05, help="the policy's threshold (DraftLengthOptions)")
    ap.add_argument("--json", action="store_true", help="the totals as JSON instead of tables")
    a = ap.parse_args()
    files = [(f, parse(open(f, errors="replace"))) for f in a.logs] if a.logs else [("stdin", parse(sys.stdin))]
    kinds, by_len, by_pred, after, skipped = account(files, a.min_speedup)
    if skipped:
        print(f"left out (fewer than 5 steady plain rounds): {', '.join(skipped)}", file=sys.stderr)
    spent = sum(k["ms"] for k in kinds.values())
    plain = sum(k["plain_ms"] for k in kinds.values())
    if a.json:
        print(json.dumps({"speedup": plain / spent if spent else None, "kinds": kinds, "by_len": by_len,
                          "by_pred": by_pred, "after": after}, indent=1, sort_keys=True))
        return
    if not spent:
        sys.exit("no single-slot round lines found (run with SPECRPC_LOG=debug)")
    print(f"Speed-up over plain rounds of the same tokens: **{plain / spent:.3f}x** "
          f"({len(files) - len(skipped)} process(es), {sum(k['rounds'] for k in kinds.values())} rounds)")
    table(["rounds", "count", "tokens", "ms spent", "ms as plain rounds", "net gain (ms)"],
          [[name, k["rounds"], k["tokens"], f"{k['ms']:.0f}", f"{k['plain_ms']:.0f}", f"{k['plain_ms'] - k['ms']:+.0f}"]
           for name, k in sorted(kinds.items())])
    table(["drafted", "rounds", "tokens a round", "cost (plain rounds)", "verify", "draft", "S", "all accepted"],
          [[n, b["rounds"], f"{b['tokens'] / b['rounds']:.2f}", f"{b['cost'] / b['rounds']:.2f}",
            f"{b['verify'] / b['rounds']:.2f}", f"{b['draft'] / b['rounds']:.2f}", f"{b['tokens'] / b['cost']:.2f}",
            f"{100 * b['full'] / b['rounds']:.0f}%"] for n, b in sorted(by_len.items())])
    table(["drafted rounds", "count", "achieved S", "predicted S (mean)"],
          [[name, p["rounds"], f"{p['tokens'] / p['cost']:.3f}", f"{p['predicted'] / p['rounds']:.3f}"]
           for name, p in sorted(by_pred.items())])
    table(["plain round, rounds after a drafted one", "count", "excess over a steady plain round"],
          [[name, x["rounds"], f"{100 * (x['ms'] / x['plain_ms'] - 1):+.1f}%"] for name, x in sorted(after.items())])


def table(head, rows):
    """A markdown table after a blank line; the first column left-aligned, the others right."""
    print("\n| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
