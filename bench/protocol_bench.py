#!/usr/bin/env python3
"""The cost of the protocol: streamed `completion` over HTTP (SSE) and stdio vs the same
generation without the protocol, plus a load figure. Python standard library only.

    python3 bench/protocol_bench.py --bin build/specrpc --models DIR [--quick] [--reps N]
                                    [--n-predict N] [--load-seconds S] [--threads N]

Part 1, throughput (target stories260K-x100M-Q8_0, `-t THREADS -np 1`, greedy, ignore_eos,
N_PREDICT tokens, cache_prompt off, several prompts). Per round and prompt, in a shuffled order
(seeded: no variant always first nor always after the same one):
  http-sse    POST /completion {stream: true} (llama-server's SSE route), read event by event
  stdio       JSON-RPC `completion` {stream: true} over `serve --stdio`, completion.chunk
              notifications then the response
  engine      a non-streamed `completion` on the same two servers: the engine's own timings
              (prompt_ms + predicted_ms), i.e. the generation with no per-token protocol work
  generate    `specrpc generate` with the same flags (a fresh process; its stderr timings)
The protocol figures are what a client sees: tokens / (last byte of the answer - request sent),
so they include connecting, parsing, tokenizing, queueing, every chunk and the final JSON (the
clients are lean: a buffered pipe, a socket with its own SSE/chunked reader, so that the figure is
the server's protocol and not http.client's per-line overhead on a 2-core machine). The
in-process reference is `engine`, not `generate`: it runs in the same process, on the same warm
slot and thread pool, interleaved with the streamed calls so it sees the same machine load,
while `generate` pays a cold process each time; it is shown as a cross-check that the server's
engine is not slower than a bare one. Ratio = median over (round, prompt) pairs of
streamed / engine of the same server in the same round; the target is >= 0.98.

Part 2, load: `serve -np 4` on stories260K-F32, 8 client threads sending short non-streamed
completions (32 tokens, ignore_eos) for LOAD_SECONDS: requests/s, tokens/s, latency p50/p99.

Only 127.0.0.1; every request has a timeout; the number of runs is fixed and the throughput part
starts no new group after --budget seconds (600, quick 120). The Markdown tables go
to stdout, progress to stderr. Numbers are only meaningful on an otherwise idle machine (the load
average at start and end is printed with the tables).
"""

import argparse
import http.client
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Once upon a time",
    "Tom and Sue went to the park",
    "The little dog was sad because",
    "Lily wanted to bake a cake for her mom",
]
REQ_TIMEOUT = 300


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, p):
    """Nearest-rank percentile."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


# ---- servers --------------------------------------------------------------------------------------

class HttpServer:
    def __init__(self, binary, args, env):
        self.proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        self.port = None
        self.stderr = []
        deadline = time.time() + 120
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.stderr.append(line)
            m = re.search(r"listening on http://[^\s]*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start: " + "".join(self.stderr))
        threading.Thread(target=self._drain, daemon=True).start()
        while True:
            try:
                st, body = self.get("/health")
                if st == 200 and json.loads(body).get("status") == "ok":
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError("server not ready: " + "".join(self.stderr))
            time.sleep(0.05)

    def _drain(self):
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode("utf-8", "replace"))

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQ_TIMEOUT)

    def get(self, path):
        c = self.conn()
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path, body):
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class StdioServer:
    """One request at a time: the bench reads the answer on the calling thread (no reader thread)."""

    def __init__(self, binary, args, env):
        self.proc = subprocess.Popen([binary, "serve", "--stdio", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)  # buffered
        self.out = self.proc.stdout
        self.next_id = 1
        deadline = time.time() + 120
        while True:
            resp = self.call("health", {})
            if "result" in resp:
                break
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("stdio server not ready: %r" % resp)
            time.sleep(0.05)

    def send(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
                              + b"\n")
        self.proc.stdin.flush()
        return rid

    def read(self):
        line = self.out.readline()
        if not line:
            raise RuntimeError("stdio server exited")
        return json.loads(line)

    def call(self, method, params):
        rid = self.send(method, params)
        while True:
            m = self.read()
            if m.get("id") == rid and "method" not in m:
                return m

    def stop(self):
        self.proc.stdin.close()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# ---- the variants ---------------------------------------------------------------------------------

def body_for(prompt, n):
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False}


def engine_rate(t):
    return t["predicted_n"] / ((t["prompt_ms"] + t["predicted_ms"]) / 1000.0)


def sse_events(f):
    """Yields the `data:` payloads (bytes) of an HTTP/1.1 SSE response body read from the buffered
    file `f` (after the headers), chunked or not. A lean reader: the bench measures the server's
    protocol, not http.client's per-line overhead."""
    buf = b""
    while True:
        size_line = f.readline()
        if not size_line:
            return
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        buf += f.read(size)
        f.read(2)  # CRLF after the chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[6:]


