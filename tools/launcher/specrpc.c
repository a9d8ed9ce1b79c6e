/* The `specrpc` executable: a launcher that loads the tool and runs it: libspecrpc_serve.so for
 * `serve`, libspecrpc_tool.so for every other command (tools/).
 *
 * Why a launcher: `generate` and `serve` execute themselves once more to start with huge pages
 * (huge_pages.c). An executable linked with the tool's libraries (llama.cpp, OpenSSL through
 * cpp-httplib, libstdc++) takes ~20 ms to load them, so an exec of it costs that twice. This one
 * needs only the C library: it executes itself again before the tool is loaded, once.
 * Why two libraries: only `serve` uses the HTTP transport, whose libraries (OpenSSL, zlib, brotli)
 * take ~9 ms to load, and llama.cpp's `common` (chat templates) ~3 ms more. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "huge_pages.h"

typedef int (*tool_main_fn)(int argc, char **argv);

int main(int argc, char **argv) {
    const char *cmd   = argc >= 2 ? argv[1] : "";
    const int   serve = strcmp(cmd, "serve") == 0;
    const char *lib   = serve ? "libspecrpc_serve.so" : "libspecrpc_tool.so";
    /* The two commands that load a model. */
    if (serve || strcmp(cmd, "generate") == 0) specrpc_reexec_with_huge_pages(argv);
    /* Beside this executable in the build tree, in ../lib installed; by path, because under ASan
     * dlopen is called from the sanitizer's interceptor, whose run path is not this executable's. */
    void *tool = NULL;
    char  self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n]     = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            const char *where[] = {"", "/../" SPECRPC_TOOL_LIBDIR};
            for (size_t i = 0; i < sizeof where / sizeof where[0] && !tool; ++i) {
                char path[PATH_MAX + 64];
                snprintf(path, sizeof path, "%s%s/%s", self, where[i], lib);
                if (access(path, F_OK) == 0) tool = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            }
        }
    }
    if (!tool) tool = dlopen(lib, RTLD_NOW | RTLD_LOCAL); /* the loader's search path */
    if (!tool) {
        fprintf(stderr, "specrpc: cannot load the tool: %s\n", dlerror());
        return 127;
    }
    tool_main_fn tool_main = (tool_main_fn) dlsym(tool, "specrpc_tool_main");
    if (!tool_main) {
        fprintf(stderr, "specrpc: %s\n", dlerror());
        return 127;
    }
    return tool_main(argc, argv);
}
