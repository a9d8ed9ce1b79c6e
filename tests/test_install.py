"""The install tree as an embedder meets it: `cmake --install` of this build into a temporary
prefix, then a consumer project outside the source tree that does find_package(specrpc) and builds
three programs, one per exported target: C through specrpc/specrpc.h (specrpc::specrpc), C through
the legacy specrpc/rpcserver.h (specrpc::rpcserver), C++ through specrpc/engine.hpp
(specrpc::engine). Each runs and checks an answer that needs the library (a version, an error for
a missing model file). Skipped under the sanitizers (the consumer is not instrumented), without
cmake, and when configuring and building the consumer takes longer than CONSUMER_TIMEOUT.

Env (set by tests/CMakeLists.txt): SPECRPC_BIN (the build directory is its folder)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_capi import TARGET, is_asan_build  # noqa: E402

BIN = os.environ.get("SPECRPC_BIN", os.path.join(HERE, "..", "build", "specrpc"))
BUILD = os.path.dirname(os.path.abspath(BIN))
CONSUMER_TIMEOUT = 300  # seconds for the consumer's configure + build on a loaded 2-core machine

CMAKELISTS = """cmake_minimum_required(VERSION 3.25)
project(specrpc_consumer LANGUAGES C CXX)
find_package(specrpc 0.1 CONFIG REQUIRED)
add_executable(use_c use_c.c)
target_link_libraries(use_c PRIVATE specrpc::specrpc)
add_executable(use_legacy use_legacy.c)
target_link_libraries(use_legacy PRIVATE specrpc::rpcserver)
add_executable(use_cpp use_cpp.cpp)
target_link_libraries(use_cpp PRIVATE specrpc::engine)
"""

USE_C = r"""#include <stdio.h>
#include <string.h>
#include <specrpc/specrpc.h>
int main(void) {
    char * r = specrpc_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"health\"}");
    int ok = r && strstr(r, "\"id\":1") != NULL;
    printf("%s %s\n", specrpc_version(), r ? r : "(null)");
    specrpc_free(r);
    return ok ? 0 : 1;
}
"""

USE_LEGACY = r"""#include <stdio.h>
#include <stdlib.h>
#include <specrpc/rpcserver.h>
int main(void) {
    char * s = poll_system_status();
    printf("%s\n", s ? s : "(null)");
    int ok = s != NULL;
    free(s);
    return ok ? 0 : 1;
}
"""

USE_CPP = r"""#include <cstdio>
#include <specrpc/engine.hpp>
int main() {
    specrpc::EngineParams p;
    p.target.path = "/no/such/model.gguf";
    auto e = specrpc::Engine::create(p);
    std::printf("%s\n", e ? "loaded?" : e.status().message().c_str());
    return !e && e.status().code() == specrpc::ErrorCode::LOAD_FAILED ? 0 : 1;
}
"""


class InstallTest(unittest.TestCase):
    def test_find_package_and_build_a_consumer(self):
        if is_asan_build(BIN):
            self.skipTest("sanitizer build: the consumer is not instrumented")
        cmake = shutil.which("cmake")
        if not cmake:
            self.skipTest("no cmake")
        with tempfile.TemporaryDirectory() as tmp:
            prefix = os.path.join(tmp, "prefix")
            src = os.path.join(tmp, "consumer")
            os.makedirs(src)
            r = subprocess.run([cmake, "--install", BUILD, "--prefix", prefix], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for rel in ("include/specrpc/specrpc.h", "include/specrpc/rpcserver.h", "include/specrpc/engine.hpp",
                        "lib/libspecrpc.so", "lib/librpcserver.so", "lib/libspecrpc_engine.a", "bin/specrpc",
                        "lib/libspecrpc_tool.so", "lib/libspecrpc_serve.so", "lib/cmake/specrpc/specrpcConfig.cmake"):
                self.assertTrue(os.path.exists(os.path.join(prefix, rel)), rel)
            # the installed launcher loads the installed tool (from ../lib), which runs
            env = dict(os.environ, SPECRPC_CACHE_DIR="off")
            tool = os.path.join(prefix, "bin", "specrpc")
            r = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
            self.assertEqual((r.returncode, r.stdout.split()[0]), (0, "specrpc"), r.stderr)
            r = subprocess.run([tool, "generate", "-m", TARGET, "-p", "Once upon a time", "-n", "8", "--temp", "0",
                                "--log-level", "error"], capture_output=True, text=True, timeout=120,
                               env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith("Once upon a time") and len(r.stdout) > 16, r.stdout)
            # `serve` runs from its own library (libspecrpc_serve.so): one call over stdio, then end of input
            call = {"jsonrpc": "2.0", "id": 1, "method": "completion",
                    "params": {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0}}
            r = subprocess.run([tool, "serve", "--stdio", "-m", TARGET, "--log-level", "error"], input=json.dumps(call) + "\n",
                               capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            answers = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            self.assertEqual([a["result"]["tokens_predicted"] for a in answers if a.get("id") == 1], [4], r.stdout)
            for name, text in (("CMakeLists.txt", CMAKELISTS), ("use_c.c", USE_C), ("use_legacy.c", USE_LEGACY),
                               ("use_cpp.cpp", USE_CPP)):
                with open(os.path.join(src, name), "w") as f:
                    f.write(text)
            out = os.path.join(tmp, "build")
            try:
                r = subprocess.run([cmake, "-S", src, "-B", out, "-DCMAKE_PREFIX_PATH=" + prefix,
                                    "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True,
                                   timeout=CONSUMER_TIMEOUT)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                r = subprocess.run([cmake, "--build", out, "-j2"], capture_output=True, text=True,
                                   timeout=CONSUMER_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.skipTest("the consumer's build took longer than %d s" % CONSUMER_TIMEOUT)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for exe in ("use_c", "use_legacy", "use_cpp"):
                r = subprocess.run([os.path.join(out, exe)], capture_output=True, text=True, timeout=60, env=env)
                self.assertEqual(r.returncode, 0, exe + ": " + r.stdout + r.stderr)
            # the package names the installed libraries, not this build tree's
            with open(os.path.join(prefix, "lib", "cmake", "specrpc", "specrpcTargets.cmake")) as f:
                self.assertNotIn(BUILD, f.read())


if __name__ == "__main__":
    unittest.main()
