// The server's options, one table for every way they arrive: `specrpc serve`'s command line (and
// `generate`'s), their environment variables, and the `init` method's command line or JSON object.
// Each row names its JSON key, command-line flags, environment variables, type, limits, where it
// is accepted, the setter into a ServerConfig and its help text; the default is whatever the
// options structs hold (read back through the setter's field for --help). Adding an option is one
// row in server_options.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/service.h"

namespace specrpc::server {

// draft_flash_attn until finalize_server_config: as the target's unless given (-fa sets both, as
// llama-server's).
inline constexpr int32_t kDraftFlashAttnAsTarget = -2;

// What `specrpc serve` alone is told: listener, keys, threads, stdio. Defaults are the ones
// --help shows.
struct ServeSettings {
    std::string              host = "127.0.0.1";
    int32_t                  port = 8080;
    std::vector<std::string> api_keys;
    std::string              api_key_file;
    bool                     stdio = false;
    int32_t                  timeout_s = 600;
    int32_t                  drain_timeout_s = 30;  // SIGTERM: running requests may finish for this long
    int32_t                  threads_http = 0;      // 0 = max(8, 2 * parallel + 4)
    int32_t                  threads_http_max = 0;  // 0 = threads_http + 2 * (parallel + queue_max) + 16
    std::vector<std::string> allowed_hosts;         // Host names accepted besides the loopback ones
    int32_t                  stdio_workers = 0;     // 0 = max(4, 2 * parallel)
    std::string              allow_model_load;      // directory `init` may load from over HTTP
    int32_t                  sse_keepalive_ms = 0;
    std::vector<std::string> cors_origins;          // empty = the local origins (HttpOptions' default)
    // Without -m (and without --stdio / --allow-model-load) serve takes llama-server's router
    // role (server/router.h): these three are what it reports and lists.
    std::string              models_dir;
    int32_t                  models_max = 4;        // llama-server's default
    bool                     models_autoload = true;
    std::vector<std::string> tools;                 // llama-server's built-in agent tools: not provided
    std::string              chat_template_file;
    std::string              cache_type_k = "f16", cache_type_v = "f16";
};

// Everything the options table sets: the load config (what `init` takes too), serve's own
// settings, and what the command-line tools read before loading.
struct ServerConfig : LoadConfig {
    ServerConfig() { engine.draft_flash_attn = kDraftFlashAttnAsTarget; }
    ServeSettings serve;
    std::string   log_level = "info";  // debug|info|warn|error|none
    std::string   grammar_file;        // read into sampling.grammar by finalize_server_config
    // llama-server flags accepted for drop-in use and ignored, because ignoring them changes no
    // answer: we never download (--offline), /metrics is always on, the web UI does not exist
    // here, batching is always continuous and the KV cache layout is ours.
    json          ignored;
};

enum class OptType {
    STR,
    INT,         // integer in [lo, hi]
    FLOAT,       // finite number in [lo, hi]
    BOOL,        // a flag on the command line (a "!--no-x" spelling sets false); JSON true/false
    CHOICE,      // one of `choices`
    LIST,        // strings: a comma list or repeated on the command line; JSON: a string or an array
    FLOAT_LIST,  // numbers, as LIST
    IGNORED,     // accepted (with a value unless `flag_only`) and ignored
};

// Where an option is accepted.
enum OptWhere : unsigned {
    IN_INIT  = 1,  // the `init` method (command line and JSON keys)
    IN_SERVE = 2,  // `specrpc serve`
    IN_TOOLS = 4,  // `specrpc generate` (the model, sampling and speculation flags)
    IGNORED_IN_INIT = 8,  // a serve option `init` accepts and ignores (--host, --port, ...)
    IN_CLI   = IN_SERVE | IN_TOOLS,
    IN_ALL   = IN_INIT | IN_SERVE | IN_TOOLS,
};


struct ServerOption {
    const char *              key;        // JSON key (init); names the option in errors
    std::vector<const char *> flags;      // command-line spellings; "!--no-x" sets a BOOL false
    const char *              env;        // SPECRPC_* variable (serve), or nullptr
    const char *              llama_env;  // llama-server's LLAMA_* name, read when `env` is unset
    OptType                   type;
    double                    lo, hi;     // INT/FLOAT limits, inclusive
    unsigned                  where;      // OptWhere bits
    // Stores a checked value (json of the row's type: string, integer, number, bool, array).
    void (*set)(ServerConfig & c, const json & v);
    // The current value (for --help's default); null = none shown.
    json (*get)(const ServerConfig & c);
    const char *              doc;
    std::vector<const char *> aliases = {};  // other accepted JSON keys
    std::vector<const char *> choices = {};  // CHOICE
    bool                      flag_only = false;  // IGNORED: takes no value
};

const std::vector<ServerOption> & server_options();

// The row with this command-line spelling / JSON key (or alias); nullptr if none.
const ServerOption * find_option_flag(const std::string & flag);
const ServerOption * find_option_key(const std::string & key);

// A command-line value (text) as the row's JSON value; INVALID_ARGUMENT naming `flag` when it is
// not a number where one is needed.
Result<json> option_value_from_text(const ServerOption & o, const std::string & flag, const std::string & text);
// Checks a JSON value against the row (type, limits, choices) and stores it; INVALID_ARGUMENT
// naming `name` (the key or flag it came from).
Status option_apply(const ServerOption & o, const std::string & name, const json & v, ServerConfig & c);

// After all options are set: the spec-type list resolved (once, with "draft needs -md" checked
// once), the total context split over the slots (llama-server's -c), the draft's flash attention
// and GPU layers following the target's unless given, the grammar file read.
Status finalize_server_config(ServerConfig & c);

}  // namespace specrpc::server
