"""End-to-end tests of slot files and idle sleep on `specrpc serve` (the real binary and models):
POST /slots/:id?action=save|restore|erase with --slot-save-path (a restored slot continues its
cache: same greedy text, one prompt token evaluated), its errors (path traversal, unknown or busy
slot, no --slot-save-path, files that are not slot files), `id_slot` on requests, and
--sleep-idle-seconds (models freed while idle, read-only routes answer without waking them, the
first call that needs the model loads it again and answers as before).

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR, PYTHONPATH=clients/python.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_server import Server  # noqa: E402
from test_capi import DRAFT, MODELS, TARGET  # noqa: E402

PROMPT = "Once upon a time, there was a little girl named Lily."


def post(c, path, body=None):
    status, _, raw = c.request("POST", path, body if body is not None else {})
    return status, json.loads(raw)


class SlotFilesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="specrpc-slots-")
        cls.save_dir = os.path.join(cls.dir, "saves")  # created by the server on the first save
        # 2 slots of 4096 tokens: room for a generation long enough (seconds) to find its slot busy
        cls.srv = Server("-m", TARGET, "-c", "8192", "-np", "2", "-t", "1", "--temp", "0",
                         "--slot-save-path", cls.save_dir)
        cls.srv.wait_ready()
        cls.c = cls.srv.client

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def complete(self, slot, prompt=PROMPT, n=24):
        return self.c.rest("/completion", {"prompt": prompt, "id_slot": slot, "n_predict": n, "cache_prompt": True})

    def test_restored_slot_continues_its_cache(self):
        self.assertEqual(post(self.c, "/slots/1?action=erase")[0], 200)  # the tests share the server
        first = self.complete(1)
        self.assertEqual(first["id_slot"], 1)
        self.assertEqual(first["timings"]["cache_n"], 0)
        n_prompt = first["timings"]["prompt_n"]
        st, saved = post(self.c, "/slots/1?action=save", {"filename": "lily.bin"})
        self.assertEqual(st, 200, saved)
        # the KV holds the prompt and every generated token but the last (not yet decoded)
        self.assertEqual(saved["n_saved"], n_prompt + 24 - 1)
        self.assertEqual((saved["id_slot"], saved["filename"]), (1, "lily.bin"))
        self.assertGreater(saved["n_written"], 0)
        self.assertIn("save_ms", saved["timings"])
        self.assertTrue(os.path.isfile(os.path.join(self.save_dir, "lily.bin")))

        # slot 0 holds something else; the restore replaces it
        self.complete(0, "The dog ran to the park")
        st, restored = post(self.c, "/slots/0?action=restore", {"filename": "lily.bin"})
        self.assertEqual(st, 200, restored)
        self.assertEqual(restored["n_restored"], saved["n_saved"])
        self.assertEqual(restored["n_read"], saved["n_written"])
        self.assertIn("restore_ms", restored["timings"])

        # the same greedy request in the restored slot: the whole prompt is cached, same text
        again = self.complete(0)
        self.assertEqual(again["id_slot"], 0)
        self.assertEqual(again["timings"]["prompt_n"], 1)
        self.assertEqual(again["timings"]["cache_n"], n_prompt - 1)
        self.assertEqual(again["content"], first["content"])

        # the cached continuation: the original text goes on from where the saved slot stopped
        longer = self.complete(0, PROMPT + first["content"], n=8)
        self.assertGreater(longer["timings"]["cache_n"], n_prompt)
        ref = self.c.rest("/completion", {"prompt": PROMPT + first["content"], "n_predict": 8, "cache_prompt": False})
        self.assertEqual(longer["content"], ref["content"])

    def test_erase(self):
        self.complete(1)
        self.assertGreater(self.complete(1)["timings"]["cache_n"], 0)
        st, r = post(self.c, "/slots/1?action=erase")
        self.assertEqual(st, 200, r)
        self.assertEqual(r["id_slot"], 1)
        self.assertGreater(r["n_erased"], 0)
        again = self.complete(1)
        self.assertEqual(again["timings"]["cache_n"], 0)

    def test_bad_filenames_are_refused(self):
        for name in ["../escape.bin", "a/b.bin", "..", ".", "", "x\\y", "/etc/passwd", "dots..bin", " lead", "trail.",
                     "ctl\x01.bin", "colon:.bin"]:
            for action in ("save", "restore"):
                st, r = post(self.c, f"/slots/0?action={action}", {"filename": name})
                self.assertEqual(st, 400, (name, r))
                self.assertEqual(r["error"]["param"], "filename")
        st, r = post(self.c, "/slots/0?action=save", {"filename": 7})
        self.assertEqual(st, 400, r)
        st, r = post(self.c, "/slots/0?action=save", {})
        self.assertEqual(st, 400, r)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "escape.bin")))

    def test_unknown_slot_and_action(self):
        st, r = post(self.c, "/slots/2?action=erase")
        self.assertEqual(st, 404, r)
        self.assertIn("slot 2 does not exist", r["error"]["message"])
        for path in ("/slots/abc?action=erase", "/slots/-1?action=erase", "/slots/0?action=nap", "/slots/0"):
            st, r = post(self.c, path, {"filename": "x.bin"})
            self.assertEqual(st, 400, (path, r))
        # a request for a slot that does not exist
        st, r = post(self.c, "/completion", {"prompt": "x", "id_slot": 5, "n_predict": 1})
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "id_slot")

    def test_restore_errors_leave_the_slot_usable(self):
        st, r = post(self.c, "/slots/1?action=restore", {"filename": "missing.bin"})
        self.assertEqual(st, 404, r)
        os.makedirs(self.save_dir, exist_ok=True)
        with open(os.path.join(self.save_dir, "junk.bin"), "wb") as f:
            f.write(b"not a slot file at all" * 10)
        st, r = post(self.c, "/slots/1?action=restore", {"filename": "junk.bin"})
        self.assertEqual(st, 400, r)
        self.assertIn("junk.bin", r["error"]["message"])
        ref = self.c.rest("/completion", {"prompt": PROMPT, "n_predict": 8, "id_slot": 0, "cache_prompt": False})
        after = self.complete(1, n=8)
        self.assertEqual(after["timings"]["cache_n"], 0)
        self.assertEqual(after["content"], ref["content"])

    def test_busy_slot(self):
        done = []
        body = {"prompt": "Once", "id_slot": 1, "n_predict": 1500, "ignore_eos": True}
        t = threading.Thread(target=lambda: done.append(self.c.rest("/completion", body)))
        t.start()
        try:
            deadline, seen = time.time() + 30, False
            while time.time() < deadline and not done and not seen:
                seen = any(s["id"] == 1 and s["is_processing"] for s in self.c.rest("/slots"))
                time.sleep(0.002)
            self.assertTrue(seen, "slot 1 never ran the request (id_slot)")
            st, r = post(self.c, "/slots/1?action=save", {"filename": "busy.bin"})
            if done:
                self.skipTest("the generation ended before the save arrived")
            self.assertEqual(st, 503, r)
            self.assertIn("busy", r["error"]["message"])
            # the other slot is free meanwhile
            st, r = post(self.c, "/slots/0?action=erase")
            self.assertEqual(st, 200, r)
        finally:
            t.join(300)
        self.assertEqual(len(done), 1)


class DraftModelSlotTest(unittest.TestCase):
    def test_restore_with_a_draft_model(self):
        # only the target's KV is in the file: the draft's KV of the slot is cleared on restore and
        # catches up, and speculation stays lossless (the same greedy text)
        d = tempfile.mkdtemp(prefix="specrpc-slots-")
        srv = Server("-m", TARGET, "-md", DRAFT, "--spec-type", "draft", "-c", "1024", "-np", "2", "-t", "1",
                     "--temp", "0", "--slot-save-path", d)
        c = srv.client
        try:
            srv.wait_ready()
            body = {"prompt": PROMPT, "n_predict": 32, "id_slot": 0}
            first = c.rest("/completion", body)
            st, saved = post(c, "/slots/0?action=save", {"filename": "d.bin"})
            self.assertEqual(st, 200, saved)
            c.rest("/completion", {"prompt": "The cat sat on the mat", "n_predict": 32, "id_slot": 1})
            st, restored = post(c, "/slots/1?action=restore", {"filename": "d.bin"})
            self.assertEqual((st, restored["n_restored"]), (200, saved["n_saved"]), restored)
            again = c.rest("/completion", dict(body, id_slot=1))
            self.assertEqual(again["timings"]["prompt_n"], 1)
            self.assertEqual(again["content"], first["content"])
            longer = c.rest("/completion", {"prompt": PROMPT + first["content"], "n_predict": 16, "id_slot": 1})
            plain = c.rest("/completion", {"prompt": PROMPT + first["content"], "n_predict": 16, "id_slot": 0,
                                           "cache_prompt": False, "speculative": {"type": []}})
            self.assertGreater(longer["timings"]["cache_n"], 0)
            self.assertEqual(longer["content"], plain["content"])
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)


class OtherModelTest(unittest.TestCase):
    def test_a_file_of_another_model_is_refused(self):
        # stories260K-x25M shares the vocabulary but not the KV shapes: llama.cpp's state reader
        # refuses it, the request gets 400 and the slot stays usable
        d = tempfile.mkdtemp(prefix="specrpc-slots-")
        try:
            srv = Server("-m", TARGET, "-c", "512", "-np", "1", "-t", "1", "--slot-save-path", d)
            try:
                srv.wait_ready()
                srv.client.rest("/completion", {"prompt": PROMPT, "n_predict": 8})
                self.assertEqual(post(srv.client, "/slots/0?action=save", {"filename": "f32.bin"})[0], 200)
            finally:
                srv.stop()
            srv = Server("-m", os.path.join(MODELS, "stories260K-x25M-Q8_0.gguf"), "-c", "512", "-np", "1", "-t", "1",
                         "--temp", "0", "--slot-save-path", d)
            try:
                srv.wait_ready()
                st, r = post(srv.client, "/slots/0?action=restore", {"filename": "f32.bin"})
                self.assertEqual(st, 400, r)
                self.assertIn("does not load into this context", r["error"]["message"])
                after = srv.client.rest("/completion", {"prompt": PROMPT, "n_predict": 8})
                self.assertEqual(after["timings"]["cache_n"], 0)
                self.assertEqual(after["tokens_predicted"], 8)
            finally:
                srv.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class NoSavePathTest(unittest.TestCase):
    def test_slot_actions_need_a_save_path(self):
        srv = Server("-m", TARGET, "-c", "512", "-np", "1", "-t", "1", api_key="k3y")
        try:
            srv.wait_ready()
            # the route with a path parameter is behind the API key like the others
            st, _, _ = srv.client.request("POST", "/slots/0?action=erase", {}, headers={})
            self.assertEqual(st, 401)
            for action in ("save", "restore", "erase"):
                st, r = post(srv.client, f"/slots/0?action={action}", {"filename": "x.bin"})
                self.assertEqual(st, 501, r)
                self.assertIn("--slot-save-path", r["error"]["message"])
            self.assertFalse(srv.client.rest("/props")["is_sleeping"])
        finally:
            srv.stop()


class SleepTest(unittest.TestCase):
    def test_sleep_and_wake(self):
        srv = Server("-m", TARGET, "-c", "512", "-np", "1", "-t", "1", "--temp", "0", "--sleep-idle-seconds", "1",
                     "--metrics")
        c = srv.client
        try:
            srv.wait_ready()
            before = c.rest("/completion", {"prompt": PROMPT, "n_predict": 16})
            toks = c.rest("/tokenize", {"content": PROMPT})["tokens"]
            # the throughput gauges cover the window since the previous scrape (llama-server's buckets)
            rate = lambda: float(next(l for l in c.rest("/metrics").splitlines()
                                      if l.startswith("llamacpp:predicted_tokens_seconds ")).split()[1])
            self.assertGreater(rate(), 0)
            self.assertEqual(rate(), 0)
            deadline = time.time() + 20
            while time.time() < deadline and not c.rest("/props")["is_sleeping"]:
                time.sleep(0.1)
            self.assertTrue(c.rest("/props")["is_sleeping"])
            # these answer without the model, and do not wake it
            self.assertEqual(c.rest("/health")["status"], "ok")
            self.assertEqual(len(c.rest("/v1/models")["data"]), 1)
            self.assertIn("llamacpp:tokens_predicted_total 16", c.rest("/metrics"))
            self.assertEqual(len(c.rest("/slots")), 1)
            self.assertTrue(c.rest("/props")["is_sleeping"])
            # tokenize needs the vocabulary: it wakes the models
            self.assertEqual(c.rest("/tokenize", {"content": PROMPT})["tokens"], toks)
            self.assertFalse(c.rest("/props")["is_sleeping"])
            # asleep again, then a generation wakes it: the same greedy text, the cache gone
            deadline = time.time() + 20
            while time.time() < deadline and not c.rest("/props")["is_sleeping"]:
                time.sleep(0.1)
            self.assertTrue(c.rest("/props")["is_sleeping"])
            after = c.rest("/completion", {"prompt": PROMPT, "n_predict": 16})
            self.assertEqual(after["content"], before["content"])
            self.assertEqual(after["timings"]["cache_n"], 0)
            self.assertFalse(c.rest("/props")["is_sleeping"])
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main()
