"""Soak test of `specrpc serve`: the real binary (stories260K-F32, -t 1 -np 2) over HTTP and over
stdio at once, fed for a bounded time (SPECRPC_SOAK_SECONDS, default 40) with a random mix of
valid, invalid and cancelled requests by four client threads (two per transport).

Checked:
  - every request is answered with the right shape: a result of the expected form, or the
    expected JSON-RPC error code (and data.param for -32602; HTTP status + rpc_code on REST);
    no stray or duplicate answers;
  - the next valid request after every bad or cancelled one succeeds, with the greedy reference
    text (so a bad request never poisons a slot);
  - the servers never die and answer `health` at the end;
  - memory is flat: the floor of VmRSS (/proc/PID/status) after the warm-up vs at the end (bound: see RSS_BOUND_MB);
  - graceful exit: SIGTERM (HTTP) / end of input (stdio; SIGTERM there ends with _Exit(0), which
    skips the leak checker) → exit code 0. In an ASan build, leak
    checking is switched on for the servers and their stderr must have no LeakSanitizer,
    AddressSanitizer or UBSan ("runtime error:") report.

The mix (seeded; the seed is printed, SPECRPC_SOAK_SEED replays the choices, not the timing):
valid completions (greedy, sampled, streamed, grammar, stop words), tokenize/detokenize, props,
metrics, slots, v1/completions; malformed JSON, invalid requests, batches, notifications, bodies
over the 8 MiB limit, wrong types, out-of-range values, unknown methods, huge n_predict, bad token
ids, invalid grammars, prompts beyond the context, over JSON-RPC and over the REST routes (also
with stream: true); $/cancelRequest of streamed and plain calls (stdio), connections dropped
mid-stream, mid-call and mid-request, garbage request lines (HTTP).

Env: SPECRPC_BIN, SPECRPC_MODELS_DIR (set by tests/CMakeLists.txt), SPECRPC_SOAK_SECONDS,
SPECRPC_SOAK_SEED, SPECRPC_SOAK_VERBOSE=1 (per-case counts and the RSS trace on stderr).
"""

import http.client
import itertools
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_capi import is_asan_build, wait_or_kill  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from specrpc.client import json_lines  # noqa: E402

