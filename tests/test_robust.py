"""Issue 13 over the real server: inputs that took `specrpc serve` down (a deep grammar, drafts
beyond n_batch or the free KV, a grammar ending inside an accepted run, a FIFO as model, a
too-small -b) and a client naming n-gram cache files. Each gives a clear answer and the server
keeps serving (or, at start-up, exits with an error instead of a signal).

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR, PYTHONPATH=clients/python.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_server import BIN, ENV, MODELS, TARGET, Server, stdio_cmd  # noqa: E402
from specrpc.client import HttpClient, RpcError, StdioClient  # noqa: E402

DRAFT_Q4 = os.path.join(MODELS, "stories260K-Q4_0.gguf")
DEEP = "root ::= " + "(" * 30000 + "\"a\"" + ")" * 30000
GIRL_PROMPT = "Once upon a time, there was a little girl. Once upon a time, there was a little"


def post(srv, path, body):
    status, _, raw = srv.client.request("POST", path, body)
    return status, json.loads(raw)


def greedy(prompt, n, **kw):
    return dict({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True}, **kw)


class DeepGrammarTest(unittest.TestCase):
    def test_http(self):
        srv = Server("-m", TARGET, "-t", "1")
        try:
            srv.wait_ready()
            status, j = post(srv, "/completion", {"prompt": "x", "n_predict": 2, "grammar": DEEP})
            self.assertEqual(status, 400, j)
            self.assertIn("grammar", json.dumps(j))
            status, j = post(srv, "/completion", greedy("x", 2, grammar="root ::= ((\"a\"))+"))
            self.assertEqual(status, 200, j)
            self.assertEqual(j["content"], "aa")
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_stdio(self):
        c = StdioClient(stdio_cmd("-m", TARGET, "-t", "1"), env=ENV, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while True:  # stdio answers "loading" (-32001) until the model is ready
                try:
                    if c.call("health", timeout=60)["status"] == "ok":
                        break
                except RpcError as e:
                    self.assertEqual(e.code, -32001)
                self.assertLess(time.time(), deadline)
                time.sleep(0.01)
            with self.assertRaises(RpcError) as e:
                c.call("completion", {"prompt": "x", "n_predict": 2, "grammar": DEEP}, timeout=60)
            self.assertEqual(e.exception.code, -32602)
            self.assertIn("grammar", e.exception.message + json.dumps(e.exception.data))
            self.assertEqual(c.call("health", timeout=60)["status"], "ok")
        finally:
            c.proc.stdin.close()
            rc = c.proc.wait(30)
            c.proc.stdout.close()
            self.assertEqual(rc, 0)


class VerificationBatchTest(unittest.TestCase):
    def test_wide_tree_in_a_small_context(self):
        srv = Server("-m", TARGET, "-md", DRAFT_Q4, "--tree-max", "16", "-c", "128", "-t", "1")
        try:
            srv.wait_ready()
            spec = {"n_max": 16, "n_parallel": 16, "p_split": 0, "adaptive": False}
            status, j = post(srv, "/completion", greedy("Once upon a time", 60, speculative=spec))
            self.assertEqual(status, 200, j)
            status, plain = post(srv, "/completion", greedy("Once upon a time", 60, speculative={"type": "none"}))
            self.assertEqual(status, 200, plain)
            self.assertEqual(j["content"], plain["content"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_two_slots_in_a_20_token_batch(self):
        srv = Server("-m", TARGET, "-md", DRAFT_Q4, "-np", "2", "-b", "20", "-t", "1")
        try:
            srv.wait_ready()
            spec = {"n_max": 10, "adaptive": False}
            out = {}

            def one(i, prompt):
                out[i] = post(srv, "/completion", greedy(prompt, 80, speculative=spec))

            ts = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(["Once upon a time", "The dog"])]
            [t.start() for t in ts]
            [t.join(120) for t in ts]
            for i, p in enumerate(["Once upon a time", "The dog"]):
                status, j = out[i]
                self.assertEqual(status, 200, j)
                _, plain = post(srv, "/completion", greedy(p, 80, speculative={"type": "none"}))
                self.assertEqual(j["content"], plain["content"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_small_batch_serves_and_stays_lossless(self):
        # -b 8: the prompt goes in passes of 8 tokens, while verification passes (up to 17
        # tokens) still fit the contexts; -b 0 is a start-up error, not a SIGABRT
        srv = Server("-m", TARGET, "-md", DRAFT_Q4, "-b", "8", "-t", "1")
        try:
            srv.wait_ready()
            body = greedy(GIRL_PROMPT, 48)
            status, spec = post(srv, "/completion", dict(body, speculative={"n_max": 16, "adaptive": False}))
            self.assertEqual(status, 200, spec)
            _, plain = post(srv, "/completion", dict(body, speculative={"type": "none"}))
            self.assertEqual(spec["content"], plain["content"])
        finally:
            self.assertEqual(srv.stop(), 0)
        r = subprocess.run([BIN, "serve", "-m", TARGET, "-md", DRAFT_Q4, "-b", "0", "--port", "0"],
                           capture_output=True, text=True, timeout=60, env=ENV)
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        self.assertIn("batch", r.stderr)


class GrammarEndsInsideADraftTest(unittest.TestCase):
    def test_speculative_equals_plain(self):
        srv = Server("-m", TARGET, "-md", DRAFT_Q4, "-t", "1")
        try:
            srv.wait_ready()
            body = greedy(GIRL_PROMPT, 64, grammar="root ::= [a-z ]{1,12}")
            status, spec = post(srv, "/completion", dict(body, speculative={"n_max": 8, "adaptive": False}))
            self.assertEqual(status, 200, spec)
            status, plain = post(srv, "/completion", dict(body, speculative={"type": "none"}))
            self.assertEqual(status, 200, plain)
            self.assertEqual(plain["content"], " girl named ")
            self.assertEqual(spec["content"], plain["content"])
        finally:
            self.assertEqual(srv.stop(), 0)


class ModelFolderTest(unittest.TestCase):
    """--allow-model-load DIR: a FIFO model is refused at once; cache paths are the operator's."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="specrpc-robust-")
        shutil.copy(TARGET, os.path.join(self.dir, "model.gguf"))  # a symlink would lead outside
        self.fifo = os.path.join(self.dir, "fifo.gguf")
        os.mkfifo(self.fifo)

    def tearDown(self):
        for n in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, n))
        os.rmdir(self.dir)

    def test_fifo_and_cache_paths(self):
        srv = Server("-m", TARGET, "-t", "1", "--allow-model-load", self.dir)
        try:
            srv.wait_ready()
            # serve's main thread exits 1 if the start-up model is not READY when it next looks
            # (every 20 ms): let it announce the model before a client unloads it
            deadline = time.time() + 30
            while "loaded:" not in "".join(srv.stderr):
                self.assertLess(time.time(), deadline)
                time.sleep(0.01)
            c = srv.client
            evil = os.path.join(self.dir, "evil.gguf")
            for key in ("lookup_cache_dynamic", "lookup_cache_static"):
                with self.assertRaises(RpcError) as e:
                    c.call("init", {"model": os.path.join(self.dir, "model.gguf"), key: evil, "threads": 1})
                self.assertEqual(e.exception.code, -32602)
                self.assertIn("command line", e.exception.message)
            c.call("deinit")
            self.assertFalse(os.path.exists(evil))

            t0 = time.time()
            with self.assertRaises(RpcError) as e:
                c.call("init", {"model": self.fifo, "threads": 1})
            self.assertIn("not a regular file", e.exception.message)
            self.assertLess(time.time() - t0, 30)
            st = c.call("init", {"model": os.path.join(self.dir, "model.gguf"), "threads": 1})
            self.assertTrue(st["init_success"])
        finally:
            rc = srv.stop()
            if rc is None:  # hung on the FIFO: unblock the reader so the process can go
                try:
                    os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            self.assertEqual(rc, 0)

    def test_fifo_on_the_command_line(self):
        p = subprocess.Popen([BIN, "serve", "-m", self.fifo, "--port", "0"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=ENV)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            self.fail("loading a FIFO hangs")
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"not a regular file", err)


