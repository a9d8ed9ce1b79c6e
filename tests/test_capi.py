"""The C ABI through the Python ctypes bindings (specrpc.capi.Library), on the real library and
models: the legacy flow, bad input, threads, specrpc_rpc streaming. Also home of the transcript
runner shared with test_server.py (transcripts run unchanged against the C ABI, stdio and HTTP).

Env (set by tests/CMakeLists.txt): SPECRPC_LIB, SPECRPC_MODELS_DIR, PYTHONPATH=clients/python.
"""

import glob
import json
import mmap
import os
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.environ.get("SPECRPC_LIB", "")
MODELS = os.environ.get("SPECRPC_MODELS_DIR", os.path.join(HERE, "..", "..", "shared", "models"))
TARGET = os.path.join(MODELS, "stories260K-F32.gguf")
DRAFT = os.path.join(MODELS, "stories260K-Q8_0.gguf")
# The configuration every transcript runs against (C ABI, stdio and HTTP alike).
TRANSCRIPT_CONFIG = {"model": TARGET, "model_draft": DRAFT, "ctx_size": 512, "parallel": 2, "threads": 1}  # ctx_size is the total
TRANSCRIPT_ARGS = ["-m", TARGET, "-md", DRAFT, "-c", "512", "-np", "2", "-t", "1"]  # -c is the total: 256 per slot


def is_asan_build(path):
    """Whether the binary or library at `path` is ASan-instrumented."""
    if "build-asan" in path:
        return True
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"__asan_init") >= 0
    except (OSError, ValueError):
        return False


