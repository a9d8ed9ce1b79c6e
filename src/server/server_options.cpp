// The server's options table (see server_options.h) and the checks every value goes through,
// whichever way it came.
#include "server/server_options.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace specrpc::server {

namespace {

void put(std::string & f, const json & v) { f = v.get<std::string>(); }
void put(int32_t & f, const json & v) { f = v.get<int32_t>(); }
void put(uint32_t & f, const json & v) { f = v.get<uint32_t>(); }
void put(float & f, const json & v) { f = v.get<float>(); }
void put(bool & f, const json & v) { f = v.get<bool>(); }
void put(std::vector<std::string> & f, const json & v) { f = v.get<std::vector<std::string>>(); }
void put(std::vector<float> & f, const json & v) { f = v.get<std::vector<float>>(); }

constexpr double kI32Min = INT32_MIN, kI32Max = INT32_MAX;  // "any int32": no limit of ours
constexpr double kAny    = 1e300;

const std::vector<const char *> kOnOffAuto = {"on", "off", "auto"};
const std::vector<const char *> kReasoning = {"on", "off", "auto"};
const std::vector<const char *> kReasoningFormats = {"none", "auto", "deepseek", "deepseek-legacy"};
const std::vector<const char *> kPoolings  = {"none", "mean", "cls", "last", "rank"};
const std::vector<const char *> kKvTypes   = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};

int32_t on_off_auto(const json & v) { return v == "on" ? 1 : v == "off" ? 0 : -1; }
json    on_off_auto_name(int32_t x) { return x > 0 ? "on" : x == 0 ? "off" : "auto"; }

// A row's setter and getter for one field of ServerConfig (c.<path>).
#define FIELD(path) [](ServerConfig & c, const json & v) { put(c.path, v); }, [](const ServerConfig & c) { return json(c.path); }
#define NO_FIELD    [](ServerConfig &, const json &) {}, nullptr

constexpr unsigned SERVE_INIT      = IN_SERVE | IN_INIT;

}  // namespace

