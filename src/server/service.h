// The service layer: JSON-RPC methods (llama-server's names) over one Engine. JSON is parsed
// here into the engine's plain structs (service_params.cpp, driven by one validation table) and
// results are formatted back (service_results.cpp); the Engine never sees JSON.
//
// A Service holds at most one Engine. While none is loaded (not initialised, loading, failed)
// the engine methods answer -32001 with {status, loading_progress, error}. `init` loads or
// replaces the models; the transports decide whether it is reachable (see ServiceOptions).
//
// Thread-safety: every public method may be called from any thread. Calls in flight keep the
// engine they started with alive (shared_ptr); unload() cancels them and waits for them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_templates.h"
#include "server/jsonrpc.h"
#include "specrpc/engine.hpp"

namespace specrpc::server {

// The one message for a draft drafter without a draft model, in a request or in the server's config.
inline constexpr const char * kDraftNeedsModel = "speculative type 'draft' needs a draft model (load one with -md)";

using nlohmann::json;

// What `init` (C ABI or RPC) and `specrpc serve` load.
struct LoadConfig {
    EngineParams engine;                 // models, context, threads, slots, queue
    SpecParams   spec;                   // server default speculation (Engine::set_default_spec)
    std::string  spec_types = "auto";    // comma list; auto = draft when a draft model is given
    std::string  model_alias;            // name reported as `model` (default: the file name); a comma
                                         // list gives several aliases, the first in sorted order is the id
    std::string  model_tags;             // comma list reported by v1/models as `tags`
    std::string  lookup_static;          // static n-gram cache file (loaded)
    std::string  lookup_dynamic;         // dynamic n-gram cache file (loaded, saved on unload)
    std::string  chat_template;          // overrides the model's: a llama.cpp built-in name or text
    bool         jinja = true;           // render templates with llama.cpp's Jinja engine (--no-jinja: off)
    std::string  reasoning = "auto";     // on | off | auto: the templates' enable_thinking (auto: theirs)
    std::string  reasoning_format = "none";  // how reasoning is parsed out of chat output
    // Server-wide request defaults (llama-server's --temp, --seed, -n, --context-shift ...): a
    // request starts from these and its own fields override them.
    SamplingParams sampling;
    int32_t      n_predict     = -1;     // -1 = until EOS / context end
    bool         context_shift = false;
    // -c is the TOTAL context, split over the slots, as in llama-server (engine.n_ctx is per slot
    // once finalize_load_config ran); with kv_unified every slot gets all of it.
    bool         kv_unified    = false;
    bool         slots_endpoint = true;  // false (--no-slots): the `slots` method answers -32006 / 501
    // GET /metrics (Prometheus) answers 501 unless on (--metrics), as in llama-server; the `metrics`
    // RPC method is always available.
    bool         metrics_endpoint = false;
    // --embedding / --reranking: a pooled context beside the engine (embedder.h) for the embedding
    // and rerank routes; pooling: none|mean|cls|last|rank, empty = the model's (rank with --reranking).
    bool         embedding = false, reranking = false;
    std::string  pooling;
    // --slot-save-path: the directory of the slot files (POST /slots/ID?action=save|restore); empty
    // = the slot actions are unsupported (501), as in llama-server.
    std::string  slot_save_path;
};

// init's argument: a command line with llama-server flags (`-m PATH -md PATH -c 512 -np 2 -t 2
// --spec-type draft ...`) or a JSON object with the same keys (`{"model": ..., "ctx_size": ...}`).
// Unknown flags / keys and bad values are INVALID_ARGUMENT naming the flag or key.
Result<LoadConfig> parse_load_config(const std::string & text);
Result<LoadConfig> parse_load_config_json(const json & j);
// Splits a command line as a POSIX shell would (quotes, backslashes), without expansion;
// INVALID_ARGUMENT ("cmd") on an open quote.
Result<std::vector<std::string>> split_command_line(const std::string & s);
// "a,b,,c" -> {"a", "b", "c"} (aliases, tags).
std::set<std::string> split_list(const std::string & s);
// Resolves spec_types into spec.types (after the draft path is known) and splits the total context
// (-c) over the slots. Call once per config.
Status finalize_load_config(LoadConfig & cfg);

struct ServiceOptions {
    // `init` / `deinit` over the HTTP transport: refused unless allowed, and then only for model
    // files inside model_load_dir (after resolving symlinks). stdio and the C ABI may always load.
    bool        allow_http_model_load = false;
    std::string model_load_dir;
    int         poll_ms = 5;             // how often a waiting call checks its cancel flag
};

enum class LoadState { EMPTY, LOADING, READY, FAILED };

// ---- parsing / formatting (service_params.cpp, service_results.cpp, chat.cpp) ---------------

// Caps of the structured request fields (the scalar limits are in the validation table).
struct CompletionCaps {
    int32_t n_probs_max     = 100;      // soft: clamped
    size_t  stop_max        = 16;       // hard
    size_t  stop_len_max    = 1024;     // hard, bytes per stop string
    size_t  logit_bias_max  = 1024;     // hard, entries after expanding text keys
    size_t  grammar_len_max = 1 << 18;  // hard, bytes
    size_t  synth_ref_max   = 1 << 16;  // hard
};
inline constexpr CompletionCaps kCaps;

struct ParsedCompletion {
    CompletionRequest        req;
    std::vector<std::string> warnings;   // soft-limit clamps and ignored fields
    json                     prompt_json;  // what the client sent (for `prompt` text)
    bool                     openai_echo = false;
};

// JSON params → CompletionRequest through the validation table. Errors are -32602 with
// data.param, or -32002 (context exceeded) with {n_prompt_tokens, n_ctx}.
// `defaults` (the server's --temp, --seed, -n ...) are the fields a request does not set.
std::variant<ParsedCompletion, rpc::RpcError> parse_completion(const json & params, const Engine & engine,
                                                               const CompletionRequest * defaults = nullptr);
// The scalar rows of the validation table with their values in `req` / `sp`.
struct FieldValue {
    const char * name;
    const char * type;                  // integer | number | boolean
    double       hard_min, hard_max;    // +-inf = unbounded
    double       soft_min, soft_max;
    double       value;
    const char * doc;
};
std::vector<FieldValue> request_fields(const CompletionRequest & req);
std::vector<FieldValue> spec_fields(const SpecParams & sp);
// The whole table, for documentation and `props`: [{name, type, default, hard, soft, doc}].
json completion_params_schema();
// The effective settings of a request, in llama-server's generation_settings shape.
json generation_settings(const CompletionRequest & req, const Engine & engine);
json spec_settings(const SpecParams & sp);

json result_to_json(const CompletionResult & r, const CompletionRequest & req, const Engine & engine,
                    const std::vector<std::string> & warnings, const std::string & model_name);
json chunk_to_json(const CompletionChunk & c, const CompletionRequest & req, int32_t n_predicted_so_far);
json probs_to_json(const std::vector<TokenOutput> & tokens, bool post_sampling);
json timings_to_json(const CompletionResult & r);
// REST shape: llama-server's `timings` hold numbers only, so the per-position speculation arrays
// move from j.timings to j.draft_stats.
void rest_timings(json & j);
// Streaming telemetry (timings_per_token, return_progress), measured at the service: the prompt
// time is from submission to the first generated token, generation time from there on.
struct StreamClock {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), t_first{};
    bool    started = false;
    int32_t n_prompt = 0;
    json    timings(int32_t n_predicted);         // llama-server's per-token timings object
};
json progress_to_json(const PromptProgress & p);   // llama-server's prompt_progress object
json progress_timings(const PromptProgress & p);   // the timings object of a progress event
json metrics_to_json(const EngineMetrics & m, const EngineInfo & info);
struct ServiceCounters {             // counted by the service as results finish
    int64_t tokens_cached = 0, n_decode = 0, n_tokens_max = 0;
    // Since the previous Prometheus scrape (llama-server's throughput buckets, which a scrape resets):
    // prompt and generated tokens of the requests finished since, and their times.
    int64_t window_prompt_n = 0, window_predicted_n = 0;
    double  window_prompt_ms = 0, window_predicted_ms = 0;
};
std::string metrics_to_prometheus(const EngineMetrics & m, const EngineInfo & info, const ServiceCounters & c);
const char * stop_type_label(StopType t);          // eos | word | limit | none
const char * openai_finish_reason(StopType t);     // stop | length