def run_http_sse(srv, prompt, n):
    body = json.dumps(dict(body_for(prompt, n), stream=True)).encode()
    t0 = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=REQ_TIMEOUT)
    try:
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        f = sock.makefile("rb", buffering=1 << 16)
        status = f.readline()
        headers = {}
        while True:
            line = f.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if b" 200 " not in status or "chunked" not in headers.get("transfer-encoding", ""):
            raise RuntimeError("SSE: %r %r" % (status, headers))
        text, last, n_events = [], None, 0
        for data in sse_events(f):
            ev = json.loads(data)
            n_events += 1
            text.append(ev.get("content", ""))
            if ev.get("stop"):
                last = ev
                break
        t1 = time.perf_counter()
    finally:
        sock.close()
    if last is None:
        raise RuntimeError("SSE stream ended without the final event")
    return {"rate": last["tokens_predicted"] / (t1 - t0), "engine_rate_streamed": engine_rate(last["timings"]),
            "text": "".join(text), "n": last["tokens_predicted"], "events": n_events}


def run_stdio_stream(srv, prompt, n):
    t0 = time.perf_counter()
    rid = srv.send("completion", dict(body_for(prompt, n), stream=True))
    text, n_events = [], 0
    while True:
        m = srv.read()
        if m.get("method") == "completion.chunk":
            text.append(m["params"]["data"]["content"])
            n_events += 1
            continue
        if m.get("id") == rid:
            break
    t1 = time.perf_counter()
    if "error" in m:
        raise RuntimeError("stdio: %r" % m["error"])
    res = m["result"]
    return {"rate": res["tokens_predicted"] / (t1 - t0), "engine_rate_streamed": engine_rate(res["timings"]),
            "text": "".join(text), "n": res["tokens_predicted"], "events": n_events}


def run_engine_http(srv, prompt, n):
    t0 = time.perf_counter()
    st, res = srv.post("/completion", body_for(prompt, n))
    t1 = time.perf_counter()
    if st != 200:
        raise RuntimeError("HTTP %d %r" % (st, res))
    return {"rate": engine_rate(res["timings"]), "client_rate": res["tokens_predicted"] / (t1 - t0),
            "text": res["content"], "n": res["tokens_predicted"]}


def run_engine_stdio(srv, prompt, n):
    t0 = time.perf_counter()
    m = srv.call("completion", body_for(prompt, n))
    t1 = time.perf_counter()
    if "error" in m:
        raise RuntimeError("stdio: %r" % m["error"])
    res = m["result"]
    return {"rate": engine_rate(res["timings"]), "client_rate": res["tokens_predicted"] / (t1 - t0),
            "text": res["content"], "n": res["tokens_predicted"]}


GEN_RE = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([0-9.]+) ms")