// One row per option; the `init` method takes the IN_INIT rows, `specrpc serve` the IN_SERVE
// rows, `specrpc generate` the IN_TOOLS rows.
const std::vector<ServerOption> & server_options() {
    using enum OptType;
    static const std::vector<ServerOption> rows = {
        // models and the engine
        {"model", {"-m", "--model"}, "SPECRPC_MODEL", "LLAMA_ARG_MODEL", STR, 0, 0, IN_ALL, FIELD(engine.target.path), "target model (GGUF)"},
        {"model_draft", {"-md", "--model-draft"}, "SPECRPC_MODEL_DRAFT", "LLAMA_ARG_MODEL_DRAFT", STR, 0, 0, IN_ALL, FIELD(engine.draft.path), "draft model (GGUF), alias -md"},
        {"ctx_size", {"-c", "--ctx-size"}, "SPECRPC_CTX_SIZE", "LLAMA_ARG_CTX_SIZE", INT, 0, 1 << 20, IN_ALL, FIELD(engine.n_ctx), "context size, 0 = model's training context (serve: the total, split over the slots, as llama-server)", {"n_ctx"}},
        {"batch_size", {"-b", "--batch-size"}, "SPECRPC_BATCH_SIZE", "LLAMA_ARG_BATCH", INT, 1, 1 << 16, IN_ALL, FIELD(engine.n_batch), "max tokens per prompt pass (verification passes may use up to 17)", {"n_batch"}},
        {"threads", {"-t", "--threads"}, "SPECRPC_THREADS", "LLAMA_ARG_THREADS", INT, 0, 1024, IN_ALL, FIELD(engine.n_threads), "threads, 0 = all cores", {"n_threads"}},
        {"parallel", {"-np", "--parallel"}, "SPECRPC_PARALLEL", "LLAMA_ARG_N_PARALLEL", INT, 1, 64, SERVE_INIT, FIELD(engine.n_parallel), "slots: requests generated at once, alias -np", {"n_parallel"}},
        {"n_gpu_layers", {"-ngl", "--n-gpu-layers", "--gpu-layers"}, "SPECRPC_N_GPU_LAYERS", "LLAMA_ARG_N_GPU_LAYERS", INT, -1, 1 << 16, IN_ALL,
         [](ServerConfig & c, const json & v) { c.engine.target.n_gpu_layers = c.engine.draft.n_gpu_layers = v.get<int32_t>(); },
         [](const ServerConfig & c) { return json(c.engine.target.n_gpu_layers); }, "layers offloaded to the GPU, alias -ngl; auto or all = -1 (all)"},
        {"no_mmap", {"--no-mmap"}, "SPECRPC_NO_MMAP", "LLAMA_ARG_NO_MMAP", BOOL, 0, 0, IN_ALL,
         [](ServerConfig & c, const json & v) { c.engine.target.use_mmap = c.engine.draft.use_mmap = !v.get<bool>(); }, nullptr, "do not memory-map the model"},
        {"use_mmap", {}, nullptr, nullptr, BOOL, 0, 0, IN_INIT,
         [](ServerConfig & c, const json & v) { c.engine.target.use_mmap = c.engine.draft.use_mmap = v.get<bool>(); }, nullptr, "memory-map the models"},
        {"kv_f32", {"--kv-f32"}, "SPECRPC_KV_F32", nullptr, BOOL, 0, 0, IN_ALL, FIELD(engine.kv_f32), "F32 KV cache (bit-stable logits)"},
        {"flash_attn", {"-fa", "--flash-attn"}, "SPECRPC_FLASH_ATTN", "LLAMA_ARG_FLASH_ATTN", CHOICE, 0, 0, IN_ALL,
         [](ServerConfig & c, const json & v) { c.engine.flash_attn = on_off_auto(v); },
         [](const ServerConfig & c) { return on_off_auto_name(c.engine.flash_attn); },
         "flash attention on|off|auto, alias -fa (auto: on for attention heads of 32 or more)", {}, kOnOffAuto},
        {"draft_flash_attn", {"-fad", "--flash-attn-draft"}, "SPECRPC_FLASH_ATTN_DRAFT", nullptr, CHOICE, 0, 0, IN_ALL,
         [](ServerConfig & c, const json & v) { c.engine.draft_flash_attn = on_off_auto(v); }, nullptr,
         "flash attention for the draft model, alias -fad (default: as --flash-attn)", {}, kOnOffAuto},
        {"queue_max", {"--queue-max"}, "SPECRPC_QUEUE_MAX", nullptr, INT, 0, 1 << 16, SERVE_INIT, FIELD(engine.n_queue_max), "requests waiting for a slot; more get -32005 / HTTP 503", {"n_queue_max"}},
        {"tree_max", {"--tree-max"}, nullptr, nullptr, INT, 1, 16, IN_ALL, FIELD(engine.n_tree_max), "draft-tree branches reserved per slot (KV sequences); 1 = chains and a non-unified KV cache when -np 1", {"n_tree_max"}},
        {"suffix_cache_max_mb", {"--suffix-cache-max-mb"}, nullptr, nullptr, INT, 0, 1 << 20, IN_ALL, FIELD(engine.suffix_cache_max_mb), "memory cap of the suffix drafter's store of recent responses in MiB (oldest evicted first; 0 = none kept)"},
        {"lookup_cache_max_mb", {"--lookup-cache-max-mb"}, nullptr, nullptr, INT, 0, 1 << 20, IN_ALL, FIELD(engine.ngram_cache_max_mb), "memory cap of the dynamic n-gram cache in MiB (~100 bytes per n-gram; rare ones are evicted first; 0 = none kept)"},
        {"log_level", {"--log-level"}, "SPECRPC_LOG_LEVEL", nullptr, STR, 0, 0, IN_CLI, FIELD(log_level), "debug|info|warn|error|none"},

        // server-wide request defaults
        {"temp", {"--temp"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.temperature), "temperature; 0 = greedy"},
        {"top_k", {"--top-k"}, nullptr, nullptr, INT, kI32Min, kI32Max, IN_CLI, FIELD(sampling.top_k), "top-k, <= 0 = off"},
        {"top_p", {"--top-p"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.top_p), "top-p, 1 = off"},
        {"min_p", {"--min-p"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.min_p), "min-p, 0 = off"},
        {"typical", {"--typical"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.typical_p), "typical-p, 1 = off"},
        {"repeat_penalty", {"--repeat-penalty"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.repeat_penalty), "repetition penalty, 1 = off"},
        {"repeat_last_n", {"--repeat-last-n"}, nullptr, nullptr, INT, kI32Min, kI32Max, IN_CLI, FIELD(sampling.repeat_last_n), "tokens the penalties look at, -1 = context"},
        {"presence_penalty", {"--presence-penalty"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.presence_penalty), "presence penalty"},
        {"frequency_penalty", {"--frequency-penalty"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.frequency_penalty), "frequency penalty"},
        {"mirostat", {"--mirostat"}, nullptr, nullptr, INT, kI32Min, kI32Max, IN_CLI, FIELD(sampling.mirostat), "mirostat 0|1|2 (disables speculation)"},
        {"mirostat_ent", {"--mirostat-ent"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.mirostat_tau), "mirostat target entropy tau"},
        {"mirostat_lr", {"--mirostat-lr"}, nullptr, nullptr, FLOAT, -kAny, kAny, IN_CLI, FIELD(sampling.mirostat_eta), "mirostat learning rate eta"},
        {"seed", {"-s", "--seed"}, nullptr, nullptr, INT, 0, 4294967295.0, IN_CLI | IGNORED_IN_INIT, FIELD(sampling.seed), "RNG seed, 4294967295 = random"},
        {"ignore_eos", {"--ignore-eos"}, nullptr, nullptr, BOOL, 0, 0, IN_CLI, FIELD(sampling.ignore_eos), "do not stop at end-of-sequence"},
        {"grammar", {"--grammar"}, nullptr, nullptr, STR, 0, 0, IN_CLI, FIELD(sampling.grammar), "GBNF grammar"},
        {"grammar_file", {"--grammar-file"}, nullptr, nullptr, STR, 0, 0, IN_CLI, FIELD(grammar_file), "file with a GBNF grammar"},
        {"n_probs", {"--n-probs"}, nullptr, nullptr, INT, kI32Min, kI32Max, IN_CLI, FIELD(sampling.n_probs), "top-n probabilities per token"},
        {"n_predict", {"-n", "--n-predict"}, nullptr, nullptr, INT, kI32Min, kI32Max, IN_SERVE, FIELD(n_predict), "default max tokens per request, -1 = until EOS / context end"},
        {"context_shift", {"--context-shift"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE, FIELD(context_shift), "default: on context overflow drop old tokens instead of stopping"},

        // speculation
        {"spec_type", {"--spec-type"}, "SPECRPC_SPEC_TYPE", "LLAMA_ARG_SPEC_TYPE", LIST, 0, 0, IN_ALL,
         [](ServerConfig & c, const json & v) {
             c.spec_types.clear();
             for (const json & n : v) {
                 if (!c.spec_types.empty()) c.spec_types += ',';
                 c.spec_types += n.get<std::string>();
             }
             if (c.spec_types.empty()) c.spec_types = "none";
         },
         [](const ServerConfig & c) { return json(c.spec_types); }, "drafters tried in order: draft,ngram,lookup,suffix,synth,none (auto: draft if -md)"},
        {"draft_max", {"--draft-max", "--draft-n", "--spec-draft-n-max"}, "SPECRPC_DRAFT_MAX", "LLAMA_ARG_DRAFT_MAX", INT, 0, SpecParams::kMaxDraft, IN_ALL, FIELD(spec.n_max), "max draft length", {"n_draft"}},
        {"draft_min", {"--draft-min", "--spec-draft-n-min"}, "SPECRPC_DRAFT_MIN", "LLAMA_ARG_DRAFT_MIN", INT, 0, SpecParams::kMaxDraft, IN_ALL, FIELD(spec.n_min), "min draft length"},
        {"draft_p_min", {"--draft-p-min", "--spec-draft-p-min"}, "SPECRPC_DRAFT_P_MIN", "LLAMA_ARG_DRAFT_P_MIN", FLOAT, -1, 1, IN_ALL, FIELD(spec.p_min), "stop drafting below this draft probability; -1 = greedy drafts stop where their confidence says the next token will not pay, sampled ones never"},
        {"draft_p_split", {"--draft-p-split"}, "SPECRPC_DRAFT_P_SPLIT", nullptr, FLOAT, 0, 1, IN_ALL, FIELD(spec.p_split), "tree: branch where a further candidate's p exceeds this"},
        {"draft_branches", {"--draft-branches"}, "SPECRPC_DRAFT_BRANCHES", nullptr, INT, 1, 16, IN_ALL, FIELD(spec.n_parallel), "tree: max branches per slot (1 = chain)"},
        {"no_adaptive", {"--no-adaptive"}, nullptr, nullptr, BOOL, 0, 0, IN_ALL,
         [](ServerConfig & c, const json & v) { c.spec.adaptive = !v.get<bool>(); }, nullptr, "fixed draft length (n_max) instead of the cost-model choice"},
        {"adaptive", {}, nullptr, nullptr, BOOL, 0, 0, IN_INIT, FIELD(spec.adaptive), "the cost-model choice of the draft length"},
        {"sample_and_compare", {"--sample-and-compare"}, nullptr, nullptr, BOOL, 0, 0, IN_ALL, FIELD(spec.sample_and_compare), "T>0: greedy draft verified one-hot (llama.cpp's way)"},
        {"spec_verifier", {"--spec-verifier"}, nullptr, nullptr, INT, 0, 3, IN_CLI,
         [](ServerConfig & c, const json & v) { c.spec.verifier = static_cast<SpecVerifier>(v.get<int>()); }, nullptr,
         "T>0: 0 auto (coupled if --seed, else block), 1 token-wise, 2 block, 3 coupled"},
        {"ngram_min", {"--ngram-min"}, "SPECRPC_NGRAM_MIN", nullptr, INT, 1, 4, IN_ALL, FIELD(spec.ngram_min), "shortest n-gram / lookup match"},
        {"ngram_max", {"--ngram-max"}, "SPECRPC_NGRAM_MAX", nullptr, INT, 1, 4, IN_ALL, FIELD(spec.ngram_max), "longest n-gram / lookup match"},
        {"spec_synth_rates", {"--spec-synth-rates"}, nullptr, nullptr, FLOAT_LIST, 0, 1, IN_CLI, FIELD(spec.synth_rates), "synthetic drafter: per-position acceptance (tests/benchmarks)"},
        {"lookup_cache_static", {"-lcs", "--lookup-cache-static"}, "SPECRPC_LOOKUP_CACHE_STATIC", "LLAMA_ARG_LOOKUP_CACHE_STATIC", STR, 0, 0, IN_ALL, FIELD(lookup_static), "static n-gram cache file, alias -lcs"},
        {"lookup_cache_dynamic", {"-lcd", "--lookup-cache-dynamic"}, "SPECRPC_LOOKUP_CACHE_DYNAMIC", "LLAMA_ARG_LOOKUP_CACHE_DYNAMIC", STR, 0, 0, IN_ALL, FIELD(lookup_dynamic), "dynamic n-gram cache file, alias -lcd"},

        // what clients see of the model
        {"model_alias", {"-a", "--alias"}, "SPECRPC_ALIAS", "LLAMA_ARG_ALIAS", STR, 0, 0, SERVE_INIT, FIELD(model_alias), "model name reported to clients (default: the file name)", {"alias"}},
        {"chat_template", {"--chat-template"}, "SPECRPC_CHAT_TEMPLATE", "LLAMA_ARG_CHAT_TEMPLATE", STR, 0, 0, SERVE_INIT, FIELD(chat_template),
         "chat template for v1/chat/completions: a llama.cpp built-in name (chatml, llama2, ...) or template text; default: the model's own"},
        {"chat_template_file", {"--chat-template-file"}, nullptr, nullptr, STR, 0, 0, IN_SERVE, FIELD(serve.chat_template_file), "file with the chat template (as --chat-template)"},
        {"jinja", {"--jinja", "!--no-jinja"}, "SPECRPC_JINJA", "LLAMA_ARG_JINJA", BOOL, 0, 0, SERVE_INIT, FIELD(jinja),
         "render chat templates with llama.cpp's Jinja engine (default on); --no-jinja: llama.cpp's built-in templates only"},
        {"reasoning", {"-rea", "--reasoning"}, "SPECRPC_REASONING", "LLAMA_ARG_REASONING", CHOICE, 0, 0, SERVE_INIT, FIELD(reasoning),
         "reasoning/thinking in chat templates that have it: on, off, or auto (the template's default)", {}, kReasoning},
        {"reasoning_format", {"--reasoning-format"}, "SPECRPC_REASONING_FORMAT", "LLAMA_ARG_THINK", CHOICE, 0, 0, SERVE_INIT, FIELD(reasoning_format),
         "how chat output's reasoning is returned: none (in content), auto, deepseek, deepseek-legacy", {}, kReasoningFormats},
        {"tags", {"--tags"}, nullptr, nullptr, STR, 0, 0, IN_SERVE, FIELD(model_tags), "comma list of tags reported by /v1/models"},
        {"slots", {"--slots", "!--no-slots"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE | IGNORED_IN_INIT, FIELD(slots_endpoint), "GET /slots (the `slots` method); --no-slots: 501"},
        {"kv_unified", {"--kv-unified", "!--no-kv-unified"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE, FIELD(kv_unified),
         "every slot may use the whole -c (llama-server's unified KV cache; memory for -c x slots)"},
        {"cache_type_k", {"-ctk", "--cache-type-k"}, nullptr, nullptr, CHOICE, 0, 0, IN_SERVE, FIELD(serve.cache_type_k),
         "KV cache type K, alias -ctk: f32 = --kv-f32; other types are accepted and stored as f16", {}, kKvTypes},
        {"cache_type_v", {"-ctv", "--cache-type-v"}, nullptr, nullptr, CHOICE, 0, 0, IN_SERVE, FIELD(serve.cache_type_v), "KV cache type V, alias -ctv (as --cache-type-k)", {}, kKvTypes},
        {"metrics", {"--metrics"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE | IGNORED_IN_INIT, FIELD(metrics_endpoint),
         "GET /metrics (Prometheus); without it 501, as llama-server (the `metrics` RPC method is always on)"},
        {"embedding", {"--embedding", "--embeddings"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE, FIELD(embedding),
         "serve /embeddings and /v1/embeddings (a pooled context beside the engine)"},
        {"reranking", {"--reranking", "--rerank"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE, FIELD(reranking), "serve /rerank (pooling rank)"},
        {"pooling", {"--pooling"}, nullptr, nullptr, CHOICE, 0, 0, IN_SERVE, FIELD(pooling),
         "embedding pooling: none|mean|cls|last|rank (default: the model's)", {}, kPoolings},
        {"slot_save_path", {"--slot-save-path"}, "SPECRPC_SLOT_SAVE_PATH", "LLAMA_ARG_SLOT_SAVE_PATH", STR, 0, 0, IN_SERVE, FIELD(slot_save_path),
         "directory for POST /slots/ID?action=save|restore (file names only, no paths); empty = the slot actions answer 501"},
        {"sleep_idle_seconds", {"--sleep-idle-seconds"}, "SPECRPC_SLEEP_IDLE_SECONDS", "LLAMA_ARG_SLEEP_IDLE_SECONDS", INT, -1, kI32Max, SERVE_INIT,
         FIELD(engine.sleep_idle_seconds), "free the models after this many idle seconds, load them again on the next request; <= 0 = never"},
        {"verbose", {"--verbose"}, nullptr, nullptr, BOOL, 0, 0, IN_SERVE | IGNORED_IN_INIT,
         [](ServerConfig & c, const json & v) { if (v.get<bool>()) c.log_level = "debug"; }, nullptr, "as --log-level debug"},

        // serve's transports
        {"host", {"--host"}, "SPECRPC_HOST", "LLAMA_ARG_HOST", STR, 0, 0, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.host), "address to listen on; a comma list (127.0.0.1,::1) listens on each, on the same port"},
        {"port", {"--port"}, "SPECRPC_PORT", "LLAMA_ARG_PORT", INT, kI32Min, kI32Max, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.port), "port to listen on; 0 = any free port (printed on stderr)"},
        {"api_key", {"--api-key"}, "SPECRPC_API_KEY", "LLAMA_API_KEY", LIST, 0, 0, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.api_keys), "API key clients must send (Authorization: Bearer KEY); repeatable"},
        {"api_key_file", {"--api-key-file"}, "SPECRPC_API_KEY_FILE", "LLAMA_ARG_API_KEY_FILE", STR, 0, 0, IN_SERVE, FIELD(serve.api_key_file), "file with one API key per line"},
        {"stdio", {"--stdio"}, "SPECRPC_STDIO", nullptr, BOOL, 0, 0, IN_SERVE, FIELD(serve.stdio), "serve JSON-RPC on stdin/stdout instead of HTTP"},
        {"stdio_workers", {"--stdio-workers"}, "SPECRPC_STDIO_WORKERS", nullptr, INT, kI32Min, kI32Max, IN_SERVE, FIELD(serve.stdio_workers), "stdio: calls run at once, 0 = max(4, 2 x parallel)"},
        {"timeout", {"--timeout"}, "SPECRPC_TIMEOUT", "LLAMA_ARG_TIMEOUT", INT, kI32Min, kI32Max, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.timeout_s),
         "HTTP write timeout in seconds (a request's head must arrive within 10 s, its body within 10 s plus 1 s per 32 KiB)"},
        {"drain_timeout", {"--drain-timeout"}, "SPECRPC_DRAIN_TIMEOUT", nullptr, INT, 0, kI32Max, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.drain_timeout_s),
         "SIGTERM: seconds running requests may take to finish while new ones (and /health) get 503; 0 = cancel them at once (as SIGINT)"},
        {"rpc", {"--rpc"}, "SPECRPC_RPC", "LLAMA_ARG_RPC", LIST, 0, 0, IN_ALL, FIELD(engine.target.rpc_servers),
         "llama.cpp rpc-server workers HOST:PORT[,HOST:PORT...] the target's layers are split over (-ngl then counts the layers sent, 0 = all); the draft stays local", {"rpc_servers"}},
        {"threads_http", {"--threads-http"}, "SPECRPC_THREADS_HTTP", "LLAMA_ARG_THREADS_HTTP", INT, kI32Min, kI32Max, IN_SERVE | IGNORED_IN_INIT, FIELD(serve.threads_http), "HTTP connection threads kept, 0 = max(8, 2 x parallel + 4)"},
        {"threads_http_max", {"--threads-http-max"}, "SPECRPC_THREADS_HTTP_MAX", nullptr, INT, kI32Min, kI32Max, IN_SERVE, FIELD(serve.threads_http_max),
         "HTTP connection threads started on demand at most (each serves one request; when all are busy a request gets 503 with Retry-After), 0 = threads-http + 2 x (parallel + queue-max) + 16"},
        {"allowed_hosts", {"--allowed-hosts"}, "SPECRPC_ALLOWED_HOSTS", nullptr, LIST, 0, 0, IN_SERVE, FIELD(serve.allowed_hosts),
         "Host header names accepted besides localhost, 127.0.0.1, [::1] and --host (any port); repeatable or comma-separated; * = any. Other Host names get 403 (DNS rebinding)"},
        {"allow_model_load", {"--allow-model-load"}, "SPECRPC_ALLOW_MODEL_LOAD", nullptr, STR, 0, 0, IN_SERVE, FIELD(serve.allow_model_load), "allow the `init`/`deinit` methods over HTTP, for model files inside DIR only"},
        {"sse_keepalive_ms", {"--sse-keepalive-ms"}, "SPECRPC_SSE_KEEPALIVE_MS", nullptr, INT, kI32Min, kI32Max, IN_SERVE, FIELD(serve.sse_keepalive_ms), "SSE: comment event after this much silence, 0 = off"},
        {"cors_origin", {"--cors-origin", "--cors-origins"}, "SPECRPC_CORS_ORIGINS", nullptr, LIST, 0, 0, IN_SERVE, FIELD(serve.cors_origins),
         "browser origin allowed to call the server (e.g. https://app.example:8443; without a port any port; localhost = http(s)://localhost, 127.0.0.1 or [::1] with any port; * = any); repeatable or comma-separated; default: localhost only (llama-server's default is *). Requests with another Origin get 403, their preflight no Access-Control-* headers"},

        // llama-server's router role (no -m): see server/router.h
        {"models_dir", {"--models-dir"}, "SPECRPC_SERVE_MODELS_DIR", "LLAMA_ARG_MODELS_DIR", STR, 0, 0, IN_SERVE, FIELD(serve.models_dir),
         "without -m: the directory whose GGUF models /v1/models lists (router role; requests for them get 501: one model per process, start serve with -m)"},
        {"models_max", {"--models-max"}, "SPECRPC_MODELS_MAX", "LLAMA_ARG_MODELS_MAX", INT, 0, kI32Max, IN_SERVE, FIELD(serve.models_max),
         "without -m: max_instances reported by /props (llama-server's router; no models are loaded here)"},
        {"models_autoload", {"--models-autoload", "!--no-models-autoload"}, "SPECRPC_MODELS_AUTOLOAD", "LLAMA_ARG_MODELS_AUTOLOAD", BOOL, 0, 0, IN_SERVE, FIELD(serve.models_autoload),
         "without -m: models_autoload reported by /props; off: a request for a listed model gets llama-server's 400 \"model is not loaded\""},
        {"tools", {"--tools"}, "SPECRPC_TOOLS", "LLAMA_ARG_TOOLS", LIST, 0, 0, IN_SERVE, FIELD(serve.tools),
         "llama-server's built-in agent tools (shell, files): accepted, NOT provided (a warning on stderr; /tools answers 501); CORS stays local"},

        // llama-server's flags that change no answer here: accepted and ignored
        {"ignored", {"--offline", "--no-cont-batching", "--no-ui", "--swa-full", "--no-cache-idle-slots", "--no-context-shift", "--no-warmup",
                     "--backend-sampling", "--backend_sampling"},
         nullptr, nullptr, IGNORED, 0, 0, IN_SERVE, NO_FIELD, "llama-server compatibility: accepted and ignored", {}, {}, true},
        {"ignored_both", {"-cb", "--cont-batching", "--no-webui"}, nullptr, nullptr, IGNORED, 0, 0, IN_SERVE | IGNORED_IN_INIT, NO_FIELD, "llama-server compatibility: accepted and ignored", {}, {}, true},
        {"ignored_value", {"-ub", "--ubatch-size", "--cache-ram", "--threads-batch", "--cache-reuse"},
         nullptr, nullptr, IGNORED, 0, 0, IN_SERVE, NO_FIELD, "llama-server compatibility: accepted and ignored"},
        {"ignored_init", {"-to", "--log-file"}, nullptr, nullptr, IGNORED, 0, 0, IGNORED_IN_INIT, NO_FIELD, "no use in an embedded engine"},
        {"ignored_init_flags", {"--log-disable", "--mlock", "-v"}, nullptr, nullptr, IGNORED, 0, 0, IGNORED_IN_INIT, NO_FIELD, "no use in an embedded engine", {}, {}, true},
    };
    return rows;
}

#undef FIELD
#undef NO_FIELD

const ServerOption * find_option_flag(const std::string & flag) {
    for (const auto & o : server_options())
        for (const char * f : o.flags)
            if (flag == (f[0] == '!' ? f + 1 : f)) return &o;
    return nullptr;
}

const ServerOption * find_option_key(const std::string & key) {
    for (const auto & o : server_options()) {
        if (o.type == OptType::IGNORED) continue;
        if (key == o.key) return &o;
        for (const char * a : o.aliases)
            if (key == a) return &o;
    }
    return nullptr;
}

Result<json> option_value_from_text(const ServerOption & o, const std::string & flag, const std::string & text) {
    switch (o.type) {
        case OptType::INT:
        case OptType::FLOAT: {
            // llama-server's -ngl auto|all: every layer
            if (std::string(o.key) == "n_gpu_layers" && (text == "auto" || text == "all")) return json(-1);
            char * end = nullptr;
            errno = 0;
            const double x = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || errno != 0)
                return invalid_arg("flag " + flag + " needs a number, got '" + text + "'", flag);
            return o.type == OptType::INT && x == std::floor(x) && std::fabs(x) < 9e15 ? json(static_cast<int64_t>(x)) : json(x);
        }
        case OptType::BOOL:
            return json(!(text == "0" || text == "false" || text == "off" || text == "no"));
        case OptType::LIST:
        case OptType::FLOAT_LIST: {
            json out = json::array();
            std::string cur;
            std::stringstream ss(text);
            while (std::getline(ss, cur, ',')) {
                if (o.type == OptType::LIST) {
                    out.push_back(cur);
                    continue;
                }
                ServerOption num = o;
                num.type = OptType::FLOAT;
                Result<json> x = option_value_from_text(num, flag, cur);
                if (!x) return x.status();
                out.push_back(x.value());
            }
            return out;
        }
        default:
            return json(text);
    }
}