struct OaiMeta {                     // the fields every OpenAI response / chunk repeats
    std::string              id;     // "cmpl-..." / "chatcmpl-..."
    int64_t                  created = 0;
    std::string              model;
    std::string              fingerprint;
    std::vector<std::string> warnings;
    json                     message;  // chat: the parsed assistant message (tool calls); null = the text
};
json oai_usage(const CompletionResult & r);
// The response; rest_stream_final: the last SSE event of a REST stream (empty text, OpenAI's way).
json oai_result(const CompletionResult & r, const OaiMeta & meta, bool chat, bool rest_stream_final);
json oai_chunk(const std::string & content, const OaiMeta & meta, bool chat, bool first);


// A request's json_schema (llama-server) or response_format (OpenAI) as one JSON schema; null =
// none. Errors: -32602 naming response_format.
std::variant<json, rpc::RpcError> requested_json_schema(const json & params);

// True for calls that come from a REST route of the HTTP transport (not from POST /rpc): they
// get llama-server's exact shapes (empty final SSE content, Prometheus text for /metrics).
bool is_rest_call(const rpc::CallContext & ctx);

// ---------------------------------------------------------------------------------------------

class Service {
  public:
    explicit Service(ServiceOptions options = {});
    ~Service();  // unload()
    Service(const Service &) = delete;
    Service & operator=(const Service &) = delete;

