// The router role of `specrpc serve` started without a model (llama-server's "router mode", which
// its test suite and UI probe with GET /props). llama-server's router spawns one child server per
// model and forwards requests to it; specrpc serves one engine per process and does NOT route:
// this role only answers what a router answers before any model runs.
//
//   health           {"status": "ok"} (the server is up; there is nothing to load)
//   props            {"role": "router", "max_instances", "models_autoload", "build_info", ...}
//   v1/models        the GGUF models found in --models-dir (status "unloaded"), else none
//   every other method that needs a model: llama-server's errors for a missing or unknown
//                    "model" (400); a model that --models-dir holds gets 501 naming the command
//                    line that serves it (`specrpc serve -m PATH`), as multi-model routing is not
//                    supported. init/deinit stay as registered (refused over HTTP by default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/jsonrpc.h"

namespace specrpc::server {

struct RouterOptions {
    std::string models_dir;             // scanned for models; empty = none listed
    int32_t     models_max = 4;         // reported as max_instances (llama-server's default, 0 = unlimited)
    bool        models_autoload = true; // reported as models_autoload (--no-models-autoload: false)
};

// A model found in --models-dir: a top-level NAME.gguf, or a directory NAME holding a .gguf
// (mmproj files are skipped), as llama-server's router lists them.
struct RouterModel {
    std::string name;
    std::string path;
};

// The models under `dir`, sorted by name; empty when `dir` is empty or unreadable.
std::vector<RouterModel> scan_models_dir(const std::string & dir);

// Replaces, in `d`, health, props, v1/models and every method that needs a model with the
// router's answers (see above). Call after Service::register_methods.
void install_router(rpc::Dispatcher & d, const RouterOptions & options);

}  // namespace specrpc::server