class AmbiguousGrammarTest(unittest.TestCase):
    """250 or 20,000 "a"? in sequence stalled the engine thread (31 s, minutes) for every client."""

    def test_refused_and_served_on(self):
        srv = Server("-m", TARGET, "-t", "1")
        try:
            srv.wait_ready()
            for n in (250, 20000):
                t0 = time.time()
                status, j = post(srv, "/completion", greedy("x", 4, grammar="root ::= " + "\"a\"? " * n))
                self.assertLess(time.time() - t0, 5)  # liveness (the stall was 31 s and more), not speed
                self.assertEqual(status, 400, j)
                self.assertIn("grammar too ambiguous", j["error"]["message"])
                self.assertEqual(j["error"]["rpc_code"], -32602)
            status, j = post(srv, "/completion", greedy("x", 2, grammar="root ::= ((\"a\"))+"))
            self.assertEqual(status, 200, j)
            self.assertEqual(j["content"], "aa")
        finally:
            self.assertEqual(srv.stop(), 0)


class ShutdownDeadlineTest(unittest.TestCase):
    """SIGTERM waited for the engine's current step: one 4,000-token prompt pass of the x100M
    target takes ~75 s on 2 cores. The graceful path now has a 10 s deadline."""

    def test_sigterm_during_a_long_step(self):
        big = os.path.join(MODELS, "stories260K-x100M-Q8_0.gguf")
        srv = Server("-m", big, "-c", "4096", "-b", "4096", "-t", "2", "--drain-timeout", "0")
        try:
            srv.wait_ready()
            body = {"prompt": " ".join(["once upon a time"] * 800), "n_predict": 1}
            threading.Thread(target=lambda: post_quietly(srv, body), daemon=True).start()
            time.sleep(3)  # the prompt pass has started (it runs for over a minute)
            t0 = time.time()
            rc = srv.stop(timeout=60)
            self.assertLess(time.time() - t0, 20)
            self.assertEqual(rc, 1)
            self.assertIn("past its deadline", "".join(srv.stderr))
        finally:
            if srv.proc.poll() is None:
                srv.proc.kill()
                srv.proc.wait()