    // Registers every method and alias in `d`.
    void register_methods(rpc::Dispatcher & d);

    // Loads (replacing the current engine, which is unloaded first). Blocking; the status is also
    // kept for status(). Fails with UNAVAILABLE while another load runs.
    Status load(LoadConfig cfg);
    // Starts load() on a background thread (joined by the next load/unload/destructor).
    Status load_async(LoadConfig cfg);
    // Cancels the calls in flight, waits for them, saves the dynamic n-gram cache, frees the engine.
    void   unload();
    // Unloads and records a failed initialisation (e.g. init's arguments did not parse), so that
    // status() reports `error`.
    void   set_failed(const Status & st);
    // Cancels every call in flight (shutdown); the engine stays loaded.
    void   cancel_all();
    // Saves the dynamic n-gram cache when one is configured. Returns its status.
    Status save_dynamic_cache();

    LoadState state() const;
    // Counts loads and unloads begun: a start-up load that finds it changed was superseded by a
    // client's init/deinit, and its outcome is no longer the server's.
    uint64_t  generation() const;
    // {init_success, state, loading_progress, model, model_alias, error?} (poll_system_status).
    json status() const;
    std::shared_ptr<Engine> engine() const;  // null unless READY
    std::string model_name() const;          // alias, else the model file name
    CompletionRequest request_defaults() const;  // the loaded config's --temp, --seed, -n ...