BIN = os.environ.get("SPECRPC_BIN", os.path.join(HERE, "..", "build", "specrpc"))
MODELS = os.environ.get("SPECRPC_MODELS_DIR", os.path.join(HERE, "..", "..", "shared", "models"))
TARGET = os.path.join(MODELS, "stories260K-F32.gguf")
LSAN_SUPP = os.path.join(HERE, "..", "scripts", "lsan.supp")
SERVER_ARGS = ["-m", TARGET, "-t", "1", "-np", "2"]
SOAK_SECONDS = float(os.environ.get("SPECRPC_SOAK_SECONDS", "40"))
SEED = int(os.environ.get("SPECRPC_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))
VERBOSE = os.environ.get("SPECRPC_SOAK_VERBOSE", "") not in ("", "0")
TIMEOUT = 60  # seconds for any single answer (ASan build, loaded machine): beyond that it hangs

# Memory bound. After the warm-up every code path of the mix has run (slots, samplers, grammar,
# HTTP threads, stdio workers, allocator arenas), so the RSS of a server that frees what it
# allocates stays within allocator noise: measured per request type (600 runs each, Release),
# under 100 KB. A leak of 1 KiB per request - the size of one small JSON answer - over the
# ~10^4 requests of a 40 s soak would already be 10 MB; 16 MB leaves room for noise and still
# catches any per-request leak of a few KiB. In an ASan build freed memory sits in ASan's
# quarantine before it is reused, so the RSS rises with allocation volume, not with leaks: the
# servers get a 32 MB quarantine (default 256 MB) and the bound is that, plus the same 16 MB, plus
# 16 MB for the buffers of an oversized (8 MiB) body that may be in flight or just freed (a
# string grown by doubling); there LeakSanitizer at exit is the leak check. (LSan cannot see
# memory that is still reachable, e.g. a cache that grows without limit: the RSS bound can.)
RSS_BOUND_MB = 16
ASAN_QUARANTINE_MB = 32

BAD_REPORT = re.compile(r"ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:")
ENV = dict(os.environ, SPECRPC_LOG=os.environ.get("SPECRPC_LOG", "warn"))


ASAN = is_asan_build(BIN)


def server_env():
    env = dict(ENV)
    if ASAN:
        # ctest runs the python tests with detect_leaks=0 (python itself "leaks"); the server is
        # ours: leak checking on (a later flag wins), with the llama.cpp suppressions.
        env["ASAN_OPTIONS"] = ":".join(x for x in (env.get("ASAN_OPTIONS", ""), "detect_leaks=1",
                                                   "quarantine_size_mb=%d" % ASAN_QUARANTINE_MB) if x)
        if "suppressions=" not in env.get("LSAN_OPTIONS", ""):
            env["LSAN_OPTIONS"] = ":".join(x for x in (env.get("LSAN_OPTIONS", ""),
                                                         "suppressions=" + os.path.abspath(LSAN_SUPP)) if x)
    return env


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


class CheckFailed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def short(obj, n=300):
    s = obj if isinstance(obj, str) else json.dumps(obj)
    return s if len(s) <= n else s[:n] + "..."


# ---- the servers ------------------------------------------------------------------------------

class Proc:
    """A server process whose stderr is collected by a thread."""

    def __init__(self, cmd, stdio):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if stdio else subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=server_env(), bufsize=0)
        self.stderr = []
        self.lines = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.stderr.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def text(self):
        return "".join(self.stderr)

    def alive(self):
        return self.proc.poll() is None

    def rss_kb(self):
        return rss_kb(self.proc.pid)

    def finish(self, timeout=60):
        """Waits for the exit (already asked for); returns the exit code (None: had to be killed)."""
        rc = wait_or_kill(self.proc, timeout)
        self.pump.join(10)
        return rc


class HttpServer(Proc):
    def __init__(self):
        super().__init__([BIN, "serve", "--port", "0", *SERVER_ARGS], stdio=False)
        self.port = None
        deadline = time.time() + 60
        while self.port is None and time.time() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if line is None:
                break
            m = re.search(r"listening on http://[^\s]*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("HTTP server did not start: " + self.text())

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.finish()


class StdioServer(Proc):
    """`serve --stdio` with a reader routing answers by id; answers with id null and batch answers
    (lists) go to `self.null`, which only one caller at a time may wait on (`raw_lock`)."""

    def __init__(self):
        super().__init__([BIN, "serve", "--stdio", *SERVER_ARGS], stdio=True)
        self.lock = threading.Lock()
        self.raw_lock = threading.Lock()
        self.pending = {}  # json id -> Queue of messages
        self.null = queue.Queue()
        self.strays = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for msg in json_lines(self.proc.stdout, lambda text: self.strays.append("not JSON: " + short(text))):
            if isinstance(msg, list):
                self.null.put(msg)
                continue
            if not isinstance(msg, dict):
                self.strays.append("not an object: " + short(msg))
                continue
            if "method" in msg and "id" not in msg:  # a notification (completion.chunk)
                key = json.dumps((msg.get("params") or {}).get("id"))
            elif msg.get("id") is None:
                self.null.put(msg)
                continue
            else:
                key = json.dumps(msg.get("id"))
            with self.lock:
                q = self.pending.get(key)
            if q is None:
                self.strays.append("unexpected: " + short(msg))
            else:
                q.put(msg)
        with self.lock:
            for q in self.pending.values():
                q.put(None)
        self.null.put(None)

    def write(self, data):
        if isinstance(data, str):
            data = data.encode()
        with self.lock:
            self.proc.stdin.write(data + b"\n")
            self.proc.stdin.flush()

    def register(self, rid):
        q = queue.Queue()
        with self.lock:
            self.pending[json.dumps(rid)] = q
        return q

    def unregister(self, rid):
        with self.lock:
            self.pending.pop(json.dumps(rid), None)

    def stop(self):
        try:
            self.proc.stdin.close()  # end of input: a graceful exit (SIGTERM would _Exit)
        except OSError:
            pass
        rc = self.finish()
        self.reader.join(10)
        return rc


# ---- transports: the same operations over HTTP and stdio ----------------------------------------

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def new_id(kind="int"):
    with _ids_lock:
        n = next(_ids)
    return n if kind == "int" else "s-%d" % n


def get(q, what):
    try:
        m = q.get(timeout=TIMEOUT)
    except queue.Empty:
        raise CheckFailed("no answer within %ds to %s (hang)" % (TIMEOUT, what))
    check(m is not None, "the server closed its output during " + what)
    return m


class HttpT:
    name = "http"

    def __init__(self, srv):
        self.srv = srv
        self.port = srv.port

    def _conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)

    def post(self, path, body, headers=None):
        conn = self._conn()
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            conn.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body).encode(), headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise CheckFailed("POST %s %s: %r" % (path, short(body if not isinstance(body, bytes) else
                                                             body.decode("utf-8", "replace")), e))
        finally:
            conn.close()

    def call(self, method, params, rid=None):
        req = {"jsonrpc": "2.0", "id": new_id() if rid is None else rid, "method": method, "params": params}
        status, _, body = self.post("/rpc", req)
        check(status == 200, "POST /rpc %s: HTTP %d %s" % (short(req), status, short(body.decode(errors="replace"))))
        return req["id"], json.loads(body)

    def raw(self, data, rid=None):
        status, _, body = self.post("/rpc", data)
        if status == 204:
            return None
        check(status in (200, 400, 413), "POST /rpc raw: HTTP %d" % status)
        return json.loads(body)

    def notify(self, method, params):
        status, _, body = self.post("/rpc", {"jsonrpc": "2.0", "method": method, "params": params})
        check(status == 204 and body == b"", "notification answered: HTTP %d %r" % (status, body[:200]))

    def stream(self, method, params, stop_after=None):
        """JSON-RPC with SSE. stop_after=k: drop the connection after k chunks (response None)."""
        rid = new_id()
        req = {"jsonrpc": "2.0", "id": rid, "method": method, "params": dict(params, stream=True)}
        conn = self._conn()
        chunks, resp = [], None
        try:
            conn.request("POST", "/rpc", body=json.dumps(req).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            r = conn.getresponse()
            check(r.status == 200, "SSE /rpc: HTTP %d" % r.status)
            check("text/event-stream" in (r.getheader("Content-Type") or ""), "SSE /rpc: not an event stream")
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("method") == "completion.chunk":
                    check(msg["params"]["id"] == rid, "chunk for id %r in the stream of %r" % (msg["params"]["id"], rid))
                    chunks.append(msg["params"]["data"])
                    if stop_after is not None and len(chunks) >= stop_after:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                        return rid, chunks, None
                else:
                    resp = msg
            return rid, chunks, resp
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise CheckFailed("SSE /rpc %s: %r" % (short(req), e))
        finally:
            conn.close()


class StdioT:
    name = "stdio"

    def __init__(self, srv):
        self.srv = srv

    def call(self, method, params, rid=None):
        rid = new_id("str" if random.random() < 0.5 else "int") if rid is None else rid
        q = self.srv.register(rid)
        try:
            self.srv.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            m = get(q, "%s %s" % (method, short(params)))
            check("method" not in m, "a notification for a call that does not stream: " + short(m))
            return rid, m
        finally:
            self.srv.unregister(rid)

    def raw(self, data, rid=None):
        """Writes one line as it is; the answer is the one with id `rid` (None: id null or a batch)."""
        what = "raw " + short(data.decode("utf-8", "replace"))
        if rid is not None:
            q = self.srv.register(rid)
            try:
                self.srv.write(data)
                return get(q, what)
            finally:
                self.srv.unregister(rid)
        with self.srv.raw_lock:
            self.srv.write(data)
            return get(self.srv.null, what)

    def notify(self, method, params):
        self.srv.write(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}))

    def stream(self, method, params, stop_after=None, cancel_as_request=False):
        """stop_after=k: $/cancelRequest after k chunks; the answer must then be -32800."""
        rid = new_id("str" if random.random() < 0.5 else "int")
        q = self.srv.register(rid)
        chunks = []
        try:
            self.srv.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                       "params": dict(params, stream=True)}))
            cancelled = False
            while True:
                m = get(q, "stream %s" % short(params))
                if m.get("method") == "completion.chunk":
                    chunks.append(m["params"]["data"])
                    if stop_after is not None and len(chunks) >= stop_after and not cancelled:
                        cancelled = True
                        cancel = {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rid}}
                        if cancel_as_request:  # answered with id null? no: with its own id
                            cancel["id"] = new_id("str")
                            cq = self.srv.register(cancel["id"])
                        self.srv.write(json.dumps(cancel))
                        if cancel_as_request:
                            try:
                                cm = get(cq, "$/cancelRequest")
                            finally:
                                self.srv.unregister(cancel["id"])
                            check("result" in cm and cm["result"] is None,
                                  "$/cancelRequest as a request: " + short(cm))
                    continue
                check("method" not in m, "unexpected notification " + short(m))
                return rid, chunks, m
        finally:
            self.srv.unregister(rid)