def run_generate(binary, model, threads, prompt, n, env):
    cmd = [binary, "generate", "-m", model, "-t", str(threads), "-p", prompt, "-n", str(n), "--temp", "0",
           "--ignore-eos", "--no-display-prompt", "--log-level", "warn"]
    out = subprocess.run(cmd, capture_output=True, timeout=REQ_TIMEOUT, env=env)
    if out.returncode != 0:
        raise RuntimeError("generate failed: " + out.stderr.decode(errors="replace")[-500:])
    got = {m.group(1): (int(m.group(2)), float(m.group(3))) for m in GEN_RE.finditer(out.stderr.decode())}
    if "decoded" not in got or "encoded" not in got:
        raise RuntimeError("generate: no timings in " + out.stderr.decode(errors="replace")[-500:])
    n_dec, ms = got["decoded"][0], got["encoded"][1] + got["decoded"][1]
    return {"rate": n_dec / (ms / 1000.0), "text": out.stdout.decode("utf-8", "replace")[:-1], "n": n_dec}  # generate adds one "\n"


# ---- part 1 -------------------------------------------------------------------------------------

def throughput(args, env):
    model = os.path.join(args.models, "stories260K-x100M-Q8_0.gguf")
    sargs = ["-m", model, "-t", str(args.threads), "-np", "1"]
    log("throughput: starting the HTTP and stdio servers (%s)" % " ".join(sargs))
    hs = HttpServer(args.bin, sargs, env)
    try:
        ss = StdioServer(args.bin, sargs, env)
    except BaseException:
        hs.stop()
        raise
    try:
        return throughput_runs(args, env, model, hs, ss)
    finally:  # also on errors: no server is left running
        for srv in (hs, ss):
            if srv.proc.poll() is None:
                srv.stop()


