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
#include <sstream>
#include <thread>

#include "cli_common.h"
#include "common/heap.h"
#include "common/log.h"
#include "server/http_transport.h"
#include "server/router.h"
#include "server/service.h"
#include "server/stdio_transport.h"
#include "tools.h"

namespace specrpc::cli {

using nlohmann::json;

namespace {

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
constexpr time_t        kShutdownGraceS = 10;
time_t                  g_drain_timeout_s = 0;  // --drain-timeout, set before the signal thread starts

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
            // The graceful path waits for draining and then for the engine's current step, which
            // one long llama.cpp call can stretch without bound: past the deadline, or at a third
            // signal, the process ends.
            if (g_signals == 1) {
                const time_t grace = (sig == SIGTERM ? g_drain_timeout_s : 0) + kShutdownGraceS;
                std::thread([grace] {
                    std::this_thread::sleep_for(std::chrono::seconds(grace));
                    SPR_LOG_WARN("shutdown is past its deadline (the engine is busy in one step); exiting now");
                    std::fflush(stderr);
                    std::_Exit(1);
                }).detach();
            } else if (g_signals >= 3) {
                SPR_LOG_WARN("a third signal during shutdown; exiting now");
                std::fflush(stderr);
                std::_Exit(1);
            }
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
// `superseded`: a client's init/deinit replaced this load (the server's state is theirs).
bool wait_loaded(server::Service & svc, uint64_t generation = 0, bool * superseded = nullptr) {
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
    if (superseded && svc.generation() != generation) {
        *superseded = true;
        std::fprintf(stderr, "specrpc: the start-up load was replaced by a client's init/deinit\n");
        return false;
    }
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

// "http://HOST:PORT", an IPv6 address in brackets.
std::string url_of(const std::string & host, int port) {
    const bool v6 = host.find(':') != std::string::npos && host[0] != '[';
    return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

int cmd_serve(int argc, char ** argv) {
    CLI::App app{"specrpc serve: JSON-RPC 2.0 server (llama-server compatible REST routes, SSE, stdio)"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as llama.cpp: the last one wins
    CommonArgs a;
    add_options(app, a, server::IN_SERVE);  // every flag, its environment variables and its help: server/server_options.cpp
    auto & s = a.serve;
    app.footer(
        "Every option can also come from the environment variable shown (a command-line flag wins); llama-server's\n"
        "LLAMA_ARG_* names are read too. Without -m the server starts empty and waits for `init` (stdio, or HTTP\n"
        "with --allow-model-load). HTTP: POST /rpc (JSON-RPC 2.0; SSE with Accept: text/event-stream), GET /health\n"
        "(no key needed), /props, /metrics (Prometheus), /v1/models; POST /completion, /v1/completions,\n"
        "/v1/chat/completions, /tokenize, /detokenize. SIGTERM: drain (new requests and /health get 503, running\n"
        "ones finish within --drain-timeout); SIGINT or a second signal: no wait. Then cancel what still runs, save\n"
        "--lookup-cache-dynamic, exit 0.");
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
        a.chat_template = ss.str();
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
    // No model and no way to load one: llama-server's router role (server/router.h), which
    // answers /health, /props and /v1/models but serves no model.
    const bool router = !have_model && !s.stdio && s.allow_model_load.empty();
    if (!s.tools.empty())
        std::fprintf(stderr, "specrpc: warning: --tools %s: llama-server's built-in agent tools (shell, file access) are "
                             "not provided by specrpc serve; /tools answers 501\n",
                     s.tools.front().c_str());
    const server::LoadConfig & cfg = a;

    heap_configure();  // before the server's threads start
    server::ServiceOptions so;
    so.allow_http_model_load = !s.allow_model_load.empty();
    so.model_load_dir        = s.allow_model_load;
    server::Service  svc(so);
    rpc::Dispatcher  dispatcher;
    svc.register_methods(dispatcher);
    dispatcher.add_method("tools", [](const json &, rpc::CallContext &) -> rpc::MethodResult {
        return rpc::make_error(rpc::ERR_UNSUPPORTED,
                               "llama-server's built-in tools (--tools) are not provided by specrpc serve");
    });
    if (router) {
        server::RouterOptions ro;
        ro.models_dir      = s.models_dir;
        ro.models_max      = s.models_max;
        ro.models_autoload = s.models_autoload;
        server::install_router(dispatcher, ro);
        std::fprintf(stderr, "specrpc: no model given (-m): router role, serving no model%s%s\n",
                     s.models_dir.empty() ? "" : "; listing the models in ", s.models_dir.c_str());
    }
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

    g_drain_timeout_s = s.drain_timeout_s;
    start_signal_thread();
    rpc::HttpOptions ho;
    {  // llama-server's --host A,B: every address, on the same port
        std::vector<std::string> hosts;
        std::stringstream        list(s.host);
        for (std::string h; std::getline(list, h, ',');)
            if (!h.empty()) hosts.push_back(h);
        if (hosts.empty()) {
            std::fprintf(stderr, "error: --host needs an address\n");
            return 1;
        }
        ho.host = hosts[0];
        ho.extra_hosts.assign(hosts.begin() + 1, hosts.end());
    }
    ho.port             = s.port;
    // Google Cloud Vertex AI's container contract (AIP_MODE=PREDICTION), as llama-server: its
    // port wins over --port, its prediction route runs instances through the REST routes.
    const char * aip_mode = std::getenv("AIP_MODE");
    const bool   gcp = aip_mode && std::string(aip_mode) == "PREDICTION";
    if (gcp) {
        auto env_or = [](const char * name, const char * def) {
            const char * v = std::getenv(name);
            return std::string(v && *v ? v : def);
        };
        auto with_slash = [](std::string r) { return r.empty() || r[0] == '/' ? r : "/" + r; };
        const std::string port = env_or("AIP_HTTP_PORT", "8080");
        char *            end  = nullptr;
        const long        p    = std::strtol(port.c_str(), &end, 10);
        if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
            std::fprintf(stderr, "error: AIP_HTTP_PORT='%s' is not a port\n", port.c_str());
            return 1;
        }
        if (p != ho.port) SPR_LOG_WARN("AIP_MODE=PREDICTION: port %ld from AIP_HTTP_PORT instead of --port %d", p, ho.port);
        ho.port          = static_cast<int>(p);
        ho.predict_route = with_slash(env_or("AIP_PREDICT_ROUTE", "/predict"));
    }
    ho.api_keys         = s.api_keys;
    ho.n_threads        = s.threads_http > 0 ? s.threads_http : std::max(8, 2 * np + 4);
    ho.max_threads      = s.threads_http_max > 0 ? std::max(s.threads_http_max, ho.n_threads)
                                                 : ho.n_threads + 2 * (np + a.engine.n_queue_max) + 16;
    ho.allowed_hosts    = s.allowed_hosts;
    ho.routes           = rpc::default_rest_routes();
    if (gcp) {
        for (const rpc::RestRoute & r : ho.routes)
            if (r.path == ho.predict_route) {
                std::fprintf(stderr, "error: AIP_PREDICT_ROUTE=%s is one of the server's own routes\n", r.path.c_str());
                return 1;
            }
        if (const char * h = std::getenv("AIP_HEALTH_ROUTE"); h && *h)
            ho.routes.push_back({"GET", h[0] == '/' ? h : "/" + std::string(h), "health", true, false});
    }
    ho.read_timeout_s   = std::min(s.timeout_s, 10);  // the body deadline's base: a slow body must not hold a thread
    ho.write_timeout_s  = s.timeout_s;
    ho.sse_keepalive_ms = s.sse_keepalive_ms;
    if (!s.cors_origins.empty()) ho.cors_origins = s.cors_origins;
    rpc::HttpServer http(dispatcher, ho);
    if (Status st = http.start(); !st) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
    }
    // The socket is open from here (health answers 503 while loading), but "listening" is printed
    // once requests can be served, so a script that waits for it can send them at once.
    auto announce = [&] {
        std::string urls;
        for (const std::string & h : ho.extra_hosts) urls += ", " + url_of(h, http.port());
        std::fprintf(stderr, "specrpc: listening on %s%s\n", url_of(ho.host, http.port()).c_str(), urls.c_str());
        std::fflush(stderr);
    };
    int rc = 0;
    if (have_model) {
        const uint64_t gen = svc.generation() + 1;  // the start-up load's own
        bool superseded = false;
        std::fprintf(stderr, "specrpc: loading the model; %s/health answers 503 until it is ready\n",
                     url_of(ho.host, http.port()).c_str());
        if (Status st = svc.load_async(cfg); !st) {
            std::fprintf(stderr, "error: %s\n", st.message().c_str());
            rc = 1;
        } else if (!wait_loaded(svc, gen, &superseded)) {
            rc = g_stop || superseded ? 0 : 1;
            if (superseded && !g_stop) announce();
        } else {
            announce();
        }
    } else {
        announce();
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
