"""Replicas behind a real load balancer: `specrpc serve` draining on SIGTERM, and two replicas behind
HAProxy running deploy/haproxy.cfg (docs/replicas.md) on loopback: prompt-prefix affinity, and a
replica's restart (SIGTERM, drain, start again) under a stream of requests loses none of them.

Skipped when haproxy is not installed (Debian package `haproxy`, in scripts/setup.sh).
Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("SPECRPC_BIN", os.path.join(HERE, "..", "build", "specrpc"))
MODELS = os.environ.get("SPECRPC_MODELS_DIR", os.path.join(HERE, "..", "..", "shared", "models"))
MODEL = os.path.join(MODELS, "stories260K-F32.gguf")
HAPROXY_CFG = os.path.join(HERE, "..", "deploy", "haproxy.cfg")
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
ENV = dict(os.environ, SPECRPC_LOG=os.environ.get("SPECRPC_LOG", "warn"))
LONG = 1000  # tokens of the request that is running when its replica gets SIGTERM


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=300):
    """(status, headers dict with lower-case names, body bytes); status 0 when the connection failed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except OSError:
        return 0, {}, b""
    finally:
        conn.close()


class Replica:
    def __init__(self, port):
        self.port = port
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "-c", "2048", "--parallel", "2",
                                      "-t", "1", "--drain-timeout", "300"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log, env=ENV)
        deadline = time.time() + 120
        while request(port, "GET", "/health", timeout=5)[0] != 200:
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("replica on port %d did not start: %s" % (port, self.stderr()))
            time.sleep(0.1)

    def stderr(self):
        if self.log.closed:
            return ""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


class Stream:
    """A streamed /completion on a thread: `first` is set on its first event, `result` holds
    (status, number of content events, last event) at its end."""

    def __init__(self, port, prompt, n_predict):
        self.first = threading.Event()
        self.done = threading.Event()
        self.result = None
        self.served_by = None
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True, "stream": True}
        threading.Thread(target=self._run, args=(port, body), daemon=True).start()

    def _run(self, port, body):
        n, last, status = 0, None, 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            status, self.served_by = r.status, r.getheader("X-Served-By")
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    n += 1
                    self.first.set()
        except (OSError, ValueError) as e:
            last = {"exception": repr(e)}
        finally:
            conn.close()
            self.result = (status, n, last)
            self.first.set()
            self.done.set()

    def check_complete(self, test, n_predict):
        test.assertTrue(self.done.wait(600), "the running request never ended")
        status, n, last = self.result
        test.assertEqual(status, 200, self.result)
        test.assertTrue(last and last.get("stop") is True, "stream cut short: %r" % (self.result,))
        test.assertEqual(last.get("stop_type"), "limit", last)
        test.assertEqual(last.get("tokens_predicted"), n_predict, last)


@unittest.skipUnless(os.path.exists(MODEL), "no model at " + MODEL)
class DrainTest(unittest.TestCase):
    """One replica, no balancer: what SIGTERM does."""

    def test_sigterm_drains(self):
        port = free_port()
        r = Replica(port)
        try:
            s = Stream(port, "Once upon a time", LONG)
            self.assertTrue(s.first.wait(120))
            self.assertIsNone(s.result, "the request ended before SIGTERM: %r" % (s.result,))
            r.proc.send_signal(signal.SIGTERM)
            # While it runs, the replica is out of service: /health and new requests get 503.
            deadline = time.time() + 10
            while True:
                status, headers, body = request(port, "GET", "/health", timeout=10)
                if status == 503 or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(status, 503, body)
            self.assertIn("retry-after", headers)
            self.assertEqual(json.loads(body)["error"]["type"], "unavailable_error")
            if not s.done.is_set():
                status, headers, body = request(port, "POST", "/completion", {"prompt": "Hi", "n_predict": 2})
                self.assertEqual(status, 503, body)
                self.assertIn("draining", json.loads(body)["error"]["message"])
                self.assertEqual(headers.get("connection"), "close")
                status, _, body = request(port, "POST", "/rpc", {"jsonrpc": "2.0", "id": 1, "method": "health"})
                self.assertEqual(status, 503, body)
            s.check_complete(self, LONG)
            self.assertEqual(r.proc.wait(60), 0, r.stderr())
        finally:
            r.stop()