# ---- checks ---------------------------------------------------------------------------------------

def expect_envelope(resp, rid):
    check(isinstance(resp, dict), "answer is not an object: " + short(resp))
    check(resp.get("jsonrpc") == "2.0", "jsonrpc != 2.0: " + short(resp))
    check("id" in resp and resp["id"] == rid and type(resp["id"]) is type(rid),
          "id %r expected: %s" % (rid, short(resp)))
    check(("result" in resp) != ("error" in resp), "exactly one of result/error: " + short(resp))


def expect_error(resp, rid, code, param=None):
    expect_envelope(resp, rid)
    check("error" in resp, "error %d expected, got a result: %s" % (code, short(resp)))
    err = resp["error"]
    check(err.get("code") == code, "error %d expected: %s" % (code, short(resp)))
    check(isinstance(err.get("message"), str) and err["message"], "error without a message: " + short(resp))
    if param is not None:
        check(isinstance(err.get("data"), dict) and err["data"].get("param") == param,
              "data.param %r expected: %s" % (param, short(resp)))
    return err


def expect_result(resp, rid):
    expect_envelope(resp, rid)
    check("result" in resp, "a result expected: " + short(resp))
    return resp["result"]


def check_completion(r, n=None, content=None):
    check(isinstance(r, dict), "completion result is not an object: " + short(r))
    for k, t in (("content", str), ("tokens_predicted", int), ("tokens_evaluated", int), ("stop", bool),
                 ("stop_type", str), ("timings", dict), ("generation_settings", dict)):
        check(isinstance(r.get(k), t), "completion result: %s is not %s: %s" % (k, t.__name__, short(r)))
    check(r["stop"] is True, "stop is not true: " + short(r))
    if n is not None:
        check(r["tokens_predicted"] == n, "tokens_predicted %d != %d" % (r["tokens_predicted"], n))
    if content is not None:
        check(r["content"] == content, "content %r != %r" % (r["content"], content))


# ---- the mix ------------------------------------------------------------------------------------