Status option_apply(const ServerOption & o, const std::string & name, const json & v_in, ServerConfig & c) {
    json v = v_in;
    switch (o.type) {
        case OptType::IGNORED:
            return Status::ok();
        case OptType::STR:
            if (!v.is_string()) return invalid_arg(name + " must be a string", name);
            break;
        case OptType::CHOICE: {
            std::string names;
            bool        member = false;
            for (size_t i = 0; i < o.choices.size(); ++i) {
                names += (i == 0 ? "\"" : i + 1 == o.choices.size() ? " or \"" : ", \"") + std::string(o.choices[i]) + "\"";
                member |= v.is_string() && v.get<std::string>() == o.choices[i];
            }
            if (!member)
                return invalid_arg(name + " must be " + names + ", got '" + (v.is_string() ? v.get<std::string>() : v.dump()) + "'",
                                   name);
            break;
        }
        case OptType::LIST:
            if (v.is_string()) {
                json parts = json::array();
                std::stringstream ss(v.get<std::string>());
                for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
                v = parts;
            } else if (v.is_array()) {
                for (const json & n : v)
                    if (!n.is_string()) return invalid_arg(name + " must be a string or a list of strings", name);
            } else {
                return invalid_arg(name + " must be a string or a list of strings", name);
            }
            break;
        case OptType::FLOAT_LIST:
            if (!v.is_array()) return invalid_arg(name + " must be a list of numbers", name);
            for (const json & x : v)
                if (!x.is_number() || x.get<double>() < o.lo || x.get<double>() > o.hi)
                    return invalid_arg(name + " must hold numbers in [" + std::to_string(o.lo) + ", " + std::to_string(o.hi) + "]",
                                       name);
            break;
        case OptType::BOOL:
            if (!v.is_boolean()) return invalid_arg(name + " must be a boolean", name);
            break;
        case OptType::INT:
        case OptType::FLOAT: {
            if (!v.is_number()) return invalid_arg(name + " must be a number", name);
            const double x = v.get<double>();
            if (!std::isfinite(x) || (o.type == OptType::INT && x != std::floor(x)))
                return invalid_arg(name + " must be " + (o.type == OptType::INT ? "an integer" : "finite"), name);
            if (x < o.lo || x > o.hi)
                return invalid_arg(name + " = " + std::to_string(x) + " is out of range [" + std::to_string(o.lo) + ", " +
                                       std::to_string(o.hi) + "]",
                                   name);  // init's wording since before the table
            break;
        }
    }
    o.set(c, v);
    return Status::ok();
}

Status finalize_server_config(ServerConfig & c) {
    if (c.engine.draft_flash_attn == kDraftFlashAttnAsTarget) c.engine.draft_flash_attn = c.engine.flash_attn;
    if (!c.grammar_file.empty()) {
        std::ifstream f(c.grammar_file);
        if (!f) return invalid_arg("cannot read grammar file '" + c.grammar_file + "'", "grammar_file");
        std::stringstream ss;
        ss << f.rdbuf();
        c.sampling.grammar = ss.str();
    }
    return finalize_load_config(c);
}

}  // namespace specrpc::server