@unittest.skipUnless(HAPROXY, "haproxy is not installed (apt-get install haproxy)")
@unittest.skipUnless(os.path.exists(MODEL), "no model at " + MODEL)
class ReplicasTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ports = [free_port(), free_port()]
        cls.lb = free_port()
        cls.replicas = [Replica(p) for p in cls.ports]
        with open(HAPROXY_CFG) as f:
            cfg = f.read()
        # The documented file, with this test's ports.
        cfg = cfg.replace("bind 127.0.0.1:8080", "bind 127.0.0.1:%d" % cls.lb)
        cfg = cfg.replace("127.0.0.1:8081", "127.0.0.1:%d" % cls.ports[0])
        cfg = cfg.replace("127.0.0.1:8082", "127.0.0.1:%d" % cls.ports[1])
        assert len(re.findall(r"127\.0\.0\.1:808\d", cfg)) == 0, cfg
        cls.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(cls.tmp.name, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(cfg)
        cls.haproxy = subprocess.Popen([HAPROXY, "-db", "-f", path], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while request(cls.lb, "GET", "/health", timeout=5)[0] != 200:
            if cls.haproxy.poll() is not None or time.time() > deadline:
                cls.tearDownClass()
                raise RuntimeError("haproxy did not start")
            time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        if cls.haproxy.poll() is None:
            cls.haproxy.terminate()
        cls.haproxy.wait()
        for r in cls.replicas:
            r.stop()
        cls.tmp.cleanup()

    def served_by(self, prompt):
        status, headers, body = request(self.lb, "POST", "/completion", {"prompt": prompt, "n_predict": 2})
        self.assertEqual(status, 200, body)
        return headers.get("x-served-by")

    def prompts_by_replica(self):
        """Prompts whose affinity sends them to r1 and to r2 (each checked twice)."""
        by = {}
        for i in range(24):
            p = "Once upon a time, story %d: " % i
            a, b = self.served_by(p), self.served_by(p)
            self.assertEqual(a, b, "prompt %r went to %s then %s" % (p, a, b))
            by.setdefault(a, []).append(p)
            if len(by) == 2 and min(len(v) for v in by.values()) >= 2:
                break
        return by

    def test_1_affinity(self):
        by = self.prompts_by_replica()
        self.assertEqual(sorted(by), ["r1", "r2"], by)
        # The key is the prompt's prefix: a longer prompt that starts the same goes to the same replica.
        for name, prompts in by.items():
            p = prompts[0] + "x" * 300
            self.assertEqual(self.served_by(p), self.served_by(p + " and then more"))

    def test_2_restart_loses_nothing(self):
        by = self.prompts_by_replica()
        # A request running on r1 when r1 gets SIGTERM.
        long = Stream(self.lb, by["r1"][0], LONG)
        self.assertTrue(long.first.wait(120))
        self.assertEqual(long.served_by, "r1")
        self.assertIsNone(long.result, "the request ended before SIGTERM: %r" % (long.result,))
        # Clients keep sending meanwhile, half of them with prompts bound to r1.
        stop = threading.Event()
        results = []
        lock = threading.Lock()

        def client(k):
            i = 0
            while not stop.is_set():
                prompt = by["r1" if i % 2 == 0 else "r2"][0] + " %d-%d" % (k, i)
                status, headers, body = request(self.lb, "POST", "/completion", {"prompt": prompt, "n_predict": 4})
                with lock:
                    results.append((status, headers.get("x-served-by"), body[:200]))
                i += 1

        clients = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in clients:
            t.start()
        try:
            time.sleep(0.5)
            old = self.replicas[0]
            old.proc.send_signal(signal.SIGTERM)
            long.check_complete(self, LONG)  # the running request finished on the draining replica
            self.assertEqual(old.proc.wait(60), 0, old.stderr())
            n_down = len(results)
            self.replicas[0] = Replica(self.ports[0])  # the same address: back in after `rise` checks
            deadline = time.time() + 60
            while self.served_by(by["r1"][0]) != "r1":
                self.assertLess(time.time(), deadline, "r1 never came back into service")
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            stop.set()
            for t in clients:
                t.join(600)
        lost = [r for r in results if r[0] != 200]
        self.assertEqual(lost, [], "%d of %d requests failed" % (len(lost), len(results)))
        self.assertGreater(n_down, 0)
        served = {r[1] for r in results}
        self.assertEqual(served, {"r1", "r2"}, served)


if __name__ == "__main__":
    unittest.main(verbosity=2)