PROMPT = "Once upon a time"
LONG_PROMPT = "Lily saw a big red ball. " * 60  # > 512 tokens: beyond the context per slot
REF_N = 6
REF = {}  # the greedy reference text of PROMPT, REF_N tokens (set in setUpClass)

P = -32602
# (method, params, code, data.param): wrong types, out-of-range values, huge n_predict, bad token
# ids, invalid grammars, a prompt beyond the context.
BAD_PARAMS = [
    ("completion", {"prompt": 5}, P, "prompt"),
    ("completion", {}, P, "prompt"),
    ("completion", {"prompt": []}, P, "prompt"),
    # ({"prompt": [[1, 2], [3]]} is no longer bad: REST /completion runs several prompts, as llama-server)
    ("completion", {"prompt": PROMPT, "n_predict": "ten"}, P, "n_predict"),
    ("completion", {"prompt": PROMPT, "temperature": "hot"}, P, "temperature"),
    ("completion", {"prompt": PROMPT, "top_k": [1]}, P, "top_k"),
    ("completion", {"prompt": PROMPT, "ignore_eos": "yes"}, P, "ignore_eos"),
    ("completion", {"prompt": PROMPT, "stop": [1]}, P, "stop"),
    ("completion", {"prompt": PROMPT, "stop": {"a": 1}}, P, "stop"),
    ("completion", {"prompt": PROMPT, "grammar": 5}, P, "grammar"),
    ("completion", {"prompt": PROMPT, "logit_bias": "x"}, P, "logit_bias"),
    ("completion", {"prompt": PROMPT, "logit_bias": [[1, True]]}, P, "logit_bias"),
    ("completion", {"prompt": PROMPT, "speculative": 5}, P, "speculative"),
    ("completion", {"prompt": PROMPT, "speculative": {"type": "bogus"}}, P, "speculative.type"),
    ("completion", {"prompt": PROMPT, "speculative": {"type": "draft"}}, P, "speculative.type"),  # no -md
    ("completion", {"prompt": PROMPT, "n_predict": -5}, P, "n_predict"),
    ("completion", {"prompt": PROMPT, "n_predict": 2.5}, P, "n_predict"),
    ("completion", {"prompt": PROMPT, "mirostat": 3}, P, "mirostat"),
    ("completion", {"prompt": PROMPT, "top_k": 1.5}, P, "top_k"),
    ("completion", {"prompt": PROMPT, "repeat_penalty": 0}, P, "repeat_penalty"),
    ("completion", {"prompt": PROMPT, "seed": 2 ** 40}, P, "seed"),
    ("completion", {"prompt": PROMPT, "n_keep": -2}, P, "n_keep"),
    ("completion", {"prompt": PROMPT, "speculative": {"n_max": 100}}, P, "speculative.n_max"),
    ("completion", {"prompt": PROMPT, "speculative.n_min": 9, "speculative.n_max": 4}, P, "speculative.n_min"),
    ("completion", {"prompt": PROMPT, "stop": ["a"] * 17}, P, "stop"),
    ("completion", {"prompt": PROMPT, "stop": ["x" * 2000]}, P, "stop"),
    ("completion", {"prompt": PROMPT, "n_predict": 1 << 40}, P, "n_predict"),  # past int32: any int32 is a cap
    ("completion", {"prompt": PROMPT, "n_predict": 1e300}, P, "n_predict"),
    ("completion", {"prompt": PROMPT, "max_tokens": 10 ** 12}, P, "max_tokens"),
    ("completion", {"prompt": [1, 99999]}, P, "prompt"),
    ("completion", {"prompt": [-1]}, P, "prompt"),
    ("completion", {"prompt": [PROMPT, 2 ** 40]}, P, "prompt"),
    ("completion", {"prompt": PROMPT, "logit_bias": {"99999": 1}}, P, "logit_bias"),
    ("completion", {"prompt": PROMPT, "logit_bias": [[-3, 1]]}, P, "logit_bias"),
    ("completion", {"prompt": PROMPT, "grammar": "root ::= ("}, P, "grammar"),
    ("completion", {"prompt": PROMPT, "grammar": "root ::= foo"}, P, "grammar"),
    ("completion", {"prompt": PROMPT, "grammar": 'x ::= "a"'}, P, "grammar"),
    ("completion", {"prompt": PROMPT, "grammar": "root ::= [a-"}, P, "grammar"),
    ("completion", {"prompt": PROMPT, "grammar": 'root ::= "a" | ' * 50}, P, "grammar"),
    ("completion", {"prompt": LONG_PROMPT}, -32002, None),
    ("tokenize", {"content": 5}, P, "content"),
    ("detokenize", {"tokens": "abc"}, P, "tokens"),
    ("detokenize", {"tokens": [-1]}, P, "tokens"),
    ("detokenize", {"tokens": [1, 99999]}, P, "tokens"),
    ("no_such_method", {}, -32601, None),
    ("completion/", {"prompt": PROMPT}, -32601, None),
    ("", {}, -32601, None),
    ("rpc.discover_everything", None, -32601, None),
]
REST_ROUTES = {"completion": "/completion", "tokenize": "/tokenize", "detokenize": "/detokenize"}
HTTP_STATUS = {P: 400, -32002: 400, -32600: 400, -32700: 400}

