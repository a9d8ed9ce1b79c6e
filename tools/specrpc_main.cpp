// specrpc: generate | serve | lookup. Logs and progress go to stderr, data to stdout. This is the
// entry of libspecrpc_tool.so, which the `specrpc` launcher loads (tools/launcher/specrpc.c) for
// every command but `serve` (libspecrpc_serve.so, tools/serve_main.cpp).
#include <cstdio>
#include <cstring>
#include <string>

#include "tools.h"

static void usage() {
    std::fprintf(stderr,
                 "usage: specrpc <command> [flags]   (specrpc <command> --help for the flags)\n"
                 "  generate   complete a prompt (speculative decoding with -md / --spec-type)\n"
                 "  serve      JSON-RPC 2.0 server: HTTP (default 127.0.0.1:8080) or --stdio\n"
                 "  lookup     n-gram caches: create | merge | stats\n");
}

extern "C" __attribute__((visibility("default"))) int specrpc_tool_main(int argc, char ** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    std::string cmd = argv[1];
    if (cmd == "--version") { std::printf("specrpc %s\n", SPECRPC_VERSION); return 0; }
    if (cmd == "generate") return specrpc::cli::cmd_generate(argc - 1, argv + 1);
    if (cmd == "serve") {  // the launcher loads libspecrpc_serve.so for it
        std::fprintf(stderr, "'serve' is in libspecrpc_serve.so; run it through the specrpc executable\n");
        return 1;
    }
    if (cmd == "lookup") return specrpc::cli::cmd_lookup(argc - 1, argv + 1);
    std::fprintf(stderr, "unknown command '%s'\n", cmd.c_str());
    usage();
    return 1;
}
