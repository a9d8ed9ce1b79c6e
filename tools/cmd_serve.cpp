// `specrpc serve`: the JSON-RPC 2.0 server. HTTP (POST /rpc plus llama-server's REST routes and
// SSE) on --host/--port, or JSON-RPC over stdin/stdout with --stdio. The listener starts before
// the models load, so `health` reports loading progress. SIGTERM drains first (new requests and
// /health get 503, running ones may finish within --drain-timeout), as a replica behind a load
// balancer must; SIGINT (or a second signal) does not wait. Then: stop accepting, cancel the calls
// in flight, save the dynamic n-gram cache.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "cli_common.h"
#include "common/heap.h"
#include "common/log.h"
#include "server/http_transport.h"
#include "server/service.h"
#include "server/stdio_transport.h"
#include "tools.h"

namespace specrpc::cli {

using nlohmann::json;

namespace {

struct ServeArgs {
    std::string              host = "127.0.0.1";
    int                      port = 8080;
    std::vector<std::string> api_keys;
    std::string              api_key_file;
    bool                     stdio = false;
    int                      timeout_s = 600;
    int                      drain_timeout_s = 30;  // SIGTERM: running requests may finish within this
    int                      threads_http = 0;   // 0 = max(8, 2 * parallel + 4)
    int                      threads_http_max = 0;  // 0 = threads_http + 2 * (parallel + queue_max) + 16
    std::vector<std::string> allowed_hosts;      // Host names accepted besides the loopback ones
    int                      stdio_workers = 0;  // 0 = max(4, 2 * parallel)
    std::string              alias;
    std::string              chat_template;
    std::string              allow_model_load;
    int                      sse_keepalive_ms = 0;
    std::vector<std::string> cors_origins;       // empty = the local origins (HttpOptions' default)
    std::string              chat_template_file;
    int32_t                  n_predict = -1;
    bool                     context_shift = false;
    bool                     kv_unified = false;
    bool                     slots = true;
    std::string              tags;
    std::string              cache_type_k = "f16", cache_type_v = "f16";
    // llama-server flags accepted for drop-in use and ignored, because ignoring them changes no
    // answer: we never download (--offline), /metrics and /slots are always on, the web UI and
    // idle-sleep do not exist here, batching is always continuous and the KV cache layout is ours.
    bool                     ignored_flag = false;
    std::string              ignored_value;
};

// Every option's environment variable: SPECRPC_* (shown by --help) and llama-server's name,
// copied into the SPECRPC_* one when only it is set.
const std::pair<const char *, std::pair<const char *, const char *>> kEnv[] = {
    {"--model", {"SPECRPC_MODEL", "LLAMA_ARG_MODEL"}},
    {"--model-draft", {"SPECRPC_MODEL_DRAFT", "LLAMA_ARG_MODEL_DRAFT"}},
    {"--ctx-size", {"SPECRPC_CTX_SIZE", "LLAMA_ARG_CTX_SIZE"}},
    {"--batch-size", {"SPECRPC_BATCH_SIZE", "LLAMA_ARG_BATCH"}},
    {"--threads", {"SPECRPC_THREADS", "LLAMA_ARG_THREADS"}},
    {"--n-gpu-layers", {"SPECRPC_N_GPU_LAYERS", "LLAMA_ARG_N_GPU_LAYERS"}},
    {"--no-mmap", {"SPECRPC_NO_MMAP", "LLAMA_ARG_NO_MMAP"}},
    {"--kv-f32", {"SPECRPC_KV_F32", nullptr}},
    {"--flash-attn", {"SPECRPC_FLASH_ATTN", "LLAMA_ARG_FLASH_ATTN"}},
    {"--flash-attn-draft", {"SPECRPC_FLASH_ATTN_DRAFT", nullptr}},
    {"--log-level", {"SPECRPC_LOG_LEVEL", nullptr}},
    {"--parallel", {"SPECRPC_PARALLEL", "LLAMA_ARG_N_PARALLEL"}},
    {"--queue-max", {"SPECRPC_QUEUE_MAX", nullptr}},
    {"--host", {"SPECRPC_HOST", "LLAMA_ARG_HOST"}},
    {"--port", {"SPECRPC_PORT", "LLAMA_ARG_PORT"}},
    {"--api-key", {"SPECRPC_API_KEY", "LLAMA_API_KEY"}},
    {"--api-key-file", {"SPECRPC_API_KEY_FILE", "LLAMA_ARG_API_KEY_FILE"}},
    {"--timeout", {"SPECRPC_TIMEOUT", "LLAMA_ARG_TIMEOUT"}},
    {"--drain-timeout", {"SPECRPC_DRAIN_TIMEOUT", nullptr}},
    {"--threads-http", {"SPECRPC_THREADS_HTTP", "LLAMA_ARG_THREADS_HTTP"}},
    {"--threads-http-max", {"SPECRPC_THREADS_HTTP_MAX", nullptr}},
    {"--allowed-hosts", {"SPECRPC_ALLOWED_HOSTS", nullptr}},
    {"--stdio", {"SPECRPC_STDIO", nullptr}},
    {"--stdio-workers", {"SPECRPC_STDIO_WORKERS", nullptr}},
    {"--alias", {"SPECRPC_ALIAS", "LLAMA_ARG_ALIAS"}},
    {"--chat-template", {"SPECRPC_CHAT_TEMPLATE", "LLAMA_ARG_CHAT_TEMPLATE"}},
    {"--allow-model-load", {"SPECRPC_ALLOW_MODEL_LOAD", nullptr}},
    {"--sse-keepalive-ms", {"SPECRPC_SSE_KEEPALIVE_MS", nullptr}},
    {"--cors-origin", {"SPECRPC_CORS_ORIGINS", nullptr}},
    {"--spec-type", {"SPECRPC_SPEC_TYPE", "LLAMA_ARG_SPEC_TYPE"}},
    {"--draft-max", {"SPECRPC_DRAFT_MAX", "LLAMA_ARG_DRAFT_MAX"}},
    {"--draft-min", {"SPECRPC_DRAFT_MIN", "LLAMA_ARG_DRAFT_MIN"}},
    {"--draft-p-min", {"SPECRPC_DRAFT_P_MIN", "LLAMA_ARG_DRAFT_P_MIN"}},
    {"--draft-p-split", {"SPECRPC_DRAFT_P_SPLIT", nullptr}},
    {"--draft-branches", {"SPECRPC_DRAFT_BRANCHES", nullptr}},
    {"--ngram-min", {"SPECRPC_NGRAM_MIN", nullptr}},
    {"--ngram-max", {"SPECRPC_NGRAM_MAX", nullptr}},
    {"--lookup-cache-static", {"SPECRPC_LOOKUP_CACHE_STATIC", "LLAMA_ARG_LOOKUP_CACHE_STATIC"}},
    {"--lookup-cache-dynamic", {"SPECRPC_LOOKUP_CACHE_DYNAMIC", "LLAMA_ARG_LOOKUP_CACHE_DYNAMIC"}},
};

void bind_env(CLI::App & app) {
    for (const auto & [flag, names] : kEnv) {
        CLI::Option * opt = nullptr;
        try {
            opt = app.get_option(flag);
        } catch (const CLI::OptionNotFound &) {
            continue;
        }
        opt->envname(names.first);
        if (names.second) {
            if (!std::getenv(names.first) && std::getenv(names.second)) setenv(names.first, std::getenv(names.second), 0);
            opt->description(opt->get_description() + " (or " + names.second + ")");
        }
    }
}

Status read_api_keys(const std::string & path, std::vector<std::string> & keys) {
    std::ifstream f(path);
    if (!f) return invalid_arg("cannot read --api-key-file '" + path + "'", "api-key-file");
    std::string line;
    while (std::getline(f, line)) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
        if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
    return Status::ok();
}

// Shutdown request from the signal thread.
std::mutex              g_stop_mu;
std::condition_variable g_stop_cv;
bool                    g_stop = false;
int                     g_signal = 0;   // the first signal received
int                     g_signals = 0;  // signals received; a second one ends draining
std::function<void()>   g_on_signal;  // set before the signal thread starts

void start_signal_thread() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread created after this
    signal(SIGPIPE, SIG_IGN);
    std::thread([set] {
        for (;;) {
            int sig = 0;
            sigwait(&set, &sig);
            SPR_LOG_INFO("received %s, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
            {
                std::lock_guard<std::mutex> lock(g_stop_mu);
                g_stop = true;
                if (g_signals++ == 0) g_signal = sig;
            }
            g_stop_cv.notify_all();
            if (g_on_signal) g_on_signal();
        }
    }).detach();
}

// SIGTERM's draining: new requests get 503 (the balancer retries them elsewhere and takes this
// replica out on its next /health check) while the running ones finish, for at most `timeout_s`
// seconds or until another signal.
void drain(rpc::HttpServer & http, int timeout_s) {
    http.drain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    std::unique_lock<std::mutex> lock(g_stop_mu);
    while (http.requests_in_progress() > 0 && g_signals < 2 && std::chrono::steady_clock::now() < deadline)
        g_stop_cv.wait_for(lock, std::chrono::milliseconds(20));
    if (const int left = http.requests_in_progress(); left > 0)
        SPR_LOG_WARN("draining ended with %d request(s) still running: cancelling them", left);
    else
        SPR_LOG_INFO("drained: no request running");
}

// Waits for an async load; prints the outcome. Returns false when it failed or was interrupted.
bool wait_loaded(server::Service & svc) {
    int last = -1;
    while (svc.state() == server::LoadState::LOADING) {
        const int pct = static_cast<int>(svc.status()["loading_progress"].get<double>() * 100);
        if (pct / 10 != last / 10) {
            std::fprintf(stderr, "specrpc: loading %3d%%\n", pct);
            last = pct;
        }
        std::unique_lock<std::mutex> lock(g_stop_mu);
        if (g_stop_cv.wait_for(lock, std::chrono::milliseconds(20), [] { return g_stop; })) return false;
    }
    json st = svc.status();
    if (svc.state() != server::LoadState::READY) {
        std::fprintf(stderr, "specrpc: error: %s\n", st.value("error", std::string("loading failed")).c_str());
        return false;
    }
    auto eng = svc.engine();
    if (!eng) return false;
    const EngineInfo & info = eng->info();
    std::fprintf(stderr, "specrpc: model %s loaded: context per slot %d tokens, %d slot(s), %d thread(s)%s%s\n",
                 svc.model_name().c_str(), info.n_ctx_slot, info.n_parallel, info.n_threads,
                 info.draft_path.empty() ? "" : ", draft ", info.draft_path.c_str());
    return true;
}

}  // namespace

int cmd_serve(int argc, char ** argv) {
    CLI::App app{"specrpc serve: JSON-RPC 2.0 server (llama-server compatible REST routes, SSE, stdio)"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as llama.cpp: the last one wins
    CommonArgs a;
    ServeArgs s;
    add_model_flags(app, a);
    add_sampling_flags(app, a);
    add_spec_flags(app, a);
    app.get_option("--model")->required(false);
    app.add_option("--parallel", a.engine.n_parallel, "slots: requests generated at once, alias -np")->capture_default_str();
    app.add_option("--queue-max", a.engine.n_queue_max, "requests waiting for a slot; more get -32005 / HTTP 503")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--host", s.host, "address to listen on")->capture_default_str();
    app.add_option("--port", s.port, "port to listen on; 0 = any free port (printed on stderr)")->capture_default_str();
    app.add_option("--api-key", s.api_keys, "API key clients must send (Authorization: Bearer KEY); repeatable")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',');
    app.add_option("--api-key-file", s.api_key_file, "file with one API key per line");
    app.add_flag("--stdio", s.stdio, "serve JSON-RPC on stdin/stdout instead of HTTP");
    app.add_option("--stdio-workers", s.stdio_workers, "stdio: calls run at once, 0 = max(4, 2 x parallel)");
    app.add_option("--timeout", s.timeout_s,
                   "HTTP write timeout in seconds (a request's head must arrive within 10 s, its body within "
                   "10 s plus 1 s per 32 KiB)")
        ->capture_default_str();
    app.add_option("--drain-timeout", s.drain_timeout_s,
                   "SIGTERM: seconds running requests may take to finish while new ones (and /health) get 503; "
                   "0 = cancel them at once (as SIGINT)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--threads-http", s.threads_http, "HTTP connection threads kept, 0 = max(8, 2 x parallel + 4)")
        ->capture_default_str();
    app.add_option("--threads-http-max", s.threads_http_max,
                   "HTTP connection threads started on demand at most (each serves one request; when all are "
                   "busy a request gets 503 with Retry-After), 0 = threads-http + 2 x (parallel + queue-max) + 16")
        ->capture_default_str();
    app.add_option("--allowed-hosts", s.allowed_hosts,
                   "Host header names accepted besides localhost, 127.0.0.1, [::1] and --host (any port); "
                   "repeatable or comma-separated; * = any. Other Host names get 403 (DNS rebinding)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',');
    app.add_option("-a,--alias", s.alias, "model name reported to clients (default: the file name)");
    app.add_option("--chat-template", s.chat_template,
                   "chat template for v1/chat/completions: a llama.cpp built-in name (chatml, llama2, ...) "
                   "or template text; default: the model's own");
    app.add_option("--allow-model-load", s.allow_model_load,
                   "allow the `init`/`deinit` methods over HTTP, for model files inside DIR only");
    app.add_option("--sse-keepalive-ms", s.sse_keepalive_ms, "SSE: comment event after this much silence, 0 = off")
        ->capture_default_str();
    app.add_option("--cors-origin,--cors-origins", s.cors_origins,
                   "browser origin allowed to call the server (e.g. https://app.example:8443; without a port any "
                   "port; * = any); repeatable or comma-separated; replaces the default of local origins only "
                   "(http(s)://localhost, 127.0.0.1, [::1]). Requests with another Origin get 403")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',');
    app.footer(
        "Every option can also come from the environment variable shown (a command-line flag wins); llama-server's\n"
        "LLAMA_ARG_* names are read too. Without -m the server starts empty and waits for `init` (stdio, or HTTP\n"
        "with --allow-model-load). HTTP: POST /rpc (JSON-RPC 2.0; SSE with Accept: text/event-stream), GET /health\n"
        "(no key needed), /props, /metrics (Prometheus), /v1/models; POST /completion, /v1/completions,\n"
        "/v1/chat/completions, /tokenize, /detokenize. SIGTERM: drain (new requests and /health get 503, running\n"
        "ones finish within --drain-timeout); SIGINT or a second signal: no wait. Then cancel what still runs, save\n"
        "--lookup-cache-dynamic, exit 0.");
    app.add_option("-n,--n-predict", s.n_predict, "default max tokens per request, -1 = until EOS / context end")
        ->capture_default_str();
    app.add_flag("--context-shift", s.context_shift, "default: on context overflow drop old tokens instead of stopping");
    app.add_option("--chat-template-file", s.chat_template_file, "file with the chat template (as --chat-template)");
    static const std::set<std::string> kv_types{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};
    app.add_option("--cache-type-k", s.cache_type_k,
                   "KV cache type K, alias -ctk: f32 = --kv-f32; other types are accepted and stored as f16")
        ->check(CLI::IsMember(kv_types));
    app.add_option("--cache-type-v", s.cache_type_v, "KV cache type V, alias -ctv (as --cache-type-k)")
        ->check(CLI::IsMember(kv_types));
    app.add_flag_callback("--verbose", [&a] { a.log_level = "debug"; }, "as --log-level debug");
    auto * compat = "llama-server compatibility: accepted and ignored";
    app.add_flag("--kv-unified,!--no-kv-unified", s.kv_unified,
                 "every slot may use the whole -c (llama-server's unified KV cache; memory for -c x slots)");
    app.add_flag("--slots,!--no-slots", s.slots, "GET /slots (the `slots` method); --no-slots: 501")->capture_default_str();
    for (const char * f : {"--offline", "--metrics", "--jinja", "--no-jinja", "--cont-batching", "--no-cont-batching", "--no-ui", "--swa-full",
                           "--no-cache-idle-slots", "--no-context-shift", "--no-warmup", "--no-webui"})
        app.add_flag(f, s.ignored_flag, compat)->group("llama-server compatibility (ignored)");
    app.add_option("--tags", s.tags, "comma list of tags reported by /v1/models");
    for (const char * f : {"--ubatch-size", "--sleep-idle-seconds", "--slot-save-path", "--cache-ram",
                           "--threads-batch", "--cache-reuse"})
        app.add_option(f, s.ignored_value, compat)->group("llama-server compatibility (ignored)");
    bind_env(app);
    try {
        app.parse(translate_args(argc, argv));
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    if (s.cache_type_k == "f32" && s.cache_type_v == "f32") a.engine.kv_f32 = true;
    if (!s.chat_template_file.empty()) {
        std::ifstream f(s.chat_template_file);
        if (!f) {
            std::fprintf(stderr, "error: cannot read --chat-template-file '%s'\n", s.chat_template_file.c_str());
            return 1;
        }
        std::stringstream ss;
        ss << f.rdbuf();
        s.chat_template = ss.str();
    }
    if (Status st = finalize(a); !st) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
    }
    if (!s.api_key_file.empty())
        if (Status st = read_api_keys(s.api_key_file, s.api_keys); !st) {
            std::fprintf(stderr, "error: %s\n", st.message().c_str());
            return 1;
        }
    const bool have_model = !a.engine.target.path.empty();
    if (!have_model && !s.stdio && s.allow_model_load.empty()) {
        std::fprintf(stderr, "error: no model: give -m PATH (or --allow-model-load DIR to load one with `init`)\n");
        return 1;
    }
    server::LoadConfig cfg;
    cfg.engine         = a.engine;
    cfg.spec           = a.spec;
    cfg.spec_types     = a.spec_types;
    cfg.model_alias    = s.alias;
    cfg.chat_template  = s.chat_template;
    cfg.lookup_static  = a.lookup_static;
    cfg.lookup_dynamic = a.lookup_dynamic;
    cfg.sampling       = a.sampling;
    cfg.n_predict      = s.n_predict;
    cfg.context_shift  = s.context_shift;
    cfg.kv_unified     = s.kv_unified;
    cfg.model_tags     = s.tags;
    cfg.slots_endpoint = s.slots;
    if (have_model)
        if (Status st = server::finalize_load_config(cfg); !st) {
            std::fprintf(stderr, "error: %s\n", st.message().c_str());
            return 1;
        }

    heap_configure();  // before the server's threads start
    server::ServiceOptions so;
    so.allow_http_model_load = !s.allow_model_load.empty();
    so.model_load_dir        = s.allow_model_load;
    server::Service  svc(so);
    rpc::Dispatcher  dispatcher;
    svc.register_methods(dispatcher);
    const int np = std::max(1, a.engine.n_parallel);

    if (s.stdio) {
        g_on_signal = [&svc, &dispatcher] {
            svc.cancel_all();
            for (int i = 0; i < 200 && dispatcher.in_flight() > 0; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            svc.unload();  // saves the dynamic n-gram cache
            std::cout.flush();
            std::_Exit(0);  // stdin cannot be interrupted portably; everything is saved and flushed
        };
        start_signal_thread();
        if (have_model) svc.load_async(cfg);
        std::thread announce([&svc, have_model] {
            if (have_model) wait_loaded(svc);
        });
        rpc::StdioOptions stdio_opts;
        stdio_opts.n_workers = s.stdio_workers > 0 ? s.stdio_workers : std::max(4, 2 * np);
        stdio_opts.loading   = [&svc] { return svc.state() == server::LoadState::LOADING; };
        std::ios::sync_with_stdio(false);
        rpc::StdioServer server(dispatcher, std::cin, std::cout, stdio_opts);
        const int rc = server.run();
        announce.join();
        svc.unload();
        return rc;
    }

    start_signal_thread();
    rpc::HttpOptions ho;
    ho.host             = s.host;
    ho.port             = s.port;
    ho.api_keys         = s.api_keys;
    ho.n_threads        = s.threads_http > 0 ? s.threads_http : std::max(8, 2 * np + 4);
    ho.max_threads      = s.threads_http_max > 0 ? std::max(s.threads_http_max, ho.n_threads)
                                                 : ho.n_threads + 2 * (np + a.engine.n_queue_max) + 16;
    ho.allowed_hosts    = s.allowed_hosts;
    ho.routes           = rpc::default_rest_routes();
    ho.read_timeout_s   = std::min(s.timeout_s, 10);  // the body deadline's base: a slow body must not hold a thread
    ho.write_timeout_s  = s.timeout_s;
    ho.sse_keepalive_ms = s.sse_keepalive_ms;
    if (!s.cors_origins.empty()) ho.cors_origins = s.cors_origins;
    rpc::HttpServer http(dispatcher, ho);
    if (Status st = http.start(); !st) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
    }
    std::fprintf(stderr, "specrpc: listening on http://%s:%d\n", s.host.c_str(), http.port());
    std::fflush(stderr);
    int rc = 0;
    if (have_model) {
        if (Status st = svc.load_async(cfg); !st) {
            std::fprintf(stderr, "error: %s\n", st.message().c_str());
            rc = 1;
        } else if (!wait_loaded(svc)) {
            rc = g_stop ? 0 : 1;
        }
    }
    if (rc == 0) {
        std::unique_lock<std::mutex> lock(g_stop_mu);
        g_stop_cv.wait(lock, [] { return g_stop; });
    }
    if (g_signal == SIGTERM && s.drain_timeout_s > 0) drain(http, s.drain_timeout_s);
    std::fprintf(stderr, "specrpc: shutting down\n");
    svc.cancel_all();
    http.stop();
    svc.unload();  // saves the dynamic n-gram cache
    return rc;
}

}  // namespace specrpc::cli