# Raw bodies: (bytes with %ID% for a fresh string id, code, the id echoed: "id" or None).
RAW = [
    (b'{oops', -32700, None),
    (b'{"jsonrpc":"2.0","id":"%ID%","method":"completion","params":{"prompt":"x"', -32700, None),
    (b'{"jsonrpc":"2.0","id":"%ID%","method":"tokenize","params":{"content":"\xff\xfe bad utf-8"}}', -32700, None),
    (b'\x00\x01\x02', -32700, None),
    (b'[]', -32600, None),
    (b'42', -32600, None),
    (b'"just a string"', -32600, None),
    (b'{"jsonrpc":"1.0","id":"%ID%","method":"health"}', -32600, "id"),
    (b'{"id":"%ID%","method":"health"}', -32600, "id"),
    (b'{"jsonrpc":"2.0","id":"%ID%","method":5}', -32600, "id"),
    (b'{"jsonrpc":"2.0","id":"%ID%","method":"health","params":7}', -32600, "id"),
    (b'{"jsonrpc":"2.0","id":{"a":1},"method":"health"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":"%ID%","method":"completion","params":' + b'[' * 300 + b']' * 300 + b'}', -32600, None),
]


def case_bad_params(t, rng):
    method, params, code, param = rng.choice(BAD_PARAMS)
    if method == "completion" and isinstance(params, dict) and rng.random() < 0.3:
        params = dict(params, stream=True)  # errors found before any output: no chunk, the plain error
    if isinstance(t, HttpT) and method in REST_ROUTES and isinstance(params, dict) and rng.random() < 0.4:
        status, headers, body = t.post(REST_ROUTES[method], params)
        check(status == HTTP_STATUS[code], "REST %s %s: HTTP %d, %d expected: %s" % (
            REST_ROUTES[method], short(params), status, HTTP_STATUS[code], short(body.decode(errors="replace"))))
        check("json" in headers.get("content-type", ""), "REST error is not JSON: %r" % headers)
        err = json.loads(body).get("error", {})
        check(err.get("rpc_code") == code, "REST %s %s: rpc_code %r != %d" % (
            REST_ROUTES[method], short(params), err.get("rpc_code"), code))
        if param is not None:
            check(err.get("param") == param, "REST error param %r != %r" % (err.get("param"), param))
        return
    if params is None:
        rid = new_id()
        resp = t.raw(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method}).encode(), rid)
    elif isinstance(t, StdioT) and params.get("stream"):
        rid, chunks, resp = t.stream(method, params)
        check(chunks == [], "chunks before an error: %s" % short(chunks))
    else:
        rid, resp = t.call(method, params)
    err = expect_error(resp, rid, code, param)
    if code == -32002:
        check(err["data"].get("n_ctx") == 512 and err["data"].get("n_prompt_tokens", 0) > 512,
              "context error data: " + short(err))


def case_params_not_object(t, rng):
    rid, resp = t.call("completion", rng.choice([[1, 2], [PROMPT]]))
    expect_error(resp, rid, P, "params")


def case_raw(t, rng):
    body, code, echo = rng.choice(RAW)
    sid = new_id("str")
    resp = t.raw(body.replace(b"%ID%", sid.encode()), sid if echo else None)
    expect_error(resp, sid if echo else None, code)


OVERSIZE = (b'{"jsonrpc":"2.0","id":1,"method":"tokenize","params":{"content":"' + b"a" * (8 << 20) +
            b'"}}')  # just over the 8 MiB body limit


def case_oversize(t, rng):
    if isinstance(t, HttpT):
        status, _, body = t.post("/rpc", OVERSIZE)
        check(status == 413, "oversized body: HTTP %d" % status)
        expect_error(json.loads(body), None, -32600)
    else:
        expect_error(t.raw(OVERSIZE), None, -32600)


def case_batch(t, rng):
    a, b, c = new_id("str"), new_id(), new_id("str")
    batch = [{"jsonrpc": "2.0", "id": a, "method": "health"},
             {"jsonrpc": "2.0", "id": b, "method": "nope"},
             {"jsonrpc": "2.0", "method": "health"},  # a notification: no answer
             {"jsonrpc": "2.0", "id": c, "method": "tokenize", "params": {"content": PROMPT}},
             7]
    rng.shuffle(batch)
    resp = t.raw(json.dumps(batch).encode())
    check(isinstance(resp, list) and len(resp) == 4, "batch: 4 answers expected: " + short(resp))
    by_id = {}
    for m in resp:
        check(isinstance(m, dict), "batch member: " + short(m))
        by_id.setdefault(json.dumps(m.get("id")), []).append(m)
    check(sorted(by_id) == sorted(json.dumps(x) for x in (a, b, c, None)), "batch ids: " + short(resp))
    expect_result(by_id[json.dumps(a)][0], a)
    expect_error(by_id[json.dumps(b)][0], b, -32601)
    toks = expect_result(by_id[json.dumps(c)][0], c)["tokens"]
    check(isinstance(toks, list) and toks and all(isinstance(x, int) for x in toks), "tokenize: " + short(toks))
    expect_error(by_id["null"][0], None, -32600)


