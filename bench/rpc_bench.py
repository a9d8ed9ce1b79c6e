"""Plain vs speculative decoding with the target behind llama.cpp RPC workers, at several added
round-trip latencies (tests/rpc_relay.py in front of each worker), next to the local run, with the
cost model's prediction. Runs `specrpc generate` (one process per figure, a fresh cost cache each:
a first speculative run measures the cost curve over the link it uses, a second one is timed) and prints a table.

  python3 bench/rpc_bench.py --bin build/specrpc --rpc-server DIR/ggml-rpc-server \
      [--target MODEL] [--draft MODEL] [--delays 0,1,5,20] [--workers 2] [--n 128]

predicted = the speedup the cost model gives for the run's own acceptance: tokens per target pass
divided by the cost of a round in 1-token target passes, v(gamma+1) + gamma*c + o, with gamma the
mean draft length (docs/design.md section 3)."""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from rpc_relay import Relay  # noqa: E402

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(a, rpc, draft):
    cmd = [a.bin, "generate", "-m", a.target, "-p", PROMPT, "-n", str(a.n), "--temp", "0", "-t", str(a.threads)]
    if draft:
        cmd += ["-md", a.draft]
    if rpc:
        cmd += ["--rpc", rpc]
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, SPECRPC_CACHE_DIR=cache)
        if draft:  # a first run measures the cost curve over this link (the probe) and caches it
            subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env, timeout=1800)
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env, timeout=1800)
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError("generate failed: " + err[-2000:])
    out = {"tps": float(re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ ms,\s+([\d.]+) t/s", err).group(1))}
    m = re.search(r"n_draft\s+= (\d+) \(steps (\d+), target passes (\d+)", err)
    c = re.search(r"cost model: t\(1\)=([\d.]+) ms(.*) c=([\d.]+) o=([\d.]+)", err)
    dec = re.search(r"decoded\s+(\d+) tokens", err)
    if m and c:
        n_draft, steps, passes = (int(x) for x in m.groups())
        v = {int(k): float(x) for k, x in re.findall(r"v\((\d+)\)=([\d.]+)", c.group(2))}
        gamma = n_draft / steps if steps else 0
        # v between the printed points (2, 4, 8, 16): linear interpolation, v(1) = 1
        pts = sorted({1: 1.0, **v}.items())
        x = gamma + 1
        vx = pts[-1][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x0 <= x <= x1:
                vx = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                break
        tau = int(dec.group(1)) / passes if passes else 1
        round_cost = vx + gamma * float(c.group(3)) + float(c.group(4))
        out.update(t1=float(c.group(1)), gamma=gamma, tau=tau, pred=tau / round_cost)
    return out


def main():
    ap = argparse.ArgumentParser()
    models = os.environ.get("SPECRPC_MODELS_DIR", os.path.join(HERE, "..", "..", "shared", "models"))
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "specrpc"))
    ap.add_argument("--rpc-server", help="ggml-rpc-server to start --workers of on loopback")
    ap.add_argument("--workers-at", help="HOST:PORT,... of running workers instead (real hosts; no relay)")
    ap.add_argument("--target", default=os.path.join(models, "stories260K-x100M-near-Q8_0.gguf"))
    ap.add_argument("--draft", default=os.path.join(models, "stories260K-F32.gguf"))
    ap.add_argument("--delays", default="0,1,5,20")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=128)
    a = ap.parse_args()
    rows = [("local", generate(a, None, False), generate(a, None, True))]
    if a.workers_at:
        rows.append(("RPC " + a.workers_at, generate(a, a.workers_at, False), generate(a, a.workers_at, True)))
        a.workers, a.delays = 0, ""
    workers = []
    try:
        for _ in range(a.workers):
            port = free_port()
            workers.append((port, subprocess.Popen([a.rpc_server, "-H", "127.0.0.1", "-p", str(port), "-t",
                                                    str(a.threads)], stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL)))
        time.sleep(1)
        for d in (float(x) for x in a.delays.split(",") if x):
            relays = [Relay(port, d) for port, _ in workers]
            rpc = ",".join("127.0.0.1:%d" % r.port for r in relays)
            try:
                rows.append(("RPC +%g ms" % d, generate(a, rpc, False), generate(a, rpc, True)))
            finally:
                for r in relays:
                    r.close()
            print("done: %s" % rows[-1][0], file=sys.stderr, flush=True)
    finally:
        for _, p in workers:
            p.kill()
            p.wait()
    print("| target | plain t/s | speculative t/s | speedup | predicted | t(1) ms | tokens/pass | mean draft |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, plain, spec in rows:
        print("| %s | %.1f | %.1f | %.2fx | %s | %s | %s | %s |" % (
            name, plain["tps"], spec["tps"], spec["tps"] / plain["tps"],
            "%.2fx" % spec["pred"] if "pred" in spec else "-", "%.1f" % spec["t1"] if "t1" in spec else "-",
            "%.2f" % spec["tau"] if "tau" in spec else "-", "%.2f" % spec["gamma"] if "gamma" in spec else "-"))


if __name__ == "__main__":
    main()
