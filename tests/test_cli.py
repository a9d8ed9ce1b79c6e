"""`specrpc generate` as a user runs it: whole processes of the real binary on real models.

- Speculation is lossless across processes: greedy text is the same plain, with prompt lookup, with
  the suffix drafter and with a draft model.
- Huge pages (tools/launcher/huge_pages.c): the tool runs with glibc.malloc.hugetlb=1 where the machine
  gives huge pages to advised memory, keeps a tunable the user set, and can be turned off. The
  process is observed from outside (/proc/PID/environ) while it blocks reading its prompt from a
  FIFO, after the exec: no timing, no race.
- `generate` loads none of the server's libraries (/proc/PID/maps, observed the same way).
- Bad input gets a clear error and exit code 1, never a signal.
- A first use without cached costs drafts within a short request on two threads.

Env (set by tests/CMakeLists.txt): SPECRPC_BIN, SPECRPC_MODELS_DIR.
"""

import os
import re
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_capi import MODELS, TARGET, is_asan_build  # noqa: E402

BIN = os.environ.get("SPECRPC_BIN", os.path.join(HERE, "..", "build", "specrpc"))
COPY_TARGET = os.path.join(MODELS, "stories260K-copy-F32.gguf")
# A passage and the start of its repetition: the copy target continues it, so drafts are long.
PASSAGE = ("Once upon a time, there was a little girl named Lily. She loved to play with her toys. "
           "One day, she saw a big red ball in the park. She ran to the ball and kicked it high.")
COPY_PROMPT = PASSAGE + "\n\n" + PASSAGE[:60]


def env(**kw):
    e = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPECRPC_HUGE_PAGES")}
    e.update(kw)
    return e


def generate(*args, environ=None, prompt=COPY_PROMPT, model=COPY_TARGET):
    cmd = [BIN, "generate", "-m", model, "-p", prompt, "-n", "48", "--temp", "0", "--ignore-eos", "-t", "2",
           "-c", "512", "--no-display-prompt", "--log-level", "error", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environ or env())


def thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return None


def read_environ(raw):
    """/proc/PID/environ as a dict. glibc ends each tunable's value in GLIBC_TUNABLES with a NUL
    where the process started (it parses in place and keeps a copy for getenv), so the pieces
    after it that name a glibc tunable are joined back with ':'."""
    seen, last = {}, None
    for kv in raw.decode(errors="replace").split("\0"):
        if last == "GLIBC_TUNABLES" and re.match(r"glibc\.[\w.]+=", kv):
            seen[last] += ":" + kv
        elif "=" in kv:
            last, value = kv.split("=", 1)
            seen[last] = value
    return seen


def glibc_has_hugetlb():
    import platform
    lib, ver = platform.libc_ver()
    if lib != "glibc":
        return False
    major, minor = (int(x) for x in ver.split(".")[:2])
    return (major, minor) >= (2, 35)


class LosslessTest(unittest.TestCase):
    def test_greedy_text_is_the_same_with_every_drafter(self):
        plain = generate()
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertTrue(plain.stdout.strip())
        for extra in (["--spec-type", "lookup"], ["--spec-type", "suffix"],
                      ["-md", TARGET, "--spec-type", "draft"], ["-md", TARGET, "--spec-type", "lookup,draft"]):
            r = generate(*extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, plain.stdout, extra)


class RoundLogTest(unittest.TestCase):
    def test_the_rounds_account_for_every_token(self):
        """The debug line of each round (src/engine/step.cpp), as bench/round_account.py reads it:
        the rounds' tokens (accepted + 1 each) are the tokens generated, and their drafted and
        accepted tokens the statistics' totals."""
        sys.path.insert(0, os.path.join(HERE, "..", "bench"))
        import round_account
        # A fixed draft length, so that the copy prompt drafts whatever the timings.
        r = generate("--spec-type", "lookup", "--no-adaptive", "--draft-max", "8", "--log-level", "debug")
        self.assertEqual(r.returncode, 0, r.stderr)
        rounds = round_account.parse(r.stderr.splitlines())
        self.assertEqual(sum(int(x["accepted"]) + 1 for x in rounds), 48, r.stderr)
        self.assertGreater(max(x["drafted"] for x in rounds), 0, "the copy prompt drafts")
        for x in rounds:
            self.assertLessEqual(x["accepted"], x["drafted"])
            self.assertLessEqual(x["drafted"], x["gamma"])
            self.assertGreaterEqual(x["all"], x["verify"] + x["draft"] - 1e-3)
        self.assertEqual(sum(int(x["drafted"]) for x in rounds), int(re.search(r"n_draft += (\d+)", r.stderr).group(1)))
        self.assertEqual(sum(int(x["accepted"]) for x in rounds), int(re.search(r"n_accept += (\d+)", r.stderr).group(1)))


class FirstUseTest(unittest.TestCase):
    def test_a_first_use_on_two_threads_drafts(self):
        """A first use (no cached costs) reads t(1) from a few plain passes on the thread count the
        engine has settled on, then guesses the cost curve and drafts. On this tiny target a pass
        is shorter than the kernel's tick, and the share of the cores read from the process's CPU
        clock came out 0.5: the thread choice tried one thread now and then, never settled, and
        the guess waited the whole request (4 of 6 runs drafted nothing). Now the share is read
        from each thread's own clock, and all threads that won a trial count as settled
        (engine/thread_choice.h). Three fresh processes, each with an empty cost cache, must all
        draft."""
        for i in range(3):
            with tempfile.TemporaryDirectory() as d:
                r = generate("--spec-type", "lookup", "--log-level", "info",
                             environ=env(SPECRPC_CACHE_DIR=d, SPECRPC_LEARNED_CACHE="off"))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertRegex(r.stderr, r"cost curve guessed on \d thread", f"run {i}: " + r.stderr)
                drafted = int(re.search(r"n_draft += (\d+)", r.stderr).group(1))
                self.assertGreater(drafted, 0, f"run {i}: the copy prompt drafted nothing\n" + r.stderr)


