"""`specrpc serve` as llama-server's drop-in at the edges: the router role (no -m), CORS
(--cors-origins, the "localhost" entry, preflights), --tools (accepted, not provided), several
--host addresses, Vertex AI's /predict (AIP_MODE=PREDICTION) and /metrics' batching gauge. The
real binary over real sockets; only the /predict and /metrics tests load a model.

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR.
"""

import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_capi import TARGET  # noqa: E402
from test_server import Server  # noqa: E402



class Serve(Server):
    """`specrpc serve ARGS` (test_server.Server: the port is read from the "listening on" line),
    answered over plain http.client, so a test can pick the address and send any header."""

    def request(self, method, path, body=None, headers=None, host="127.0.0.1"):
        conn = http.client.HTTPConnection(host, self.port, timeout=60)
        try:
            data = None if body is None else json.dumps(body)
            h = dict(headers or {})
            if data is not None:
                h.setdefault("Content-Type", "application/json")
            conn.request(method, path, data, h)
            r = conn.getresponse()
            raw = r.read().decode()
            try:
                j = json.loads(raw) if raw else None
            except ValueError:
                j = raw
            return r.status, {k.lower(): v for k, v in r.getheaders()}, j
        finally:
            conn.close()

    def preflight(self, origin, path="/completions"):
        return self.request("OPTIONS", path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "Authorization, Content-Type"})


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# llama-server's test suite starts its router preset with these (tools/server/tests/utils.py).
ROUTER_FLAGS = ["--offline", "--temp", "0.8", "--seed", "42", "-b", "16", "-c", "1024", "-np", "1", "-n", "16",
                "--no-slots", "--no-jinja"]


