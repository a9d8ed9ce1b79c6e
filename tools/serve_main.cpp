// libspecrpc_serve.so's entry: the `specrpc` launcher loads this library for `specrpc serve` only,
// so the HTTP transport's libraries are loaded by the one command that uses them.
#include "tools.h"

extern "C" __attribute__((visibility("default"))) int specrpc_tool_main(int argc, char ** argv) {
    return specrpc::cli::cmd_serve(argc - 1, argv + 1);  // argv[1] is "serve"
}
