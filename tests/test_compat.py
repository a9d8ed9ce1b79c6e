"""llama-server drop-in compatibility: `specrpc serve` started with the flags llama-server's own test
suite passes (no translation), and a subset of that suite (tests/compat/run.sh, extracted from the
pinned release's git bundle) run against it.

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR.
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_server import BIN, ENV, Server  # noqa: E402
from test_capi import TARGET  # noqa: E402

# What the suite's tinyllama2 preset passes (tools/server/tests/utils.py), less --port/--host.
SUITE_FLAGS = ["--temp", "0.8", "--seed", "42", "--offline", "--model", TARGET, "--batch-size", "32",
               "--no-slots", "--alias", "tinyllama-2,fim", "--tags", "chat,small", "--ctx-size", "512",
               "--parallel", "2", "--n-predict", "7", "--no-jinja", "--metrics", "--slots",
               "-ub", "32", "-ctk", "f16", "-ctv", "f16", "--context-shift", "--sleep-idle-seconds", "5",
               "--spec-type", "ngram-simple", "--spec-draft-n-max", "8", "--spec-draft-n-min", "2",
               "--cors-origins", "http://localhost", "-t", "1"]


class LlamaServerFlagsTest(unittest.TestCase):
    def test_starts_with_the_suites_flags_and_honours_the_defaults(self):
        srv = Server(*SUITE_FLAGS)
        try:
            srv.wait_ready()
            status, _, body = srv.client.request("POST", "/completion", body={"prompt": "Once upon a time"})
            self.assertEqual(status, 200, body)
            r = json.loads(body)
            self.assertEqual(r["tokens_predicted"], 7)  # -n 7 is the default n_predict
            model = srv.client.rest("/v1/models")["data"][0]
            self.assertEqual((model["id"], model["aliases"], model["tags"]), ("fim", ["fim", "tinyllama-2"], ["chat", "small"]))
            props = srv.client.rest("/props")
            self.assertEqual(props["default_generation_settings"]["params"]["seed"], 42)
            self.assertEqual(props["default_generation_settings"]["n_ctx"], 256)  # -c 512 is the total of 2 slots
            gen = r["generation_settings"]
            self.assertAlmostEqual(gen["temperature"], 0.8, places=5)  # --temp
            self.assertEqual(gen["seed"], 42)  # --seed
            # a request's own fields still win over the server's defaults
            status, _, body = srv.client.request("POST", "/completion",
                                                 body={"prompt": "Once upon a time", "n_predict": 3, "temperature": 0})
            r = json.loads(body)
            self.assertEqual(r["tokens_predicted"], 3)
            self.assertEqual(r["generation_settings"]["temperature"], 0)
        finally:
            srv.stop()

    def test_slots(self):
        srv = Server("-m", TARGET, "-c", "512", "-np", "2", "-t", "1", "--no-slots")
        try:
            srv.wait_ready()
            status, _, body = srv.client.request("GET", "/slots", headers={})
            self.assertEqual(status, 501, body)
        finally:
            srv.stop()
        srv = Server("-m", TARGET, "-c", "512", "-np", "2", "-t", "1", "--slots")
        try:
            srv.wait_ready()
            status, _, body = srv.client.request("GET", "/slots", headers={})
            slots = json.loads(body)
            # listed before the first request too, as llama-server
            self.assertEqual([(s["id"], s["n_ctx"], s["is_processing"]) for s in slots], [(0, 256, False), (1, 256, False)])
        finally:
            srv.stop()

    def test_unknown_multi_letter_flag_is_named(self):
        # CLI11 alone reads "-tb 2" as "-t b" and complains about --threads' value.
        p = subprocess.run([BIN, "serve", "-m", TARGET, "-tb", "2"], env=ENV, capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("-tb", p.stderr)
        self.assertNotIn("threads", p.stderr.splitlines()[0] if p.stderr else "")


class LlamaServerSuiteTest(unittest.TestCase):
    def test_suite_subset(self):
        run = os.path.join(HERE, "compat", "run.sh")
        p = subprocess.run([run], env=dict(os.environ, SPECRPC_BIN=BIN), capture_output=True, text=True, timeout=600)
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-2000:])
        if p.returncode == 77:
            self.skipTest(p.stderr.strip().splitlines()[-1])
        self.assertEqual(p.returncode, 0, "llama-server's test subset failed (tests/compat/run.sh)")


if __name__ == "__main__":
    unittest.main()
