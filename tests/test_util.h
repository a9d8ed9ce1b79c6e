// Shared helpers of the tests: polling with a time limit, and engines on ../shared/models.
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "specrpc/engine.hpp"

namespace specrpc::test {

// Polls `pred` every millisecond until it holds (true) or `limit` has passed (false).
inline bool wait_until(const std::function<bool()> & pred,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(3000)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

// An empty temporary directory's path for one test ("specrpc-<name>-<pid>"; removed if it existed).
inline std::string fresh_dir(const std::string & name) {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("specrpc-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    return d.string();
}

inline std::string model_path(const std::string & name) { return std::string(SPECRPC_MODELS_DIR) + "/" + name; }

// Engine parameters for models in ../shared/models, on one thread (the stories models are tiny:
// one thread is fastest and avoids spin contention).
inline EngineParams engine_params(const std::string & target, const std::string & draft = "") {
    EngineParams p;
    p.target.path = model_path(target);
    if (!draft.empty()) p.draft.path = model_path(draft);
    p.n_threads = 1;
    return p;
}

// An engine on stories260K-F32 (fast), with an optional draft and `n_parallel` slots.
inline std::unique_ptr<Engine> make_engine(const std::string & target = "stories260K-F32.gguf",
                                           const std::string & draft = "", int32_t n_parallel = 1,
                                           int32_t n_ctx = 0, int32_t n_tree_max = 4) {
    EngineParams p = engine_params(target, draft);
    p.n_parallel = n_parallel;
    p.n_ctx      = n_ctx;
    p.n_tree_max = n_tree_max;
    auto e = Engine::create(p);
    return e ? std::move(e.value()) : nullptr;
}

inline CompletionRequest greedy_request(const Engine & e, const std::string & prompt, int32_t n_predict) {
    CompletionRequest r;
    r.prompt                = e.tokenize(prompt, true, false).value();
    r.n_predict             = n_predict;
    r.sampling.temperature  = 0.0f;
    return r;
}

inline std::vector<token_id> output_ids(const CompletionResult & r) {
    std::vector<token_id> v;
    for (const auto & t : r.tokens) v.push_back(t.id);
    return v;
}

}  // namespace specrpc::test