def case_notification(t, rng):
    t.notify(rng.choice(["health", "completion", "nope"]), {"prompt": "x", "n_predict": 1})


def case_valid(t, rng):
    kind = rng.randrange(7)
    if kind == 0:
        n = rng.randint(1, 32)
        rid, resp = t.call("completion", {"prompt": rng.choice([PROMPT, "Tom and Sue", "The dog"]), "n_predict": n,
                                          "ignore_eos": True, "temperature": 0.8, "seed": rng.randrange(1 << 20),
                                          "top_k": 40, "n_probs": rng.choice([0, 3])})
        check_completion(expect_result(resp, rid), n)
    elif kind == 1:
        n = rng.randint(4, 24)
        rid, chunks, resp = t.stream("completion", {"prompt": PROMPT, "n_predict": n, "ignore_eos": True,
                                                    "temperature": 0})
        r = expect_result(resp, rid)
        check_completion(r, n)
        check("".join(c["content"] for c in chunks) == r["content"], "chunks do not add up to the content")
    elif kind == 2:
        rid, resp = t.call("completion", {"prompt": PROMPT, "n_predict": 8, "grammar": 'root ::= [a-z ]+',
                                          "temperature": 0})
        r = expect_result(resp, rid)
        check_completion(r)
        check(re.fullmatch(r"[a-z ]*", r["content"]) is not None, "grammar not obeyed: %r" % r["content"])
    elif kind == 3:
        rid, resp = t.call("tokenize", {"content": PROMPT})
        toks = expect_result(resp, rid)["tokens"]
        rid, resp = t.call("detokenize", {"tokens": toks})
        check(PROMPT in expect_result(resp, rid)["content"], "tokenize/detokenize round trip")
    elif kind == 4:
        for m in ("health", "props", "metrics", "slots"):
            rid, resp = t.call(m, {})
            check(isinstance(expect_result(resp, rid), (dict, list)), "%s: %s" % (m, short(resp)))
    elif kind == 5:
        rid, resp = t.call("completion", {"prompt": PROMPT, "n_predict": 16, "stop": [","], "temperature": 0})
        r = expect_result(resp, rid)
        check_completion(r)
        check(r["stop_type"] == "word" and r["stopping_word"] == ",", "stop word: " + short(r))
    else:
        rid, resp = t.call("v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
        r = expect_result(resp, rid)
        check(r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 5,
              "v1/completions: " + short(r))


LONG = {"prompt": PROMPT, "n_predict": 480, "ignore_eos": True, "temperature": 0}
LATE_CANCELS = []  # stdio cancellations that arrived after the generation had finished


def case_cancel_stream(t, rng):
    """stdio: $/cancelRequest after k chunks; HTTP: the connection dropped after k chunks."""
    k = rng.randint(1, 4)
    if isinstance(t, HttpT):
        if rng.random() < 0.5:
            rid, chunks, resp = t.stream("completion", LONG, stop_after=k)
        else:  # llama-server's REST SSE route
            conn = t._conn()
            try:
                conn.request("POST", "/completion", body=json.dumps(dict(LONG, stream=True)).encode(),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                check(r.status == 200, "SSE /completion: HTTP %d" % r.status)
                got = 0
                while got < k:
                    line = r.readline()
                    check(line, "SSE /completion ended after %d events" % got)
                    got += line.startswith(b"data: ")
                conn.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, http.client.HTTPException) as e:
                raise CheckFailed("SSE /completion: %r" % e)
            finally:
                conn.close()
            return
        check(resp is None and len(chunks) == k, "dropped stream")
        return
    rid, chunks, resp = t.stream("completion", LONG, stop_after=k, cancel_as_request=rng.random() < 0.3)
    if isinstance(resp, dict) and "result" in resp:
        # the whole generation was done before the cancellation arrived (a loaded machine: the
        # engine ran ahead of the client reading the chunks). Fine, but it must be whole.
        r = expect_result(resp, rid)
        check_completion(r, LONG["n_predict"])
        check("".join(c["content"] for c in chunks) == r["content"], "chunks do not add up to the content")
        LATE_CANCELS.append(rid)
        return
    err = expect_error(resp, rid, -32800)
    d = err.get("data") or {}
    check(d.get("cancelled") is True, "cancelled data: " + short(err))
    check(d.get("tokens_predicted", 1 << 30) < LONG["n_predict"], "cancelled, but complete: " + short(err))
    check(d.get("content") == "".join(c["content"] for c in chunks), "partial content != the chunks")


def case_cancel_call(t, rng):
    """A non-streamed long call: stdio cancels it by id; HTTP drops the connection before the answer."""
    if isinstance(t, HttpT):
        s = socket.create_connection(("127.0.0.1", t.port), timeout=TIMEOUT)
        try:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "completion", "params": LONG}).encode()
            s.sendall(b"POST /rpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            time.sleep(rng.uniform(0, 0.1))
        finally:
            s.close()
        return
    rid = new_id()
    q = t.srv.register(rid)
    try:
        t.srv.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "completion", "params": LONG}))
        time.sleep(rng.uniform(0.01, 0.08))
        t.notify("$/cancelRequest", {"id": rid})
        m = get(q, "cancelled completion")
    finally:
        t.srv.unregister(rid)
    if "result" in m:  # finished before the cancellation arrived: fine, but it must be whole
        check_completion(expect_result(m, rid), LONG["n_predict"])
        LATE_CANCELS.append(rid)
        return
    err = expect_error(m, rid, -32800)
    check((err.get("data") or {}).get("cancelled") is True, "cancelled data: " + short(err))