def throughput_runs(args, env, model, hs, ss):
    n_ctx = json.loads(hs.get("/props")[1]).get("n_ctx", 0)
    if n_ctx and n_ctx < args.n_predict + 32:
        raise SystemExit("the model's context (%d) is too small for --n-predict %d" % (n_ctx, args.n_predict))
    # idle CPU of a loaded server (two servers are up at once: the idle one must not compete)
    c0 = cpu_seconds(ss.proc.pid)
    time.sleep(1.0)
    idle_cpu = (cpu_seconds(ss.proc.pid) - c0) / 1.0
    prompts = PROMPTS[:args.prompts]
    variants = {
        "http-sse": lambda p: run_http_sse(hs, p, args.n_predict),
        "http-engine": lambda p: run_engine_http(hs, p, args.n_predict),
        "stdio": lambda p: run_stdio_stream(ss, p, args.n_predict),
        "stdio-engine": lambda p: run_engine_stdio(ss, p, args.n_predict),
        "generate": lambda p: run_generate(args.bin, model, args.threads, p, args.n_predict, env),
    }
    pids = {"http-sse": hs.proc.pid, "http-engine": hs.proc.pid, "stdio": ss.proc.pid, "stdio-engine": ss.proc.pid}

    def timed(v, p):
        """Runs a variant; adds the server's CPU ms per token and this client's (the bench's) CPU ms per token."""
        pid = pids.get(v)
        s0, c0 = (cpu_seconds(pid) if pid else 0.0), time.process_time()
        r = variants[v](p)
        s1, c1 = (cpu_seconds(pid) if pid else 0.0), time.process_time()
        r["server_cpu_ms_tok"] = 1000.0 * (s1 - s0) / max(1, r["n"]) if pid else float("nan")
        r["client_cpu_ms_tok"] = 1000.0 * (c1 - c0) / max(1, r["n"])
        return r

    names = list(variants)
    # warm-up: one run of every server variant (page cache, thread pools)
    for p in prompts[:1]:
        for v in ("http-sse", "stdio", "http-engine", "stdio-engine"):
            variants[v](p)
    res = {}  # (variant, round, prompt) -> dict
    t_start = time.time()
    rng = random.Random(args.seed)
    stopped = False
    for rnd in range(args.reps):
        for pi, p in enumerate(prompts):
            if time.time() - t_start > args.budget:
                log("throughput: time budget of %.0f s used up: stopping before round %d prompt %d" % (
                    args.budget, rnd + 1, pi + 1))
                stopped = True
                break
            order = list(names)
            rng.shuffle(order)  # no variant always first, nor always after the same one
            prev = None
            for v in order:
                res[(v, rnd, pi)] = r = timed(v, p)
                r["after"] = prev
                prev = v
                if r["n"] != args.n_predict:
                    raise RuntimeError("%s: %d tokens, %d expected" % (v, r["n"], args.n_predict))
            log("  round %d/%d prompt %d: %s  (t/s, in run order; load %s)" % (rnd + 1, args.reps, pi + 1, "  ".join(
                "%s %.1f" % (v, res[(v, rnd, pi)]["rate"]) for v in order), loadavg()))
        if stopped:
            break
    groups = sorted({(r, pi) for (_, r, pi) in res})  # complete (round, prompt) groups, all variants
    hs_rc, ss_rc = hs.stop(), ss.stop()
    # greedy: every variant must produce the same text for a prompt
    if not groups:
        raise SystemExit("throughput: no complete run within the time budget")
    same = all(len({res[(v, r, pi)]["text"] for v in names for (r, pj) in groups if pj == pi}) <= 1
               for pi in range(len(prompts)))

    def rates(v, key="rate"):
        return [res[(v, r, pi)][key] for (r, pi) in groups]

    def ratio(a, b, key_a="rate", key_b="rate"):
        return [res[(a, r, pi)][key_a] / res[(b, r, pi)][key_b] for (r, pi) in groups]

    out = []
    out.append("### Protocol cost: streamed completion vs in-process (%s, `-t %d -np 1`, greedy, %d tokens, "
               "%d prompts, %d runs of each variant)\n" % (os.path.basename(model), args.threads, args.n_predict,
                                                            len(prompts), len(groups)))
    out.append("| variant | what is timed | tokens/s (median) | min | max | ratio to engine (median) "
               "| runs < 0.9x engine |")
    out.append("|---|---|---:|---:|---:|---:|---:|")

    def row(v, what, ref=None, key="rate"):
        xs = rates(v, key)
        rs = ratio(v, ref, key) if ref else []
        rr = "%.3f" % median(rs) if ref else "1 (reference)"
        slow = "%d / %d" % (sum(x < 0.9 for x in rs), len(rs)) if ref else ""
        out.append("| %s | %s | %.1f | %.1f | %.1f | %s | %s |" % (v, what, median(xs), min(xs), max(xs), rr, slow))

    row("http-engine", "engine timings of a non-streamed call (HTTP server)")
    row("http-sse", "client: POST /completion SSE, request sent → final event", "http-engine")
    row("stdio-engine", "engine timings of a non-streamed call (stdio server)")
    row("stdio", "client: completion.chunk stream, request written → response read", "stdio-engine")
    row("generate", "`specrpc generate`, encoded + decoded ms (cross-check)", "http-engine")
    out.append("")
    out.append("| diagnostic | HTTP | stdio |")
    out.append("|---|---:|---:|")
    out.append("| engine's own tokens/s during the streamed call / in the non-streamed call | %.3f | %.3f |" % (
        median(ratio("http-sse", "http-engine", "engine_rate_streamed")),
        median(ratio("stdio", "stdio-engine", "engine_rate_streamed"))))
    out.append("| client-seen tokens/s of the non-streamed call / engine figure | %.3f | %.3f |" % (
        median(ratio("http-engine", "http-engine", "client_rate")),
        median(ratio("stdio-engine", "stdio-engine", "client_rate"))))
    out.append("| server CPU ms per token, streamed / non-streamed (medians) | %.2f / %.2f | %.2f / %.2f |" % (
        median(rates("http-sse", "server_cpu_ms_tok")), median(rates("http-engine", "server_cpu_ms_tok")),
        median(rates("stdio", "server_cpu_ms_tok")), median(rates("stdio-engine", "server_cpu_ms_tok"))))
    out.append("| client (this script) CPU ms per token, streamed / non-streamed | %.3f / %.3f | %.3f / %.3f |" % (
        median(rates("http-sse", "client_cpu_ms_tok")), median(rates("http-engine", "client_cpu_ms_tok")),
        median(rates("stdio", "client_cpu_ms_tok")), median(rates("stdio-engine", "client_cpu_ms_tok"))))
    out.append("| streamed events per request (median) | %d | %d |" % (
        median(rates("http-sse", "events")), median(rates("stdio", "events"))))
    out.append("")
    worst = min(median(ratio("http-sse", "http-engine")), median(ratio("stdio", "stdio-engine")))
    n_slow = sum(x < 0.9 for v, ref in (("http-sse", "http-engine"), ("stdio", "stdio-engine"))
                 for x in ratio(v, ref))
    out.append("Streamed / in-process: worst transport %.3f (target >= 0.98: %s; streamed runs below 0.9x: %d of %d). "
               "Identical greedy text in every variant: %s. Idle server CPU while the other one works: %.1f%% of a "
               "core. Server exit codes: %s / %s." % (
                   worst, "met" if worst >= 0.98 else "NOT met", n_slow, 2 * len(groups), "yes" if same else "NO",
                   100 * idle_cpu, hs_rc, ss_rc))
    out.append("")
    out.append("*In-process* is the engine's own `timings` (prompt_ms + predicted_ms) of a non-streamed call on "
               "the same server, interleaved with the streamed calls: the same generation with no per-token "
               "protocol work, in the same warm process under the same machine load. The streamed figures are "
               "client-side wall time from sending the request to reading the final answer, so they include "
               "everything the protocol adds (connect, parse, tokenize, queue, one event per token, the final "
               "JSON, the Python client's parsing). `specrpc generate` (a fresh process per run) is a cross-check "
               "that the server's engine is not slower than a bare one. The engine's own rate during the "
               "streamed call separates CPU taken from the engine (ratio < 1) from delivery latency; the CPU rows "
               "(utime + stime of the server process, and of this script) show what the protocol costs in CPU "
               "whatever the machine's load: with `-t 2` on 2 cores every protocol cycle is taken from the "
               "engine's threads.")
    return "\n".join(out)