def post_quietly(srv, body):
    try:
        post(srv, "/completion", body)
    except Exception:  # noqa: BLE001 (the server goes away under it)
        pass


class StartUpRaceTest(unittest.TestCase):
    """init, deinit and a failed init right after start-up made the server exit: the start-up
    load was aborted (or another load's failure read as its own), and the process took it as a
    failed start."""

    def test_client_init_deinit_during_the_start_up_load(self):
        big = os.path.join(MODELS, "stories260K-x100M-Q8_0.gguf")
        srv = Server("-m", big, "-t", "1", "--allow-model-load", MODELS)
        try:
            rpc = lambda m, p=None: srv.client.request("POST", "/rpc", {"jsonrpc": "2.0", "id": 1, "method": m,
                                                                        "params": p or {}})
            rpc("init", {"model": TARGET, "threads": 1})  # may answer "a model is being loaded"
            rpc("deinit")
            status, _, raw = rpc("init", {"model": os.path.join(MODELS, "no-such-model.gguf")})
            self.assertIn("error", json.loads(raw))
            time.sleep(0.5)
            self.assertIsNone(srv.proc.poll(), "".join(srv.stderr))
            status, _, raw = rpc("init", {"model": TARGET, "threads": 1})
            self.assertTrue(json.loads(raw)["result"]["init_success"], raw)
            status, j = post(srv, "/completion", greedy("x", 2))
            self.assertEqual(status, 200, j)
        finally:
            self.assertEqual(srv.stop(), 0)


class StdioCancelWhileLoadingTest(unittest.TestCase):
    """A call held while the model loads (stdio) was not known to the dispatcher yet, so
    $/cancelRequest for it did nothing and it ran once the model was ready."""

    def test_cancel_a_held_call(self):
        big = os.path.join(MODELS, "stories260K-x100M-Q8_0.gguf")
        p = subprocess.Popen(stdio_cmd("-m", big, "-t", "1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=ENV)
        try:
            def send(obj):
                p.stdin.write((json.dumps(obj) + "\n").encode())
                p.stdin.flush()
            send({"jsonrpc": "2.0", "id": 7, "method": "completion", "params": greedy("x", 4)})
            send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 7}})
            send({"jsonrpc": "2.0", "id": 8, "method": "completion", "params": greedy("x", 2)})
            replies = {}
            while len(replies) < 2:
                line = p.stdout.readline()
                self.assertTrue(line, "the server closed its output")
                j = json.loads(line)
                if "id" in j:
                    replies[j["id"]] = j
            self.assertEqual(replies[7].get("error", {}).get("code"), -32800, replies[7])
            # nothing ran, and data still says so in the field every -32800 carries
            self.assertEqual(replies[7]["error"].get("data"), {"cancelled": True}, replies[7])
            self.assertIn("result", replies[8], replies[8])  # the other call ran once the model was ready
        finally:
            p.stdin.close()
            rc = p.wait(60)
            p.stdout.close()
            self.assertEqual(rc, 0)


class TinyContextTest(unittest.TestCase):
    """`-c 1` and a JSON init with ctx_size 1 were accepted: no prompt fits (BOS is a token), and
    a request with truncate: true then took the server down."""

    def test_serve_refuses_it(self):
        for args in (["-c", "1"], ["-c", "16", "-np", "4"]):
            r = subprocess.run([BIN, "serve", "-m", TARGET, "--port", "0", *args], capture_output=True, text=True,
                               timeout=60, env=ENV)
            self.assertEqual(r.returncode, 1, r.stderr[-2000:])
            self.assertIn("ctx_size", r.stderr)
            self.assertIn("at least 8", r.stderr)

    def test_json_init_refuses_it(self):
        c = StdioClient(stdio_cmd(), env=ENV, stderr=subprocess.DEVNULL)
        try:
            with self.assertRaises(RpcError) as e:
                c.call("init", {"model": TARGET, "ctx_size": 1, "threads": 1}, timeout=60)
            self.assertEqual(e.exception.code, -32602)
            self.assertIn("ctx_size", e.exception.message + json.dumps(e.exception.data))
            st = c.call("init", {"model": TARGET, "ctx_size": 8, "threads": 1}, timeout=60)
            self.assertTrue(st["init_success"])
            out = c.call("completion", greedy("Once upon a time there was a girl", 4, truncate=True), timeout=60)
            self.assertTrue(out["truncated"])
        finally:
            c.proc.stdin.close()
            rc = c.proc.wait(30)
            c.proc.stdout.close()
            self.assertEqual(rc, 0)


if __name__ == "__main__":
    unittest.main()