class RouterTest(unittest.TestCase):
    """Without -m: llama-server's router answers, and no model is served."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        os.symlink(TARGET, os.path.join(cls.dir, "tiny.gguf"))
        os.symlink(TARGET, os.path.join(cls.dir, "mmproj-tiny.gguf"))  # a companion file, not a model
        os.makedirs(os.path.join(cls.dir, "split"))
        os.symlink(TARGET, os.path.join(cls.dir, "split", "model-00001-of-00002.gguf"))
        with open(os.path.join(cls.dir, "notes.txt"), "w") as f:
            f.write("not a model")
        cls.srv = Serve(*ROUTER_FLAGS, "--models-max", "2", "--no-models-autoload", "--models-dir", cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.dir)

    def test_health_and_props(self):
        status, _, j = self.srv.request("GET", "/health")
        self.assertEqual((status, j["status"]), (200, "ok"))
        status, _, j = self.srv.request("GET", "/props")
        self.assertEqual(status, 200)
        self.assertEqual(j["role"], "router")
        self.assertEqual(j["max_instances"], 2)
        self.assertIs(j["models_autoload"], False)
        self.assertTrue(j["build_info"].startswith("b"), j["build_info"])

    def test_models_lists_the_models_dir(self):
        for path in ("/v1/models", "/models"):
            status, _, j = self.srv.request("GET", path)
            self.assertEqual(status, 200)
            self.assertEqual([m["id"] for m in j["data"]], ["split", "tiny"])
            self.assertEqual({m["status"]["value"] for m in j["data"]}, {"unloaded"})
            self.assertTrue(j["data"][0]["path"].endswith("model-00001-of-00002.gguf"))

    def test_requests_name_a_model(self):
        chat = {"max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
        cases = [({}, "model name is missing from the request"),
                 ({"model": "non-existent/model"}, "model 'non-existent/model' not found"),
                 ({"model": "tiny"}, "model is not loaded")]  # --no-models-autoload
        for extra, message in cases:
            for stream in (False, True):  # a stream that cannot start is a plain HTTP error
                status, _, j = self.srv.request("POST", "/v1/chat/completions", dict(chat, stream=stream, **extra))
                self.assertEqual(status, 400, j)
                self.assertEqual(j["error"]["message"], message)
                self.assertEqual(j["error"]["type"], "invalid_request_error")
        status, _, j = self.srv.request("POST", "/completion", {"prompt": "x", "model": "nope"})
        self.assertEqual(status, 400)
        status, _, j = self.srv.request("POST", "/rpc", {"jsonrpc": "2.0", "id": 1, "method": "tokenize",
                                                         "params": {"content": "a"}})
        self.assertEqual(j["error"]["code"], -32602)
        self.assertEqual(self.srv.request("GET", "/health")[0], 200)  # still serving

    def test_listed_model_with_autoload_is_not_routed(self):
        srv = Serve(*ROUTER_FLAGS, "--models-dir", self.dir)
        try:
            status, _, j = srv.request("GET", "/props")
            self.assertEqual((j["max_instances"], j["models_autoload"]), (4, True))  # llama-server's defaults
            status, _, j = srv.request("POST", "/v1/chat/completions",
                                       {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
            self.assertEqual(status, 501, j)
            self.assertIn("does not route between models", j["error"]["message"])
            self.assertIn("specrpc serve -m " + os.path.join(self.dir, "tiny.gguf"), j["error"]["message"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_no_models_dir_lists_none(self):
        srv = Serve("--offline")
        try:
            status, _, j = srv.request("GET", "/v1/models")
            self.assertEqual((status, j["data"]), (200, []))
            self.assertEqual(srv.request("GET", "/health")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)


class CorsTest(unittest.TestCase):
    LOCAL = ["http://localhost", "http://localhost:8080", "https://localhost:3000", "http://127.0.0.1",
             "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000", "http://LOCALHOST:5173"]
    FOREIGN = ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com",
               "http://127.0.0.1.evil.com", "http://[::1].evil.com", "http://localhost:80x", "http://localhost:",
               "http://localhost:8080/path", "http://localhost@evil.com", "ftp://localhost", "null",
               "file://", "http://127.0.0.2", "http://[::2]"]

    @classmethod
    def setUpClass(cls):
        cls.srv = Serve(*ROUTER_FLAGS, "--cors-origins", "localhost")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_localhost_entry_reflects_local_origins(self):
        for origin in self.LOCAL:
            status, h, _ = self.srv.preflight(origin)
            self.assertEqual(status, 200, origin)
            self.assertEqual(h.get("access-control-allow-origin"), origin)
            self.assertEqual(h.get("access-control-allow-credentials"), "true")
            self.assertEqual(h.get("access-control-allow-methods"), "GET, POST, DELETE, OPTIONS")
            # repeated, not "*": a wildcard never covers Authorization
            self.assertEqual(h.get("access-control-allow-headers"), "Authorization, Content-Type")
            status, h, _ = self.srv.request("GET", "/health", headers={"Origin": origin})
            self.assertEqual((status, h.get("access-control-allow-origin")), (200, origin))

    def test_other_origins_get_no_cors_headers(self):
        for origin in self.FOREIGN:
            status, h, _ = self.srv.preflight(origin)
            self.assertEqual(status, 200, origin)  # llama-server's answer; the browser refuses the call
            self.assertNotIn("access-control-allow-origin", h, origin)
            self.assertNotIn("access-control-allow-credentials", h, origin)
            status, h, j = self.srv.request("GET", "/health", headers={"Origin": origin})
            self.assertEqual(status, 403, origin)  # ours: the request itself is refused too
            self.assertNotIn("access-control-allow-origin", h, origin)

    def test_default_is_local_only(self):
        srv = Serve(*ROUTER_FLAGS)
        try:
            self.assertEqual(srv.preflight("http://localhost:8080")[1].get("access-control-allow-origin"),
                             "http://localhost:8080")
            self.assertNotIn("access-control-allow-origin", srv.preflight("http://web.mydomain.fr")[1])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_explicit_origin_replaces_the_default(self):
        srv = Serve(*ROUTER_FLAGS, "--cors-origins", "https://app.example:8443")
        try:
            h = srv.preflight("https://app.example:8443")[1]
            self.assertEqual(h.get("access-control-allow-origin"), "https://app.example:8443")
            self.assertNotIn("access-control-allow-origin", srv.preflight("http://localhost")[1])
            self.assertNotIn("access-control-allow-origin", srv.preflight("https://app.example:8444")[1])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_tools_are_accepted_not_provided_and_cors_stays_local(self):
        srv = Serve(*ROUTER_FLAGS, "--tools", "all")
        try:
            self.assertIn("not provided", "".join(srv.stderr))
            for method in ("GET", "POST"):
                status, _, j = srv.request(method, "/tools", {} if method == "POST" else None)
                self.assertEqual(status, 501, j)
                self.assertIn("--tools", j["error"]["message"])
            self.assertEqual(srv.preflight("http://localhost:8080")[1].get("access-control-allow-origin"),
                             "http://localhost:8080")
            self.assertNotIn("access-control-allow-origin", srv.preflight("http://evil.com")[1])
        finally:
            self.assertEqual(srv.stop(), 0)


class MultipleHostsTest(unittest.TestCase):
    @unittest.skipUnless(ipv6_loopback(), "no IPv6 loopback")
    def test_every_address_serves(self):
        srv = Serve(*ROUTER_FLAGS, "--host", "127.0.0.1,::1", "--api-key", "k", env={"LLAMA_ARG_HOST": "192.0.2.1"})
        try:
            for host in ("127.0.0.1", "::1"):
                self.assertEqual(srv.request("GET", "/health", host=host)[0], 200, host)
                self.assertEqual(srv.request("GET", "/props", host=host)[0], 401, host)
                status, _, j = srv.request("GET", "/props", headers={"Authorization": "Bearer k"}, host=host)
                self.assertEqual((status, j["role"]), (200, "router"))
        finally:
            self.assertEqual(srv.stop(), 0)


@unittest.skipUnless(os.path.exists(TARGET), "no model at " + TARGET)
class ModelTest(unittest.TestCase):
    """Vertex AI's /predict and /metrics' n_busy_slots_per_decode: these need a model."""

    @classmethod
    def setUpClass(cls):
        cls.aip_port = free_port()
        # --port names another port: AIP_HTTP_PORT wins, as in llama-server
        cls.srv = Serve("-m", TARGET, "-c", "512", "-np", "2", "-t", "1", "--metrics", "--slots",
                        env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(cls.aip_port)}, port="1")
        status = 0
        deadline = time.time() + 60
        while status != 200 and time.time() < deadline:
            status = cls.srv.request("GET", "/health")[0]
            time.sleep(0.01)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_port_from_aip_http_port(self):
        self.assertEqual(self.srv.port, self.aip_port)

    def test_predict_runs_each_instance(self):
        chat = {"max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Say hello"}]}
        status, _, j = self.srv.request("POST", "/predict", {"instances": [
            dict(chat, **{"@requestFormat": "chatCompletions"}),
            dict(chat, stream=True, **{"@requestFormat": "/v1/chat/completions"}),  # a path; never streamed
            {"@requestFormat": "completion", "prompt": "Once upon", "n_predict": 4},
            {"@requestFormat": "tokenize", "content": "Once upon"},
            {"@requestFormat": "noSuchRoute"},
            {"max_tokens": 4},
            "not an object",
            dict(chat, max_tokens="x", **{"@requestFormat": "chatCompletions"}),
        ]})
        self.assertEqual(status, 200, j)
        p = j["predictions"]
        self.assertEqual(len(p), 8)
        self.assertEqual(p[0]["choices"][0]["message"]["role"], "assistant")
        self.assertGreater(len(p[0]["choices"][0]["message"]["content"]), 0)
        self.assertEqual(p[1]["choices"][0]["message"]["content"], p[0]["choices"][0]["message"]["content"])
        self.assertEqual(p[2]["tokens_predicted"], 4)
        self.assertGreater(len(p[3]["tokens"]), 0)
        self.assertIn("no handler registered for @requestFormat: noSuchRoute", p[4]["error"]["message"])
        self.assertIn("@requestFormat", p[5]["error"]["message"])
        self.assertIn("JSON object", p[6]["error"]["message"])
        self.assertEqual(p[7]["error"]["code"], 400)

    def test_predict_bad_bodies(self):
        for body, message in (([], "JSON object"), ({"instances": {}}, "array field named instances"),
                              ({"instances": [{}] * 129}, "maximum size of 128")):
            status, _, j = self.srv.request("POST", "/predict", body)
            self.assertEqual(status, 400, j)
            self.assertIn(message, j["error"]["message"])

    def test_metrics_busy_slots_per_decode_and_idle_slots(self):
        for _ in range(10):
            status, _, _ = self.srv.request("POST", "/completion", {"prompt": "I believe", "n_predict": 8})
            self.assertEqual(status, 200)
            # the slot is idle as soon as its client has the answer
            status, _, slots = self.srv.request("GET", "/slots")
            self.assertEqual([s["is_processing"] for s in slots], [False, False])
        status, _, text = self.srv.request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertIn("# HELP llamacpp:n_busy_slots_per_decode ", text)
        self.assertIn("# TYPE llamacpp:n_busy_slots_per_decode gauge", text)
        value = float(text.split("\nllamacpp:n_busy_slots_per_decode ")[1].split("\n")[0])
        self.assertGreaterEqual(value, 1.0)  # one request at a time: exactly one slot per decode
        self.assertLessEqual(value, 1.0)


if __name__ == "__main__":
    unittest.main()