# ---- part 2 -------------------------------------------------------------------------------------

def load_test(args, env):
    model = os.path.join(args.models, "stories260K-F32.gguf")
    sargs = ["-m", model, "-t", str(args.threads), "-np", "4"]
    log("load: starting the server (%s), %d clients for %.0f s" % (" ".join(sargs), args.clients, args.load_seconds))
    hs = HttpServer(args.bin, sargs, env)
    try:
        return load_runs(args, model, hs)
    finally:
        if hs.proc.poll() is None:
            hs.stop()


def load_runs(args, model, hs):
    prompts = PROMPTS + ["One day, a big bear", "Sam had a red ball", "The sun was hot and"]
    lat, errors, tokens = [], {}, [0]
    lock = threading.Lock()
    stop_at = [0.0]
    start = threading.Barrier(args.clients + 1)

    def client(i):
        start.wait()
        j = 0
        while time.perf_counter() < stop_at[0]:
            body = {"prompt": prompts[(i + j) % len(prompts)], "n_predict": args.load_tokens, "ignore_eos": True,
                    "temperature": 0.8, "seed": i * 1000 + j}
            j += 1
            t0 = time.perf_counter()
            try:
                st, res = hs.post("/completion", body)
                ok = st == 200 and res.get("tokens_predicted") == args.load_tokens
                err = None if ok else "HTTP %d" % st
            except (OSError, http.client.HTTPException, ValueError) as e:
                err = type(e).__name__
            t1 = time.perf_counter()
            with lock:
                if err:
                    errors[err] = errors.get(err, 0) + 1
                else:
                    lat.append(t1 - t0)
                    tokens[0] += args.load_tokens

    # warm-up (not counted)
    for p in prompts[:4]:
        hs.post("/completion", {"prompt": p, "n_predict": args.load_tokens, "ignore_eos": True})
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    c0 = cpu_seconds(hs.proc.pid)
    t0 = time.perf_counter()
    stop_at[0] = t0 + args.load_seconds
    start.wait()
    for t in threads:
        t.join(args.load_seconds + REQ_TIMEOUT)
    elapsed = time.perf_counter() - t0
    server_cpu = cpu_seconds(hs.proc.pid) - c0
    st, m = hs.post("/rpc", {"jsonrpc": "2.0", "id": 1, "method": "metrics"})
    rc = hs.stop()
    n = len(lat)
    out = ["### Load: %d clients, `-np 4` on %s (`-t %d`), %d-token completions, %.0f s\n" % (
        args.clients, os.path.basename(model), args.threads, args.load_tokens, elapsed)]
    out.append("| requests | errors | requests/s | tokens/s | latency p50 | p90 | p99 | max | server CPU |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out.append("| %d | %s | %.1f | %.0f | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f%% |" % (
        n, sum(errors.values()) if not errors else "%d (%s)" % (sum(errors.values()), ", ".join(
            "%s: %d" % kv for kv in sorted(errors.items()))), n / elapsed, tokens[0] / elapsed,
        1000 * pct(lat, 50), 1000 * pct(lat, 90), 1000 * pct(lat, 99), 1000 * max(lat) if lat else float("nan"),
        100 * server_cpu / elapsed))
    mm = m.get("result", {}) if isinstance(m, dict) else {}
    out.append("")
    out.append("Latency: client-side, connect to the last byte of the answer (one connection per request). "
               "Server exit code %s; server-side `requests_processing` at the end %s." % (
                   rc, mm.get("requests_processing", "?")))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/specrpc", help="the specrpc binary")
    ap.add_argument("--models", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                      "shared", "models"))
    ap.add_argument("--quick", action="store_true", help="2 prompts, 2 rounds, 128 tokens, 5 s of load")
    ap.add_argument("--reps", type=int, default=None, help="rounds over the prompts (default 5, quick 2)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts used (max %d)" % len(PROMPTS))
    ap.add_argument("--n-predict", type=int, default=None, help="tokens per throughput run (default 256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--load-seconds", type=float, default=None, help="default 20, quick 5")
    ap.add_argument("--load-tokens", type=int, default=32)
    ap.add_argument("--budget", type=float, default=None,
                    help="throughput part: start no new (round, prompt) group after this many s (default 600, quick 120)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the variants' order in each group")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    q = args.quick
    args.reps = args.reps or (2 if q else 5)
    args.prompts = max(1, min(len(PROMPTS), args.prompts or (2 if q else 4)))
    args.n_predict = args.n_predict or (128 if q else 256)
    args.load_seconds = args.load_seconds or (5.0 if q else 20.0)
    args.budget = args.budget or (120.0 if q else 600.0)
    if not os.access(args.bin, os.X_OK):
        raise SystemExit("not an executable: %s" % args.bin)
    env = dict(os.environ, SPECRPC_LOG="warn")
    la0 = loadavg()
    parts = []
    t0 = time.time()
    if not args.skip_throughput:
        parts.append(throughput(args, env))
    if not args.skip_load:
        parts.append(load_test(args, env))
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    print("## specrpc protocol benchmark%s\n" % (" (quick)" if q else ""))
    print("%s, %d cores, %s; load average at start %s, at end %s; %.0f s.\n" % (
        cpu or platform.machine(), os.cpu_count() or 0, os.path.basename(args.bin), la0, loadavg(), time.time() - t0))
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