    // Method bodies (also called directly by the C ABI).
    rpc::MethodResult completion(const json & params, rpc::CallContext & ctx);
    // Parses and checks a completion request without running it (the C ABI's async init).
    std::optional<rpc::RpcError> check_completion(const json & params);
    rpc::MethodResult tokenize(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult detokenize(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult health(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult props(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult metrics(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult slots(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult models(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult oai_completions(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult oai_chat(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult apply_template(const json & params, rpc::CallContext & ctx);
    // service_compat.cpp: other vendors' shapes, run through oai_chat.
    rpc::MethodResult anthropic_messages(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult anthropic_count_tokens(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult responses(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult chat_input_tokens(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult responses_input_tokens(const json & params, rpc::CallContext & ctx);
    // A converted request run through oai_chat: streamed, each chunk's data to on_chunk; without
    // on_chunk, not streamed (the caller's notify is not passed on) and the whole result returned.
    rpc::MethodResult chat_as(json & chat, rpc::CallContext & ctx, const std::function<void(const json &)> & on_chunk);
    // llama-server's /infill: prefix, suffix and extra files around the model's FIM tokens.
    rpc::MethodResult infill(const json & params, rpc::CallContext & ctx);
    // service_embed.cpp (needs --embedding / --reranking)
    rpc::MethodResult embeddings(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult oai_embeddings(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult rerank(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult init(const json & params, rpc::CallContext & ctx);
    // service_slots.cpp: save|restore|erase a slot's cache ({id_slot, action, filename})
    rpc::MethodResult slot_action(const json & params, rpc::CallContext & ctx);
    rpc::MethodResult deinit(const json & params, rpc::CallContext & ctx);

  private:
    struct Run;  // one engine request being waited for
    // Runs a parsed request: streams chunks through `on_chunk` (on the calling thread), polls
    // ctx for cancellation. Result or error (cancelled: -32800 with the partial result).
    using ChunkFn = std::function<void(const CompletionChunk &, int32_t n_so_far)>;
    std::variant<CompletionResult, rpc::RpcError> run(const std::shared_ptr<Engine> & eng, CompletionRequest req,
                                                      rpc::CallContext & ctx, const ChunkFn & on_chunk);
    rpc::RpcError not_ready_error() const;
    rpc::MethodResult completion_one(const json & params, rpc::CallContext & ctx, int index);
    // Admission of large work that runs on the caller's thread (tokenize): it counts against the
    // same limits as generation, at most n_parallel at once and n_queue_max waiting (more:
    // -32005), so that it cannot pile up on the transports' threads. enter_work: null = admitted
    // (leave_work must follow), else the error (overloaded, cancelled while waiting).
    std::optional<rpc::RpcError> enter_work(rpc::CallContext & ctx);
    void leave_work();
    Result<std::shared_ptr<Engine>> ready_engine() const;
    Status check_model_paths(const LoadConfig & cfg) const;
    Status load_locked(LoadConfig cfg);  // load_mu_ held
    std::shared_ptr<ChatTemplates> chat_templates() const;
    // An OpenAI chat request's messages, tools and schema through the chat template.
    std::variant<ChatTemplateOutput, rpc::RpcError> chat_prompt(const json & params) const;

    const ServiceOptions opts_;

    std::mutex              load_mu_;          // serialises load/unload
    std::thread             load_thread_;      // guarded by load_mu_

    mutable std::mutex      mu_;
    std::condition_variable calls_cv_;         // signalled when a call ends
    std::shared_ptr<Engine> engine_;           // guarded by mu_
    LoadState               state_ = LoadState::EMPTY;  // guarded by mu_
    std::string             error_;            // guarded by mu_: last load error
    uint64_t                generation_ = 0;   // guarded by mu_: generation()
    std::string             model_path_, model_alias_, lookup_dynamic_;  // guarded by mu_
    std::shared_ptr<ChatTemplates> chat_;      // guarded by mu_
    std::string             reasoning_ = "auto", reasoning_format_ = "none";  // guarded by mu_
    CompletionRequest       request_defaults_;  // guarded by mu_
    std::string             model_tags_;        // guarded by mu_
    bool                    slots_endpoint_ = true;  // guarded by mu_
    bool                    metrics_endpoint_ = false;  // guarded by mu_
    int32_t                 n_batch_ = 512;          // guarded by mu_
    std::string             slot_save_path_;         // guarded by mu_: --slot-save-path
    EngineMetrics           last_scrape_;            // guarded by mu_: the counters at the last /metrics
    // Service-side counters for /metrics beside the engine's (results as they finish).
    std::atomic<int64_t>    n_tokens_cached_{0}, n_decode_{0}, n_tokens_max_{0};
    void                    count_result(const CompletionResult & r);
    struct FimTokens;
    std::shared_ptr<FimTokens> fim_;                 // guarded by mu_; read at the first infill
    std::shared_ptr<class Embedder> embedder_;       // guarded by mu_; null unless --embedding/--reranking
    rpc::MethodResult embeddings_impl(const json & params, bool oai);
    std::variant<std::vector<token_id>, rpc::RpcError> embed_tokens(const Engine & eng, const json & in,
                                                                    const char * param) const;
    int                     n_calls_ = 0;      // guarded by mu_: engine calls in flight
    std::set<std::shared_ptr<std::atomic<bool>>> call_flags_;  // guarded by mu_: their cancel flags
    std::atomic<float>      progress_{0.0f};

    std::mutex              work_mu_;          // enter_work / leave_work
    std::condition_variable work_cv_;
    int                     work_running_ = 0, work_waiting_ = 0;  // guarded by work_mu_
    int                     work_running_max_ = 1, work_waiting_max_ = 64;  // guarded by work_mu_
    std::atomic<bool>       abort_load_{false};
};

}  // namespace specrpc::server