def case_cancel_unknown(t, rng):
    if isinstance(t, StdioT):
        t.notify("$/cancelRequest", {"id": "no-such-request"})
        rid, resp = t.call("$/cancelRequest", {"id": 987654321})
        check(expect_result(resp, rid) is None, "cancel of an unknown id: " + short(resp))
        return
    # HTTP: broken requests - a partial body or a bad Content-Length, then the client goes away
    # (the server waits for the rest until --timeout: no answer to wait for), or a garbage
    # request line (answered 400 at once).
    s = socket.create_connection(("127.0.0.1", t.port), timeout=TIMEOUT)
    try:
        kind = rng.randrange(3)
        if kind == 0:
            s.sendall(b"POST /rpc HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\":")
        elif kind == 1:
            s.sendall(b"POST /rpc HTTP/1.1\r\nHost: x\r\nContent-Length: -7\r\n\r\n")
        else:
            s.sendall(b"GARBAGE\r\n\r\n")
            head = s.recv(4096)
            check(head.startswith(b"HTTP/1.1 400"), "garbage request line: %r" % head[:100])
    except OSError:
        pass  # the server may close first: fine
    finally:
        s.close()


CASES = [  # (name, weight, function, valid?)
    ("bad_params", 30, case_bad_params, False),
    ("params_not_object", 2, case_params_not_object, False),
    ("raw", 12, case_raw, False),
    ("batch", 4, case_batch, False),
    ("oversize", 1, case_oversize, False),
    ("notification", 2, case_notification, False),
    ("valid", 25, case_valid, True),
    ("cancel_stream", 10, case_cancel_stream, False),
    ("cancel_call", 5, case_cancel_call, False),
    ("cancel_unknown_or_broken", 4, case_cancel_unknown, False),
]


def check_next_valid(t):
    rid, resp = t.call("completion", {"prompt": PROMPT, "n_predict": REF_N, "temperature": 0})
    check_completion(expect_result(resp, rid), REF_N, REF["text"])


# ---------------------------------------------------------------------------------------------------

class SoakTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.http = cls.stdio = None
        try:
            cls.http = HttpServer()
            cls.stdio = StdioServer()
            cls.ht, cls.st = HttpT(cls.http), StdioT(cls.stdio)
            deadline = time.time() + 120
            for t in (cls.ht, cls.st):
                while True:
                    _, resp = t.call("health", {})
                    if "result" in resp:
                        break
                    if time.time() > deadline:
                        raise RuntimeError("%s server not ready: %s" % (t.name, short(resp)))
                    time.sleep(0.02)
            _, resp = cls.ht.call("completion", {"prompt": PROMPT, "n_predict": REF_N, "temperature": 0})
            REF["text"] = resp["result"]["content"]
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for s in (cls.http, cls.stdio):
            if s is not None and s.alive():
                s.proc.kill()
                s.finish()

    def run_phase(self, seconds, rng_seed, stats, failures):
        """Four clients (two per transport) run the mix until the time is up."""
        deadline = time.time() + seconds
        names = [c[0] for c in CASES]
        weights = [c[1] for c in CASES]

        def worker(t, wseed):
            rng = random.Random(wseed)
            while time.time() < deadline and len(failures) < 20:
                name = rng.choices(names, weights)[0]
                fn, valid = next((c[2], c[3]) for c in CASES if c[0] == name)
                step = name
                try:
                    fn(t, rng)
                    if not valid:
                        step = name + " -> next valid request"
                        check_next_valid(t)
                    stats[(t.name, name)] = stats.get((t.name, name), 0) + 1
                except CheckFailed as e:
                    failures.append("%s %s: %s" % (t.name, step, e))
                except Exception as e:  # noqa: BLE001 - anything else is a failure too
                    failures.append("%s %s: unexpected %r" % (t.name, step, e))
                if not t.srv.alive():
                    failures.append("%s server died (rc %r) after %s" % (t.name, t.srv.proc.poll(), step))
                    return

        threads = [threading.Thread(target=worker, args=(t, rng_seed * 10 + i), daemon=True)
                   for i, t in enumerate((self.ht, self.ht, self.st, self.st))]
        for th in threads:
            th.start()
        trace = []
        while any(th.is_alive() for th in threads):
            time.sleep(1)
            try:
                trace.append((round(time.time() - deadline + seconds), self.http.rss_kb(), self.stdio.rss_kb()))
            except (OSError, RuntimeError):
                pass
        for th in threads:
            th.join(TIMEOUT)
        return trace

    def test_soak(self):
        t_start = time.time()
        print("\nsoak: seed %d, %.0f s, %s build, pids http %d stdio %d" % (
            SEED, SOAK_SECONDS, "ASan" if ASAN else "plain", self.http.proc.pid, self.stdio.proc.pid), file=sys.stderr)
        stats, failures = {}, []
        warmup = min(10.0, max(3.0, 0.15 * SOAK_SECONDS))
        self.run_phase(warmup, SEED, stats, failures)
        rss0 = {"http": self.http.rss_kb(), "stdio": self.stdio.rss_kb()}
        n_warm = sum(stats.values())
        warm_by_t = {tn: sum(v for (t, _), v in stats.items() if t == tn) for tn in ("http", "stdio")}
        trace = self.run_phase(max(1.0, SOAK_SECONDS - warmup), SEED + 1, stats, failures)
        for t in (self.ht, self.st):  # still alive and well
            try:
                check_next_valid(t)
                rid, resp = t.call("health", {})
                check(expect_result(resp, rid)["status"] == "ok", "health: " + short(resp))
            except CheckFailed as e:
                failures.append("%s final check: %s" % (t.name, e))
        rss1 = {"http": self.http.rss_kb(), "stdio": self.stdio.rss_kb()}
        _, m = self.ht.call("metrics", {})
        cancelled_http = m.get("result", {}).get("requests_cancelled")
        _, m = self.st.call("metrics", {})
        cancelled_stdio = m.get("result", {}).get("requests_cancelled")
        strays = list(self.stdio.strays)
        null_left = []
        while not self.stdio.null.empty():
            null_left.append(self.stdio.null.get())

        n_total = sum(stats.values())
        # Growth of the floor: the lowest RSS of the last fifth of the run against the lowest of the
        # first fifth (the warm-up's end included). A leak raises the floor; a request's transient
        # buffers (an 8 MiB body, ASan's quarantine filling) only raise single samples, and two
        # single samples differed by 58 MB in one ASan run whose floor rose by 20 MB.
        fifth = max(1, len(trace) // 5)
        col = {"http": 1, "stdio": 2}
        growth = {k: (min([rss1[k]] + [t[col[k]] for t in trace[-fifth:]]) -
                      min([rss0[k]] + [t[col[k]] for t in trace[:fifth]])) / 1024.0 for k in rss0}
        bound = RSS_BOUND_MB + (ASAN_QUARANTINE_MB + 16 if ASAN else 0)
        print("soak: %d cases (%d in the warm-up of %.0f s), %d failures; requests cancelled: http %s, stdio %s "
              "(stdio cancellations that came after the end: %d)"
              % (n_total, n_warm, warmup, len(failures), cancelled_http, cancelled_stdio, len(LATE_CANCELS)),
              file=sys.stderr)
        n_soak = {tn: max(1, sum(v for (t, _), v in stats.items() if t == tn) - warm_by_t[tn]) for tn in warm_by_t}
        print("soak: RSS after warm-up http %.1f MB, stdio %.1f MB; growth http %+.2f MB, stdio %+.2f MB (bound %d MB); "
              "%.0f / %.0f bytes per case after the warm-up" % (
                  rss0["http"] / 1024, rss0["stdio"] / 1024, growth["http"], growth["stdio"], bound,
                  growth["http"] * 2 ** 20 / n_soak["http"], growth["stdio"] * 2 ** 20 / n_soak["stdio"]),
              file=sys.stderr)
        if VERBOSE:
            for (tn, name), n in sorted(stats.items()):
                print("  %-6s %-26s %5d" % (tn, name, n), file=sys.stderr)
            print("  RSS trace (s, http kB, stdio kB): %s" % trace, file=sys.stderr)

        # graceful exit: SIGTERM (HTTP), end of input (stdio)
        rc_http = self.http.stop()
        rc_stdio = self.stdio.stop()
        print("soak: exit codes http %r, stdio %r; total %.1f s" % (rc_http, rc_stdio, time.time() - t_start),
              file=sys.stderr)

        self.assertEqual(failures, [], "seed %d" % SEED)
        self.assertEqual(strays, [], "answers nobody asked for (stdio)")
        self.assertEqual(null_left, [], "answers with id null nobody asked for (stdio)")
        if SOAK_SECONDS >= 20:  # long enough for every case to come up on both transports
            for (tn, name) in [(t, c[0]) for t in ("http", "stdio") for c in CASES]:
                self.assertGreater(stats.get((tn, name), 0), 0, "%s %s never ran" % (tn, name))
        self.assertGreater(cancelled_http or 0, 0, "no HTTP request was cancelled by a dropped connection")
        self.assertGreater(cancelled_stdio or 0, 0, "no stdio request was cancelled")
        for k in growth:
            self.assertLess(growth[k], bound, "%s server RSS grew by %.1f MB over %d requests (trace: %s)"
                            % (k, growth[k], n_total - n_warm, trace))
        for name, rc, proc in (("http", rc_http, self.http), ("stdio", rc_stdio, self.stdio)):
            bad = [ln for ln in proc.stderr if BAD_REPORT.search(ln)]
            self.assertEqual(bad, [], "%s server: sanitizer report:\n%s" % (name, proc.text()[-20000:]))
            self.assertEqual(rc, 0, "%s server exit code %r:\n%s" % (name, rc, proc.text()[-20000:]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