def wait_or_kill(proc, timeout):
    """Waits up to `timeout` s for `proc` to exit; returns its exit code (None: had to be killed)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def ensure_asan_preload():
    """An ASan-instrumented libspecrpc can only be dlopen'ed by a process that has the ASan runtime
    loaded first: re-exec this interpreter with LD_PRELOAD (leak checks off: CPython keeps its heap)."""
    if not LIB or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    try:
        out = subprocess.run(["ldd", LIB], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return
    libs = {}
    for line in out.splitlines():
        if "=>" in line:
            name, path = line.split("=>")[0].strip(), line.split("=>")[1].split("(")[0].strip()
            libs[name.split(".so")[0]] = path
    if "libasan" in libs:
        # libstdc++ too: ASan must find the real __cxa_throw when it intercepts it
        preload = " ".join(p for p in (libs["libasan"], libs.get("libstdc++")) if p)
        env = dict(os.environ, LD_PRELOAD=preload)
        env["ASAN_OPTIONS"] = "detect_leaks=0:" + env.get("ASAN_OPTIONS", "")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


# ---- transcripts ------------------------------------------------------------------------------

def load_transcripts():
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "transcripts", "*.json"))):
        with open(path, encoding="utf-8") as f:
            out.append((os.path.basename(path), json.load(f)))
    return out


def match(expected, actual, path="$"):
    """Mismatches of `actual` against `expected` (objects: subset; arrays: element-wise; "$..." matchers)."""
    errs = []
    if isinstance(expected, str) and expected.startswith("$"):
        m = expected
        ok = {
            "$any": lambda: True,
            "$string": lambda: isinstance(actual, str),
            "$nonempty": lambda: isinstance(actual, str) and actual != "",
            "$int": lambda: isinstance(actual, int) and not isinstance(actual, bool),
            "$number": lambda: isinstance(actual, (int, float)) and not isinstance(actual, bool),
            "$positive": lambda: isinstance(actual, (int, float)) and not isinstance(actual, bool) and actual > 0,
            "$bool": lambda: isinstance(actual, bool),
            "$array": lambda: isinstance(actual, list),
            "$object": lambda: isinstance(actual, dict),
        }.get(m)
        if ok is not None:
            if not ok():
                errs.append(f"{path}: {actual!r} is not {m}")
        elif m.startswith("$contains:"):
            if not isinstance(actual, str) or m[10:] not in actual:
                errs.append(f"{path}: {actual!r} does not contain {m[10:]!r}")
        elif m.startswith("$prefix:"):
            if not isinstance(actual, str) or not actual.startswith(m[8:]):
                errs.append(f"{path}: {actual!r} does not start with {m[8:]!r}")
        else:
            errs.append(f"{path}: unknown matcher {m}")
        return errs
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r:.200}"]
        for k, v in expected.items():
            if v == "$absent":
                if k in actual:
                    errs.append(f"{path}.{k}: should be absent, is {actual[k]!r:.200}")
            elif k not in actual:
                errs.append(f"{path}.{k}: missing (have {sorted(actual)})")
            else:
                errs += match(v, actual[k], f"{path}.{k}")
        return errs
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {len(expected)} elements, got {actual!r:.300}"]
        for i, (e, a) in enumerate(zip(expected, actual)):
            errs += match(e, a, f"{path}[{i}]")
        return errs
    if isinstance(expected, float) or isinstance(actual, float):
        if not isinstance(actual, (int, float)) or isinstance(actual, bool) or abs(expected - actual) > 1e-6:
            errs.append(f"{path}: {actual!r} != {expected!r}")
        return errs
    if expected != actual or type(expected) is not type(actual):
        errs.append(f"{path}: {actual!r:.300} != {expected!r:.300}")
    return errs


def run_transcript(send, transcript):
    """send(text, stream, expect_none) -> (response or None, [notifications]). Returns the failures."""
    failures = []
    for step in transcript["steps"]:
        text = step["send_raw"] if "send_raw" in step else json.dumps(step["send"])
        stream = step.get("stream")
        resp, notes = send(text, bool(stream), step["expect"] is None)
        name = step.get("name", text[:60])
        if step["expect"] is None:
            if resp is not None:
                failures.append(f"{name}: expected no answer, got {resp!r:.200}")
            continue
        failures += [f"{name}: {e}" for e in match(step["expect"], resp)]
        if stream:
            chunks = [n["params"]["data"] for n in notes if n.get("method") == "completion.chunk"]
            if len(chunks) < stream.get("min_chunks", 1):
                failures.append(f"{name}: {len(chunks)} chunks")
            for i, c in enumerate(chunks):
                failures += [f"{name}: chunk {i}: {e}" for e in match(stream.get("chunk", {}), c)]
            if stream.get("concat_equals") and isinstance(resp, dict) and "result" in resp:
                key = stream["concat_equals"]
                joined = "".join(c.get(key, "") for c in chunks)
                if joined != resp["result"].get(key):
                    failures.append(f"{name}: chunks give {joined!r}, result has {resp['result'].get(key)!r}")
            if any(n["params"].get("id") != json.loads(text).get("id") for n in notes):
                failures.append(f"{name}: a notification carries the wrong id")
    return failures


class CapiSend:
    """Transcript transport over specrpc_rpc_stream."""

    def __init__(self, lib):
        self.lib = lib

    def __call__(self, text, stream, expect_none):
        notes = []
        resp = self.lib.rpc_stream_raw(text, notes.append)
        return resp, notes


# ---- tests ------------------------------------------------------------------------------------

class CapiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from specrpc.capi import Library

        cls.lib = Library(LIB)

    @classmethod
    def tearDownClass(cls):
        cls.lib.deinit()

    def test_1_before_init_and_bad_inits(self):
        lib = self.lib
        lib.deinit()
        r = lib.get_completion({"prompt": "Once"})
        self.assertFalse(r["success"])
        self.assertEqual(r["error"]["code"], -32001)
        self.assertEqual(lib.poll_system_status()["init_success"], 0)
        self.assertEqual(lib.init("-m /no/such/model.gguf"), 1)  # the existing library's failure code
        st = lib.poll_system_status()
        self.assertEqual(st["init_success"], -1)
        self.assertIn("/no/such/model.gguf", st["error"])
        self.assertEqual(lib.init({"model": TARGET, "ctx_size": "big"}), 1)
        self.assertIn("ctx_size", lib.poll_system_status()["error"])
        self.assertEqual(lib.init({"model": TARGET, "ctx_size": 1}), 1)  # too small to be useful
        self.assertIn("ctx_size", lib.poll_system_status()["error"])
        self.assertEqual(lib.init("-m %s -md %s" % (TARGET, os.path.join(MODELS, "BabyLlama-tok105-F32.gguf"))), 1)
        self.assertIn("vocab", lib.poll_system_status()["error"])
        # raw garbage in every legacy entry point: error JSON, no crash
        for fn in ("tokenize", "get_completion", "async_completion_init", "async_completion_poll",
                   "async_completion_cancel"):
            for junk in (b"{", b"\xff\xfe", b"[]", b"null", b'{"prompt": 5}'):
                if fn == "async_completion_cancel" and junk == b'{"prompt": 5}':
                    continue  # an object without request_id: nothing to cancel, {"success": true} as the existing library
                out = json.loads(lib.raw(fn, junk))
                self.assertFalse(out["success"], (fn, junk, out))
                self.assertIn("code", out["error"])

    def test_2_legacy_flow(self):
        lib = self.lib
        self.assertEqual(lib.init("-m %s -c 512 -np 2 -t 1" % TARGET), 0, lib.poll_system_status())
        st = lib.poll_system_status()
        self.assertEqual(st["init_success"], 1)
        self.assertEqual(st["loading_progress"], 1.0)
        self.assertEqual(st["model_alias"], "stories260K-F32.gguf")
        tok = lib.tokenize("Once upon a time")
        self.assertEqual(tok, {"success": True, "tokens": ["", " Once", " upon", " a", " time"],
                               "ids": [1, 403, 407, 261, 378], "length": 5})
        # any n_predict is a cap, bounded by the context
        big = lib.get_completion({"prompt": "Once upon a time", "n_predict": 100000, "temperature": 0})
        self.assertTrue(big["success"], big)
        self.assertTrue(0 < big["tokens_predicted"] < 256)
        r = lib.get_completion({"prompt": "Once upon a time", "n_predict": 16, "temperature": 0})
        self.assertTrue(r["success"])
        self.assertEqual(r["content"], ", there was a little girl named Lily. She loved to play")
        bad = lib.get_completion({"prompt": "x", "n_predict": "many"})
        self.assertEqual((bad["success"], bad["error"]["code"], bad["error"]["data"]["param"]),
                         (False, -32602, "n_predict"))
        # async: the updates concatenate to the final content
        a = lib.async_completion_init({"prompt": "Once upon a time", "n_predict": 24, "temperature": 0})
        self.assertTrue(a["success"])
        rid, text, deadline = a["request_id"], "", time.time() + 30
        while time.time() < deadline:
            p = lib.async_completion_poll(rid)
            self.assertTrue(p["success"], p)
            text += "".join(u["content"] for u in p["completion_updates"])
            if p["finished"]:
                break
            time.sleep(0.002)
        self.assertTrue(p["finished"])
        self.assertEqual(text, p["result"]["content"])
        self.assertTrue(p["result"]["content"].startswith(", there was a little girl named Lily."))
        # cancel: the end is reported as the existing library did (success, finished) + the partial result
        a = lib.async_completion_init({"prompt": "Once upon a time", "n_predict": 240, "ignore_eos": True})
        self.assertTrue(lib.async_completion_cancel(a["request_id"])["success"])
        deadline = time.time() + 30
        while time.time() < deadline:
            p = lib.async_completion_poll(a["request_id"])
            if p["finished"]:
                break
            time.sleep(0.002)
        self.assertEqual((p["success"], p["finished"], p["cancelled"]), (True, True, True))
        self.assertTrue(p["result"]["cancelled"])
        self.assertLess(p["result"]["tokens_predicted"], 240)
        # deinit, then init again with JSON (the existing library's server keys are ignored), async
        lib.deinit()
        self.assertEqual(lib.tokenize("x")["error"]["code"], -32001)
        self.assertEqual(lib.init({"model": TARGET, "ctx_size": 128, "threads": 1, "port": 8080}), 0)
        lib.init_async({"model": TARGET, "ctx_size": 128, "threads": 1})
        self.assertTrue(lib.wait_loaded())
        self.assertEqual(lib.call("props")["n_ctx"], 128)

    def test_3_threads_and_rpc_streaming(self):
        lib = self.lib
        if lib.poll_system_status()["init_success"] != 1:
            self.assertEqual(lib.init({"model": TARGET, "ctx_size": 128, "threads": 1}), 0)
        want = lib.get_completion({"prompt": "Tom and Sue", "n_predict": 10, "temperature": 0})["content"]
        errors = []

        def worker():
            for _ in range(5):
                r = lib.get_completion({"prompt": "Tom and Sue", "n_predict": 10, "temperature": 0})
                if not r.get("success") or r["content"] != want:
                    errors.append(r)
                t = lib.tokenize("Tom")
                if not t.get("success"):
                    errors.append(t)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        s = lib.stream("completion", {"prompt": "Tom and Sue", "n_predict": 10, "temperature": 0})
        chunks = [c["content"] for c in s]
        self.assertGreaterEqual(len(chunks), 2)
        self.assertEqual("".join(chunks), s.result["content"])
        self.assertEqual(s.result["content"], want)
        self.assertIsNone(lib.rpc_raw({"jsonrpc": "2.0", "method": "health"}))  # a notification
        self.assertEqual(lib.rpc_raw("{")["error"]["code"], -32700)
        self.assertRegex(lib.version(), r"^\d+\.\d+\.\d+")

    def test_3b_librpcserver_and_libc_free(self):
        """A legacy ctypes caller: loads librpcserver, calls the old names, frees with libc's free().
        libspecrpc itself exports only specrpc_* names."""
        import ctypes

        lib = self.lib
        self.assertFalse(hasattr(lib._lib, "init") or hasattr(lib._lib, "tokenize"))
        path = os.environ.get("RPCSERVER_LIB") or os.path.join(os.path.dirname(LIB), "librpcserver.so")
        legacy = ctypes.CDLL(path)
        for name in ("tokenize", "get_completion", "init"):
            getattr(legacy, name).argtypes = [ctypes.c_char_p]
        for name in ("tokenize", "get_completion", "poll_system_status"):
            getattr(legacy, name).restype = ctypes.c_void_p
        legacy.poll_system_status.argtypes = []
        legacy.init.restype = ctypes.c_int
        self.assertEqual(legacy.init(("server -m %s -c 128 -t 1" % TARGET).encode()), 0)
        libc = ctypes.CDLL(None)
        libc.free.argtypes = [ctypes.c_void_p]
        for _ in range(3):
            for fn, arg in (("tokenize", b'{"text": "Once upon a time"}'), ("poll_system_status", None),
                            ("get_completion", b'{"prompt": "Once", "n_predict": 2}')):
                ptr = getattr(legacy, fn)(arg) if arg is not None else getattr(legacy, fn)()
                out = json.loads(ctypes.string_at(ptr).decode())
                libc.free(ptr)
                self.assertTrue(out["success"], out)
        self.assertEqual(lib.poll_system_status()["init_success"], 1)  # one engine behind both names

    def test_4_transcripts(self):
        lib = self.lib
        st = lib.call("init", TRANSCRIPT_CONFIG)
        self.assertTrue(st["init_success"])
        for name, t in load_transcripts():
            with self.subTest(transcript=name):
                self.assertEqual(run_transcript(CapiSend(lib), t), [])


if __name__ == "__main__":
    ensure_asan_preload()
    sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
    unittest.main(verbosity=2)