class ExitTest(unittest.TestCase):
    def test_everything_is_written_before_the_end(self):
        """`generate` ends its process without tearing the engine down (tools/cmd_generate.cpp):
        the text, its last newline, the statistics and the dynamic n-gram cache must all be out."""
        with tempfile.TemporaryDirectory() as d:
            cache = os.path.join(d, "dynamic.ngram")
            r = generate("--spec-type", "ngram", "--lookup-cache-dynamic", cache)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.endswith("\n") and len(r.stdout) > 48, repr(r.stdout))
            self.assertRegex(r.stderr, r"decoded +48 tokens")
            self.assertRegex(r.stderr, r"n_accept += \d+")
            self.assertGreater(os.path.getsize(cache), 0)


class BadInputTest(unittest.TestCase):
    def test_errors_are_clear(self):
        cases = [(["-m", "/nonexistent.gguf"], "nonexistent"),
                 (["-f", "/nonexistent-prompt.txt"], "cannot read"),
                 (["-md", os.path.join(MODELS, "BabyLlama-tok105-F32.gguf"), "--spec-type", "draft"], "vocab")]
        for extra, words in cases:
            r = generate(*extra)
            self.assertEqual(r.returncode, 1, (extra, r.stderr))
            self.assertIn(words, r.stderr.lower(), extra)
            self.assertIn("error", r.stderr.lower(), extra)


def observe_while_waiting(test, environ, what):
    """/proc/PID/<what> of `specrpc generate` while it blocks reading its prompt from a FIFO (after
    any exec, with its libraries loaded), and its output."""
    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "prompt")
        os.mkfifo(fifo)
        cmd = [BIN, "generate", "-m", TARGET, "-f", fifo, "-n", "8", "--temp", "0", "-t", "1",
               "--no-display-prompt", "--log-level", "error"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)

        def give_up():  # a loop of execs never opens the FIFO: end it and free our open()
            p.kill()
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        timer = threading.Timer(60, give_up)
        timer.start()
        try:
            with open(fifo, "w") as f:  # returns once the process has opened it: after any exec
                with open(f"/proc/{p.pid}/{what}", "rb") as e:
                    seen = e.read()
                f.write("Once upon a time")
            out, err = p.communicate(timeout=120)
        finally:
            timer.cancel()
        test.assertEqual(p.returncode, 0, err)
        return seen, out


class LibrariesTest(unittest.TestCase):
    def test_generate_loads_no_server_library(self):
        """`generate` runs from libspecrpc_tool.so, which links neither the HTTP transport (OpenSSL,
        zlib, brotli through cpp-httplib: ~9 ms of loading) nor llama.cpp's `common` (~3 ms)."""
        maps, out = observe_while_waiting(self, env(), "maps")
        libs = {os.path.basename(line.split()[-1]) for line in maps.decode().splitlines() if "/" in line}
        self.assertIn("libspecrpc_tool.so", libs)
        self.assertTrue([x for x in libs if x.startswith("libllama.so")], sorted(libs))
        for lib in ("libspecrpc_serve.so", "libcpp-httplib.so", "libssl.so", "libcrypto.so", "libllama-common.so"):
            self.assertFalse([x for x in libs if x.startswith(lib)], f"generate loaded {lib}: {sorted(libs)}")
        self.assertTrue(out)


@unittest.skipIf(is_asan_build(BIN), "ASan builds keep their own allocator and do not exec again")
@unittest.skipUnless(thp_mode() == "madvise" and glibc_has_hugetlb(),
                     "huge pages are given to advised memory only where THP is 'madvise' and glibc >= 2.35")
class HugePagesTest(unittest.TestCase):
    def environ_of_running(self, environ):
        """The environment of `specrpc generate` while it waits for its prompt, and its output."""
        raw, out = observe_while_waiting(self, environ, "environ")
        return read_environ(raw), out

    def test_runs_with_the_tunable(self):
        seen, out = self.environ_of_running(env())
        self.assertEqual(seen.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1")
        self.assertTrue(out)

    def test_other_tunables_are_kept(self):
        seen, _ = self.environ_of_running(env(GLIBC_TUNABLES="glibc.malloc.arena_max=2"))
        self.assertEqual(seen.get("GLIBC_TUNABLES"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")

    def test_a_users_choice_is_kept(self):
        seen, _ = self.environ_of_running(env(GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))
        self.assertEqual(seen.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=0")

    def test_can_be_turned_off(self):
        seen, _ = self.environ_of_running(env(SPECRPC_HUGE_PAGES="0"))
        self.assertNotIn("GLIBC_TUNABLES", seen)

    def test_same_text_either_way(self):
        on = generate()
        off = generate(environ=env(SPECRPC_HUGE_PAGES="0"))
        self.assertEqual(on.returncode, 0, on.stderr)
        self.assertEqual(on.stdout, off.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
