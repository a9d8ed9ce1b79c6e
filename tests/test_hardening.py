"""What a client sends must not take `specrpc serve` down or starve other clients (issue 13,
availability and memory): slow and half-closing clients, header floods, compressed bodies,
amplifying batches, huge tokenize calls, Host headers (DNS rebinding), thread exhaustion, stdio
message classification and calls sent while the model loads; and a bounded load test.

The real binary over real sockets / pipes, the real models. Times asserted here are generous
bounds on a shared machine (a request that waits for a busy thread takes seconds or forever);
the load test reports the /health latencies it saw.

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR, PYTHONPATH=clients/python.
"""

import gzip
import http.client
import json
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))

from test_capi import MODELS, TARGET, is_asan_build  # noqa: E402
from test_server import BIN, ENV, KEY, Server  # noqa: E402
from test_soak import rss_kb  # noqa: E402

SLOW_TARGET = os.path.join(MODELS, "stories260K-x100M-Q8_0.gguf")  # long generations


def hwm_kb(pid):
    """Peak resident memory of a process (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def raw_request(port, data, half_close=False, timeout=20.0):
    """Sends raw bytes; returns everything the server answers until it closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                b = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            out += b
            if not half_close and b"\r\n\r\n" in out:
                head, _, body = out.partition(b"\r\n\r\n")
                n = [int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")]
                if n and len(body) >= n[0]:
                    break
        return out
    finally:
        s.close()


def status_of(answer):
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


def timed_health(port, timeout=10.0):
    """Seconds a fresh GET /health takes (timeout if it gets no answer)."""
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        c.close()
    except (OSError, http.client.HTTPException):
        return timeout
    return time.time() - t0


def post(port, path, body, headers=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.request("POST", path, body=data, headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


class SlowClient(threading.Thread):
    """Sends a request head one byte every `interval` s, reconnecting when the server closes."""

    def __init__(self, port, interval, stop):
        super().__init__(daemon=True)
        self.port, self.interval, self.stop_ev = port, interval, stop
        self.closed_by_server = 0

    def run(self):
        head = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-Slow: " + b"a" * 4000
        while not self.stop_ev.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                time.sleep(0.1)
                continue
            try:
                for i in range(len(head)):
                    if self.stop_ev.wait(self.interval):
                        break
                    s.sendall(head[i:i + 1])
            except OSError:
                self.closed_by_server += 1
            finally:
                s.close()


class HttpHardeningTest(unittest.TestCase):
    """One small server; the tests that need other flags start their own."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-m", TARGET, "-c", "2048", "-np", "2", "-t", "1")
        cls.srv.wait_ready()
        cls.port = cls.srv.port

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_slow_header_clients_do_not_block_health(self):
        """Item 6: clients sending a head a byte at a time held every connection thread (8 by
        default) and /health timed out while they kept sending."""
        stop = threading.Event()
        slow = [SlowClient(self.port, 0.2, stop) for _ in range(16)]
        for s in slow:
            s.start()
        try:
            time.sleep(1.0)
            worst = max(timed_health(self.port, timeout=5) for _ in range(10))
        finally:
            stop.set()
            for s in slow:
                s.join(5)
        self.assertLess(worst, 2.0, "/health waited behind slow clients")

    def test_half_closed_clients_get_an_answer(self):
        """Item 17: a client that shuts down its sending side after the request got nothing."""
        ans = raw_request(self.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", half_close=True)
        self.assertEqual(status_of(ans), 200, ans[:200])
        body = json.dumps({"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}).encode()
        ans = raw_request(self.port, b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                          b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), half_close=True)
        self.assertEqual(status_of(ans), 200, ans[:200])
        self.assertEqual(json.loads(ans.partition(b"\r\n\r\n")[2])["tokens_predicted"], 8)
        body = b'{"jsonrpc":"2.0","id":1,"method":"health"}'
        ans = raw_request(self.port, b"POST /rpc HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body), half_close=True)
        self.assertEqual(status_of(ans), 200, ans[:200])

    def test_header_count_and_size_are_limited(self):
        """Item 8: 3 million header lines were answered 200 (340 MB left allocated)."""
        before = rss_kb(self.srv.proc.pid)
        flood = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n"
        ans = raw_request(self.port, flood)
        self.assertEqual(status_of(ans), 431, ans[:200])
        big = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n"
        self.assertEqual(status_of(raw_request(self.port, big)), 431)
        ok = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-A: b\r\n" * 50 + b"\r\n"
        self.assertEqual(status_of(raw_request(self.port, ok)), 200)
        self.assertLess(rss_kb(self.srv.proc.pid) - before, 16 << 10)

    def test_host_header_is_checked(self):
        """Item 16: without an API key a page rebinding its DNS name to 127.0.0.1 could read
        /props (model paths), /slots and /metrics."""
        def get(host):
            ans = raw_request(self.port, b"GET /props HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            return status_of(ans)
        self.assertEqual(get(b"attacker.example"), 403)
        self.assertEqual(get(b"attacker.example:%d" % self.port), 403)
        for ok in (b"localhost", b"localhost:%d" % self.port, b"127.0.0.1:%d" % self.port, b"[::1]:%d" % self.port,
                   b"LOCALHOST"):
            self.assertEqual(get(ok), 200, ok)
        ans = raw_request(self.port, b"GET /metrics HTTP/1.1\r\nHost: attacker.example\r\n\r\n")
        self.assertEqual(status_of(ans), 403)

    def test_batch_answers_are_bounded(self):
        """Item 10: a 1.83 MB batch of props calls produced a 236 MB answer."""
        batch = [{"jsonrpc": "2.0", "id": i, "method": "props"} for i in range(5000)]
        status, _, body = post(self.port, "/rpc", batch)
        self.assertLess(len(body), 1 << 20)
        j = json.loads(body)
        self.assertIsInstance(j, dict)
        self.assertEqual(j["error"]["code"], -32600)
        self.assertIn("batch", j["error"]["message"])
        small = [{"jsonrpc": "2.0", "id": i, "method": "health"} for i in range(3)]
        status, _, body = post(self.port, "/rpc", small)
        self.assertEqual([m["id"] for m in json.loads(body)], [0, 1, 2])

    def test_tokenize_with_pieces_is_bounded(self):
        """Item 11: with_pieces on 8 MiB of text peaked at 2.75 GB (a JSON object per token)."""
        text = "Once upon a time. " * ((2 << 20) // 18)
        pid = self.srv.proc.pid
        before = hwm_kb(pid)
        status, _, body = post(self.port, "/tokenize", {"content": text, "with_pieces": True})
        self.assertEqual(status, 400, body[:300])
        self.assertEqual(json.loads(body)["error"]["param"], "with_pieces")
        if not is_asan_build(BIN):
            self.assertLess(hwm_kb(pid) - before, 200 << 10, "peak memory of a rejected with_pieces call")
        status, _, body = post(self.port, "/tokenize", {"content": "Once upon a time", "with_pieces": True})
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["tokens"][0]["piece"].strip(), "Once")


class QueueTest(unittest.TestCase):
    def test_large_tokenize_counts_against_the_queue(self):
        """Item 11: large tokenize calls ran on the HTTP threads outside the queue, any number at
        once. With one slot and a queue of one, a third concurrent one is told to retry."""
        # Debug log: a connection closed without an answer (seen once under ASan, not
        # reproduced since) shows in the failure message with the server's http and error lines
        # (a sanitizer report among them) and whether the server was still running.
        srv = Server("-m", TARGET, "-c", "256", "-np", "1", "-t", "1", "--queue-max", "1",
                     env={"SPECRPC_LOG": "debug"})
        try:
            srv.wait_ready()
            text = "Once upon a time. " * ((4 << 20) // 18)
            results, failures = [], []
            lock = threading.Lock()
            t0 = time.time()

            def one():
                try:
                    st, hd, _ = post(srv.port, "/tokenize", {"content": text})
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        failures.append("%.1f s: %r" % (time.time() - t0, e))
                    return
                with lock:
                    results.append((st, hd.get("retry-after")))

            ts = [threading.Thread(target=one) for _ in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(300)
            statuses = sorted(st for st, _ in results)
            if failures:
                log = [l for l in srv.stderr if "http" in l or "error" in l.lower()]
                self.fail("no answer: %s (answers %s, server exit code %s)\nserver log:\n%s"
                          % (failures, statuses, srv.proc.poll(), "".join(log[-60:])))
            self.assertEqual(len(statuses), 6)
            self.assertIn(503, statuses, statuses)
            self.assertIn(200, statuses, statuses)
            self.assertTrue(all(ra for st, ra in results if st == 503))
        finally:
            srv.stop()

    def test_generations_do_not_hold_connection_threads(self):
        """Item 6: long generations each held one of 8 connection threads, so ten of them on two
        slots blocked every other client and --queue-max (64) never filled: nobody got a 503.
        Now the queue fills (503 with Retry-After beyond it) and /health keeps answering."""
        srv = Server("-m", SLOW_TARGET, "-c", "16384", "-np", "2", "-t", "1", "--queue-max", "8")
        socks = []
        try:
            srv.wait_ready()
            body = json.dumps({"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True}).encode()
            req = (b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            for _ in range(16):  # 2 slots + 8 (or 9: the engine admits one more) queued + the rest over
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                s.sendall(req)
                socks.append(s)
            answers = {}
            deadline = time.time() + 20
            while len(answers) < 4 and time.time() < deadline:
                r, _, _ = select.select([s for s in socks if s not in answers], [], [], 0.5)
                for s in r:
                    answers[s] = s.recv(65536)
            self.assertGreaterEqual(len(answers), 4, "the requests beyond the queue were not answered")
            for a in answers.values():
                self.assertEqual(status_of(a), 503, a[:200])
                self.assertIn(b"retry-after:", a.lower())
            worst = max(timed_health(srv.port, timeout=5) for _ in range(5))
            self.assertLess(worst, 2.0)
        finally:
            for s in socks:
                s.close()
            srv.stop()


class DeadlineTest(unittest.TestCase):
    def test_slow_heads_and_bodies_are_cut_off(self):
        """Item 6: only a per-read timeout applied, so a client sending a byte now and then kept
        its connection thread forever. The head must arrive within 10 s, the body within
        min(--timeout, 10) s plus 1 s per 32 KiB."""
        srv = Server("-m", TARGET, "-c", "256", "-np", "1", "-t", "1", "--timeout", "1")
        try:
            srv.wait_ready()
            results = {}

            def drip(name, first, rest, interval, limit):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=limit)
                t0 = time.time()
                answer = b""
                try:
                    s.sendall(first)
                    for i in range(len(rest)):
                        if time.time() - t0 > limit:
                            break
                        r, _, _ = select.select([s], [], [], interval)
                        if r:
                            answer = s.recv(65536)
                            break
                        s.sendall(rest[i:i + 1])
                except OSError:
                    pass
                results[name] = (time.time() - t0, answer)
                s.close()

            body = b'{"content": "' + b"a" * 100 + b'"}'
            head = b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body)
            ts = [threading.Thread(target=drip, args=("head", b"G", b"ET /health HTTP/1.1\r\nX-A: " + b"a" * 100, 0.3, 20)),
                  threading.Thread(target=drip, args=("body", head, body, 0.3, 20))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
            took, answer = results["head"]
            self.assertLess(took, 14, "a head sent a byte at a time was not cut off")
            self.assertEqual(status_of(answer), 408, answer[:200])
            took, _ = results["body"]
            self.assertLess(took, 6, "a body sent a byte at a time was not cut off")
        finally:
            srv.stop()


class PoolTest(unittest.TestCase):
    def test_every_thread_busy_answers_503_with_retry_after(self):
        """Item 6: overload answers 503 with Retry-After, also when the connection threads (not
        the queue) run out; before, the request waited unanswered in the accept queue."""
        srv = Server("-m", SLOW_TARGET, "-c", "4096", "-np", "1", "-t", "1", "--threads-http", "1",
                     "--threads-http-max", "2")
        socks = []
        try:
            srv.wait_ready()
            # the thread that answered /health goes back to the pool first: "listening" now comes
            # after loading, so the /health poll is directly followed by these requests
            time.sleep(0.5)
            body = json.dumps({"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True}).encode()
            req = (b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            for _ in range(2):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                s.sendall(req)
                socks.append(s)
            time.sleep(1.0)
            ans = raw_request(srv.port, req, timeout=10)
            self.assertEqual(status_of(ans), 503, ans[:200])
            self.assertIn(b"retry-after: 1", ans.lower())
        finally:
            for s in socks:
                s.close()
            srv.stop()


class CompressedBodyTest(unittest.TestCase):
    """Item 7: a gzip body was inflated before the size limit and before the API key check: 1 MB
    of gzip took the server from 19 MB to 1,043 MB before its 401."""

    def test_no_inflation_before_the_key_and_past_the_limit(self):
        srv = Server("-m", TARGET, "-c", "256", "-np", "1", "-t", "1", api_key=KEY)
        try:
            srv.wait_ready()
            pid = srv.proc.pid
            bomb = gzip.compress(b" " * (256 << 20), 9)  # 256 MiB of spaces, ~250 KB
            before = hwm_kb(pid)
            status, _, _ = post(srv.port, "/completion", bomb, {"Content-Encoding": "gzip"})
            self.assertEqual(status, 401)
            status, _, body = post(srv.port, "/completion", bomb,
                                   {"Content-Encoding": "gzip", "Authorization": "Bearer " + KEY})
            self.assertEqual(status, 413, body[:200])
            if not is_asan_build(BIN):
                self.assertLess(hwm_kb(pid) - before, 64 << 10, "memory grew while inflating")
            good = gzip.compress(json.dumps({"prompt": "Once", "n_predict": 3}).encode())
            status, _, body = post(srv.port, "/completion", good,
                                   {"Content-Encoding": "gzip", "Authorization": "Bearer " + KEY})
            self.assertEqual(status, 200, body[:200])
            self.assertEqual(json.loads(body)["tokens_predicted"], 3)
            status, _, _ = post(srv.port, "/completion", b"not gzip",
                                {"Content-Encoding": "gzip", "Authorization": "Bearer " + KEY})
            self.assertEqual(status, 400)
        finally:
            srv.stop()


class StdioHardeningTest(unittest.TestCase):
    def spawn(self, model):
        return subprocess.Popen([BIN, "serve", "--stdio", "-m", model, "-c", "4096", "-np", "1", "-t", "1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)

    @staticmethod
    def send(p, obj):
        p.stdin.write((json.dumps(obj) + "\n").encode())
        p.stdin.flush()

    @staticmethod
    def read_until(p, want_ids, timeout=120):
        got = {}
        order = []
        deadline = time.time() + timeout
        while set(want_ids) - set(got) and time.time() < deadline:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if not r:
                continue
            line = p.stdout.readline()
            if not line:
                break
            m = json.loads(line)
            if "id" in m:
                got[m["id"]] = m
                order.append(m["id"])
        return got, order

    def test_calls_sent_while_loading_wait_for_the_model(self):
        """Item 19: a stdio client writes as soon as it spawned the server; its calls were
        answered -32001 loading."""
        p = self.spawn(SLOW_TARGET)
        try:
            self.send(p, {"jsonrpc": "2.0", "id": 1, "method": "completion",
                          "params": {"prompt": "Once", "n_predict": 3}})
            self.send(p, {"jsonrpc": "2.0", "id": 2, "method": "tokenize", "params": {"content": "Once"}})
            got, _ = self.read_until(p, [1, 2])
            self.assertIn("result", got[1], got[1])
            self.assertEqual(got[1]["result"]["tokens_predicted"], 3)
            self.assertIn("result", got[2], got[2])
        finally:
            p.stdin.close()
            p.wait(60)

    def test_cancel_text_in_a_call_does_not_run_it_on_the_reader(self):
        """Item 12: a message containing the text `$/cancelRequest` ran on the input-reading
        thread: health waited for the whole completion and no real cancel was read in time."""
        p = self.spawn(SLOW_TARGET)
        try:
            self.send(p, {"jsonrpc": "2.0", "id": 0, "method": "tokenize", "params": {"content": "x"}})
            self.read_until(p, [0])  # loaded
            self.send(p, {"jsonrpc": "2.0", "id": 1, "method": "completion",
                          "params": {"prompt": "say $/cancelRequest", "n_predict": 3000, "ignore_eos": True}})
            time.sleep(0.3)
            # health first, the cancel only once health answered: sent together, the cancelled
            # completion's answer could overtake health's on a loaded machine (a ctest -j2 flake)
            self.send(p, {"jsonrpc": "2.0", "id": 2, "method": "health"})
            got, order = self.read_until(p, [2])
            self.assertEqual(order[0], 2, "health answered after the completion")
            self.send(p, {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1}})
            got, _ = self.read_until(p, [1])
            self.assertEqual(got[1]["error"]["code"], -32800, "the cancel was not read in time")
            self.assertLess(got[1]["error"]["data"]["tokens_predicted"], 3000)
        finally:
            p.stdin.close()
            p.wait(60)


class LoadTest(unittest.TestCase):
    """Slow clients, long generations (streamed and not) cancelled at random by hanging up,
    short calls and batches, for a bounded time, while /health is probed every 50 ms: its
    latency stays low and the server's memory stays flat."""

    DURATION = float(os.environ.get("SPECRPC_LOAD_SECONDS", "40"))

    def test_load(self):
        srv = Server("-m", SLOW_TARGET, "-c", "8192", "-np", "2", "-t", "1", "--queue-max", "16")
        srv.wait_ready()
        port, pid = srv.port, srv.proc.pid
        stop = threading.Event()
        rng = random.Random(13)
        counts = {"gen": 0, "cancelled": 0, "short": 0, "503": 0, "errors": 0}
        lock = threading.Lock()

        def bump(k):
            with lock:
                counts[k] += 1

        def generator(seed):
            r = random.Random(seed)
            while not stop.is_set():
                stream = r.random() < 0.5
                body = json.dumps({"prompt": "Once upon a time", "n_predict": r.randint(50, 2000),
                                   "ignore_eos": True, "stream": stream}).encode()
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=30)
                    s.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    give_up = time.time() + r.uniform(0.2, 4.0)
                    data = b""
                    while time.time() < give_up and not stop.is_set():
                        rr, _, _ = select.select([s], [], [], 0.1)
                        if rr:
                            b = s.recv(65536)
                            if not b:
                                break
                            data += b
                    if status_of(data) == 503:
                        bump("503")
                    elif time.time() >= give_up:
                        bump("cancelled")
                    bump("gen")
                    s.close()
                except OSError:
                    bump("errors")

        def shorty(seed):
            r = random.Random(seed)
            while not stop.is_set():
                try:
                    if r.random() < 0.5:
                        st, _, _ = post(port, "/tokenize", {"content": "Once upon a time " * r.randint(1, 500)}, timeout=30)
                    else:
                        st, _, _ = post(port, "/rpc", [{"jsonrpc": "2.0", "id": i, "method": "props"} for i in range(20)],
                                        timeout=30)
                    bump("short" if st in (200, 503) else "errors")
                except OSError:
                    bump("errors")

        latencies = []

        def prober():
            while not stop.is_set():
                latencies.append(timed_health(port, timeout=10))
                stop.wait(0.05)

        threads = [SlowClient(port, 0.3, stop) for _ in range(24)]
        threads += [threading.Thread(target=generator, args=(i,), daemon=True) for i in range(12)]
        threads += [threading.Thread(target=shorty, args=(100 + i,), daemon=True) for i in range(3)]
        try:
            for t in threads:
                t.start()
            time.sleep(min(8.0, self.DURATION / 4))  # warm-up: threads, arenas, caches
            rss0 = rss_kb(pid)
            time.sleep(1.0)
            latencies.clear()
            pt = threading.Thread(target=prober, daemon=True)
            pt.start()
            time.sleep(self.DURATION)
            rss1 = rss_kb(pid)
            stop.set()
            pt.join(15)
            for t in threads:
                t.join(15)
            lat = sorted(latencies)
            p50, p95, worst = lat[len(lat) // 2], lat[int(len(lat) * 0.95)], lat[-1]
            sys.stderr.write("\nload: %d health probes: p50 %.1f ms, p95 %.1f ms, max %.1f ms; RSS %d -> %d MB; %r\n"
                             % (len(lat), p50 * 1e3, p95 * 1e3, worst * 1e3, rss0 >> 10, rss1 >> 10, counts))
            self.assertIsNone(srv.proc.poll(), "the server died")
            self.assertGreater(counts["gen"], 20)
            self.assertGreater(counts["cancelled"], 5)
            # the sanitizer build runs every thread several times slower
            self.assertLess(p95, 0.5 if is_asan_build(BIN) else 0.1, "/health p95 above 100 ms")
            self.assertLess(worst, 2.0, "/health stalled")
            if not is_asan_build(BIN):
                self.assertLess(rss1 - rss0, 32 << 10, "memory grew under load")
            self.assertLess(timed_health(port), 2.0)
        finally:
            stop.set()
            srv.stop()


if __name__ == "__main__":
    unittest.main()
