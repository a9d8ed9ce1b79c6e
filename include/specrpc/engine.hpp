// specrpc C++ embedding API: load a target (and optional draft) model, submit completion
// requests, receive streamed chunks and a final result. No JSON here: the service layer turns
// JSON into these plain structs.
//
// Threading: one engine thread owns every llama_context and all speculative state. Engine's
// public methods are thread-safe; callbacks (CompletionSink) run on the engine thread and must
// return quickly and must not call back into the Engine synchronously (submit/cancel are fine).
// Errors: functions return specrpc::Status / Result<T>; nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "specrpc/status.h"

struct llama_model;

namespace specrpc {

using token_id = int32_t;

// ---------------------------------------------------------------------------------------------
// Options

struct ModelParams {
    std::string path;              // GGUF file; empty = none (for the draft)
    int32_t     n_gpu_layers = 0;  // layers to offload (-1 = all); CPU build: ignored
    bool        use_mmap     = true;
    // llama.cpp `rpc-server` workers ("host:port") the model's layers are split over, through
    // llama.cpp's RPC backend (as llama-server's --rpc); empty = this process. With workers,
    // n_gpu_layers counts the layers sent to them and 0 means all. Each must be reachable at load.
    std::vector<std::string> rpc_servers;
};

// The smallest context per slot: a prompt, its BOS and a few generated tokens (a smaller one
// can serve no request, and truncation would empty the prompt).
inline constexpr int32_t kMinCtxSlot = 8;

struct EngineParams {
    ModelParams target;
    ModelParams draft;                 // optional draft model (same vocabulary as the target)
    int32_t     n_ctx        = 0;      // context per slot in tokens (>= kMinCtxSlot); 0 = the model's training context
    int32_t     n_batch      = 512;    // max tokens per llama_decode call (prompt chunks, verification
                                       // passes: drafts are cut to fit); >= 17 and >= n_parallel
    int32_t     n_threads    = 0;      // 0 = hardware concurrency
    int32_t     n_parallel   = 1;      // slots: requests generated concurrently
    int32_t     n_queue_max  = 64;     // queued requests beyond the slots; more → OVERLOADED
    // Max draft-tree branches per slot (KV sequences reserved); 1 = chains only, as llama-server.
    // With n_tree_max > 1 or n_parallel > 1 the KV cache is unified (tree branches and slots share
    // one cell pool), and llama.cpp then checks every pass against all its sequence ids, a fixed
    // cost that matters for small models (docs/benchmarks.md).
    int32_t     n_tree_max   = 1;
    bool        kv_f32       = false;  // F32 KV cache (bit-stable logits); default F16 as llama.cpp
    // Memory cap of the dynamic n-gram cache (every finished request's tokens feed it), in MiB;
    // 0 = keep no dynamic cache. Each distinct n-gram costs ~100 bytes (NgramCache::bytes);
    // uncapped, the server grew from 18 to 235 MB over 1,650 requests of 500 random tokens. At the
    // cap, counts are halved until the cache is at 3/4 of it (rare n-grams go first): 64 MiB hold
    // ~0.6M n-grams.
    int32_t     ngram_cache_max_mb = 64;
    // Memory cap of the suffix drafter's store of recent responses (shared by all slots; every
    // finished request's prompt tail and output feed it), in MiB; 0 = keep none (suffix drafting
    // then sees only the request's own tokens). Novel text costs up to 32 trie nodes of 16 bytes a
    // token (repeated text far less): 64 MiB hold at least ~130k tokens. At the cap the oldest
    // responses go first.
    int32_t     suffix_cache_max_mb = 64;
    // llama.cpp's flash attention, per context: 1 = on, 0 = off, -1 = auto: on iff the model's
    // attention head size is 32 or more. A rule, not a timing race, because it changes the
    // logits: the same request gives the same text on every start. Small heads run faster without
    // it on CPUs, large ones with it (docs/benchmarks.md); llama.cpp's own "auto" turns it on for both.
    int32_t     flash_attn       = -1;
    int32_t     draft_flash_attn = -1;
    // Seconds without requests after which the engine frees its models and contexts (llama-server's
    // --sleep-idle-seconds: the memory goes back while nobody uses the server); the next call that
    // needs a model (a request, tokenize, a slot restore) loads them again first. Slots lose their
    // cached prompts. 0 = never.
    int32_t     sleep_idle_seconds = 0;
    // Progress of model loading in [0,1], called from the loading thread. Return false to abort.
    std::function<bool(float progress, const std::string & what)> on_progress;
};

// Sampling: llama-server's fields and defaults.
struct SamplingParams {
    float    temperature       = 0.8f;   // <= 0: greedy (argmax after penalties/bias/grammar)
    int32_t  top_k             = 40;     // <= 0: off
    float    top_p             = 0.95f;  // 1: off
    float    min_p             = 0.05f;  // 0: off
    float    typical_p         = 1.0f;   // 1: off
    float    repeat_penalty    = 1.0f;   // 1: off
    int32_t  repeat_last_n     = 64;     // tokens considered by the penalties; -1 = context size
    float    presence_penalty  = 0.0f;
    float    frequency_penalty = 0.0f;
    int32_t  mirostat          = 0;      // 0 off, 1 or 2 (speculation is disabled with mirostat)
    float    mirostat_tau      = 5.0f;
    float    mirostat_eta      = 0.1f;
    uint32_t seed              = 0xFFFFFFFF;  // 0xFFFFFFFF = random
    bool     ignore_eos        = false;
    std::string grammar;                 // GBNF; empty = none
    // A lazy grammar applies only from the first match of a trigger (a regex over the output, or
    // a token), as tool calls need: free text until the model starts a call.
    bool        grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<token_id>    grammar_trigger_tokens;
    // Text the (non-lazy) grammar consumes before the output: a chat template's generation prompt
    // ("<|im_start|>assistant\n"), which its output-format grammar starts with but the prompt
    // already holds.
    std::string grammar_prefill;
    std::vector<std::pair<token_id, float>> logit_bias;  // -INFINITY = ban
    int32_t  n_probs             = 0;    // top-n probabilities reported per emitted token
    bool     post_sampling_probs = false;// report probabilities after the sampler transforms
};

enum class SpecType : int32_t {
    NONE   = 0,
    DRAFT  = 1,  // draft model, chain (tree when SpecParams::n_parallel > 1)
    NGRAM  = 2,  // n-gram caches: context + dynamic + static
    LOOKUP = 3,  // prompt lookup
    SYNTH  = 4,  // synthetic drafter for tests/benchmarks: fixed per-position acceptance
    SUFFIX = 5,  // suffix trie over the prompt, the output and recent responses: frequency-weighted
                 // trees (chains when SpecParams::n_parallel is 1)
};
const char * spec_type_name(SpecType t);
bool         spec_type_from_name(const std::string & s, SpecType * out);
// A drafter list as written on a command line or in a request: names separated by commas or
// spaces ("lookup,draft"), llama.cpp's names included; "none" entries are dropped. Errors:
// INVALID_ARGUMENT naming the unknown entry and listing the known names (Status::param empty:
// the caller knows which field it came from).
Status       spec_types_parse(const std::string & list, std::vector<SpecType> * out);

// How a round decides which drafted tokens to keep at temperature > 0 (temperature 0 is always
// greedy, token-identical to plain decoding; mirostat does not speculate). Every mode is lossless.
enum class SpecVerifier : int32_t {
    AUTO      = 0,  // COUPLED when the request sets a seed (it then reproduces its text with any
                    // drafter), else BLOCK
    TOKENWISE = 1,  // rejection sampling token by token (trees: recursive over siblings)
    BLOCK     = 2,  // a sampled draft chain is verified jointly (Sun et al., ICLR 2025); trees
                    // and deterministic drafts are verified TOKENWISE
    COUPLED   = 3,  // Gumbel-max draws keyed by (seed, output position, token), plain decoding
                    // included: the text depends on the seed, never on the drafter or γ
};

struct SpecParams {
    // The longest draft a request may ask for (n_max's and n_min's upper bound): a round's pass
    // is then at most kMaxDraft + 1 tokens, which the cost curve prices and the learned cache's
    // check of a probe ledger's credit rests on.
    static constexpr int32_t kMaxDraft = 64;

    std::vector<SpecType> types;        // drafter chain, first that proposes wins; empty = plain decoding
    int32_t n_max       = 32;           // max draft length (upper bound of the adaptive choice), 0..kMaxDraft
    int32_t n_min       = 0;            // min draft length; shorter proposals are not verified (a sampled
                                        // draft is: p_min never cuts it below n_min, see draft_model.cpp)
    float   p_min       = -1.0f;        // draft model: stop drafting when its top p < p_min (0 = never),
                                        // decided before a token is sampled (lossless); < 0 (the
                                        // default): a greedy draft (T = 0, sample_and_compare)
                                        // stops where what its confidence has been worth says the
                                        // next token does not pay (DraftLengthPolicy::stop_below),
                                        // a sampled one never
    bool    adaptive    = true;         // choose the length from the measured cost curve
    int32_t n_parallel  = 1;            // draft-model tree: max branches (1 = chain)
    float   p_split     = 0.1f;         // tree: branch where a further candidate's draft p > p_split
    int32_t ngram_min   = 1;            // n-gram / lookup match sizes
    int32_t ngram_max   = 4;
    std::vector<float> synth_rates;     // SYNTH: per-position acceptance probabilities (last repeats)
    std::vector<token_id> synth_reference; // SYNTH: the sequence it proposes from (e.g. the greedy output)
    bool    sample_and_compare = false; // T>0 with a model draft: draft argmax, one-hot verify (baseline)
    SpecVerifier verifier = SpecVerifier::AUTO;  // T>0: see SpecVerifier
};

// ---------------------------------------------------------------------------------------------
// Requests and results

struct CompletionRequest {
    std::vector<token_id>    prompt;             // already tokenised (BOS included if wanted)
    int32_t                  n_predict = -1;     // -1 = until EOS / context end
    std::vector<std::string> stop;               // stop strings (cut from the text)
    int32_t                  n_keep = 0;         // prompt tokens kept on context shift (-1 = all)
    bool                     context_shift = false; // on overflow: shift (drop after n_keep) vs stop
    bool                     truncate_prompt = false; // prompt too long: keep n_keep + tail instead of error
    bool                     cache_prompt = true;// reuse the slot's KV prefix
    int32_t                  id_slot = -1;       // run in this slot (waits until it is idle); -1 = the
                                                 // idle slot whose cache shares the longest prefix
    bool                     stream = false;     // deliver chunks as they are produced
    bool                     return_progress = false; // stream: a chunk with `progress` before the
                                                 // prompt and after each of its batches
    SamplingParams           sampling;
    SpecParams               spec;
};

struct TokenProbability {
    token_id    id;
    std::string piece;
    float       prob;
};

struct TokenOutput {  // one emitted token, with optional probabilities
    token_id                      id;
    std::string                   piece;
    float                         prob = 0.0f;   // probability of this token (when n_probs > 0)
    std::vector<TokenProbability> top;           // top n_probs candidates
    int32_t                       source = 0;    // 0 = target sample, >0 = accepted draft (branch+1)
};

struct PromptProgress {             // how far the prompt's evaluation is (llama-server's fields)
    int32_t total     = 0;             // prompt tokens
    int32_t cache     = 0;             // of them reused from the slot's KV cache
    int32_t processed = 0;             // cache + evaluated so far
    double  time_ms   = 0;             // since the prompt's evaluation began
};

struct CompletionChunk {            // streamed piece of output
    std::string              content;  // UTF-8 complete, stop-string safe
    std::vector<TokenOutput> tokens;
    std::optional<PromptProgress> progress;  // set on the prompt-progress chunks only (no text)
};

enum class StopType { NONE, EOS, WORD, LIMIT, CANCELLED, CONTEXT };
const char * stop_type_name(StopType t);

struct SpecRequestStats {
    int64_t draft_n          = 0;   // tokens drafted
    int64_t draft_n_accepted = 0;   // drafted tokens accepted
    int64_t draft_n_steps    = 0;   // verification passes that had a draft
    int64_t n_steps          = 0;   // all target passes in generation
    std::vector<int64_t> drafted_at_pos;  // [i] = passes whose draft reached depth i+1
    std::vector<int64_t> accepted_at_pos; // [i] = passes that accepted depth i+1 (same length)
    std::vector<int64_t> gamma_hist;     // how often each draft length was chosen
    int64_t n_off_rounds     = 0;        // rounds with speculation switched off by the policy
    // Rounds the draft model ran but its confidence stop left nothing worth a verification pass
    // (the target decoded plain: in n_steps, not in draft_n_steps), the draft's time in them (not
    // in t_draft_ms), and the policy's price of such a round at the request's end, in target
    // passes beyond a plain round (< 0: none measured): one costs 1 + empty_excess passes.
    int64_t n_empty_rounds   = 0;
    double  t_empty_draft_ms = 0;
    double  empty_excess     = -1;
    double  alpha_prior      = 0;        // the α the draft-length policy started from (learned
                                         // from earlier requests of the same drafter and regime)
    double  t_draft_ms       = 0, t_verify_ms = 0, t_sample_ms = 0;
    double  accept_rate() const { return draft_n ? double(draft_n_accepted) / draft_n : 0.0; }
    double  mean_accept_len() const { return draft_n_steps ? 1.0 + double(draft_n_accepted) / draft_n_steps : 0.0; }
};

struct Timings {
    int32_t prompt_n = 0;      double prompt_ms = 0;
    int32_t predicted_n = 0;   double predicted_ms = 0;
    double  prompt_per_token_ms() const { return prompt_n ? prompt_ms / prompt_n : 0; }
    double  prompt_per_second() const { return prompt_ms > 0 ? 1e3 * prompt_n / prompt_ms : 0; }
    double  predicted_per_token_ms() const { return predicted_n ? predicted_ms / predicted_n : 0; }
    double  predicted_per_second() const { return predicted_ms > 0 ? 1e3 * predicted_n / predicted_ms : 0; }
};

struct CompletionResult {
    std::string              content;
    std::vector<TokenOutput> tokens;
    StopType                 stop_type = StopType::NONE;
    std::string              stopping_word;
    bool                     truncated = false;   // prompt truncated or context shifted
    int32_t                  tokens_predicted = 0;
    int32_t                  tokens_evaluated = 0; // prompt tokens
    int32_t                  tokens_cached    = 0; // prompt tokens reused from the slot's KV
    int32_t                  slot_id = -1;
    Timings                  timings;
    SpecRequestStats         spec;
    std::vector<std::string> warnings;
};

// Receives the output of one request. Runs on the engine thread.
struct CompletionSink {
    std::function<void(const CompletionChunk &)> on_chunk;        // only when stream = true
    std::function<void(Result<CompletionResult>)> on_done;        // exactly once
};

struct EngineInfo {
    std::string model_path, model_desc, draft_path;
    int32_t     n_vocab = 0, n_ctx_slot = 0, n_ctx_train = 0, n_parallel = 0, n_threads = 0;
    token_id    bos = -1, eos = -1;
    bool        add_bos = false, has_chat_template = false;
    std::string chat_template;  // the model's template text (empty: none)
    bool        flash_attn = false, draft_flash_attn = false;  // as chosen (EngineParams::flash_attn)
};

// The target's measured cost curve (docs/design.md §3), measured on the first speculative request.
struct CostCurve {
    // v[n] = pass over n tokens / 1-token pass at the same context depth (index 0 unused);
    // empty = not measured
    std::vector<double> v;
    double              c = 0;    // 1-token draft-model pass / 1-token target pass (0 without a draft model)
    double              o = 0;    // per-round overhead in target passes (moving average)
    double              t1_ms = 0;// 1-token target pass, ms, at the depth of the last pass timed
};

struct SlotState {
    int32_t id = 0;
    bool    busy = false;
    int64_t request_id = -1;    // the request being generated (-1: idle)
    int32_t n_past = 0;         // tokens in the slot's KV (cached prompt prefix when idle)
    int32_t n_predicted = 0;    // tokens generated so far by the current request
};

struct EngineMetrics {
    int64_t requests_done = 0, requests_cancelled = 0, requests_failed = 0;
    int64_t tokens_predicted = 0, tokens_evaluated = 0;
    double  t_predicted_ms = 0, t_prompt_ms = 0;
    int32_t slots_busy = 0, queue_len = 0;
    int64_t draft_n = 0, draft_n_accepted = 0, draft_n_steps = 0;
    int64_t n_decode = 0;           // the target's llama_decode calls (prompt batches, verification passes)
    int64_t n_busy_slots = 0;       // slots in use, summed over those calls (/ n_decode: batching achieved)
    std::vector<SlotState> slots;   // as of the end of the engine's last step
};

// A slot's cache saved to or restored from a file (Engine::save_slot / restore_slot).
struct SlotFileResult {
    int32_t  id_slot  = -1;
    int32_t  n_tokens = 0;   // tokens of the slot's cache written / restored
    uint64_t n_bytes  = 0;   // bytes written / read
    double   t_ms     = 0;
};

// ---------------------------------------------------------------------------------------------

class Engine {
  public:
    // Loads the models, creates the contexts and starts the engine thread.
    static Result<std::unique_ptr<Engine>> create(const EngineParams & params);
    ~Engine();  // cancels running requests, joins the engine thread, frees everything

    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    // Tokenisation (thread-safe, does not wait for the engine thread). Errors: text the vocabulary
    // cannot represent (tokenizers without byte fallback) → INVALID_ARGUMENT.
    Result<std::vector<token_id>> tokenize(const std::string & text, bool add_bos, bool parse_special) const;
    std::string detokenize(const std::vector<token_id> & tokens, bool render_special = false) const;
    std::string token_piece(token_id id) const;
    Status      validate_tokens(const std::vector<token_id> & tokens) const;  // ids in [0, n_vocab)

    // Queues a request; returns its id. Errors (as the sink's on_done, never both): invalid
    // params, context exceeded, overloaded. The request id can be passed to cancel().
    int64_t submit(CompletionRequest request, CompletionSink sink);
    // ok, or UNAVAILABLE while an RPC worker of the target is lost (requests fail at once until
    // it answers again and the target is reloaded on it). Thread-safe.
    Status  health() const;
    void    cancel(int64_t request_id);  // no-op if unknown or finished

    // Blocking convenience: submit + wait. Chunks (if stream) are delivered to on_chunk.
    Result<CompletionResult> complete(CompletionRequest request,
                                      std::function<void(const CompletionChunk &)> on_chunk = {});

    // Saves the dynamic n-gram cache (if any) to `path`.
    Status save_ngram_cache(const std::string & path);
    Status load_ngram_cache(const std::string & path, bool dynamic);

    // Slot caches as files (llama-server's POST /slots/:id?action=save|restore|erase): the target's
    // KV cells of the slot's sequence and its token list, in llama.cpp's sequence-state file whose
    // token payload is llama-server's packed form (also read: a plain token list). A restored slot
    // reuses its cache for the next request's common prefix; the draft model's KV of that slot is
    // cleared and catches up from the tokens at the next speculative round. Run on the engine
    // thread between rounds. Errors: NOT_FOUND (no such slot or file), OVERLOADED (the slot is
    // generating), INTERNAL (save: the file could not be written), INVALID_ARGUMENT (restore: not a
    // slot file of this model, or its tokens do not fit the slot; the slot is then left empty).
    Result<SlotFileResult> save_slot(int32_t id_slot, const std::string & path);
    Result<SlotFileResult> restore_slot(int32_t id_slot, const std::string & path);
    Result<int32_t>        erase_slot(int32_t id_slot);  // the number of cached tokens dropped
    // True while the models are unloaded after EngineParams::sleep_idle_seconds without use.
    bool               is_sleeping() const;

    const EngineInfo & info() const;
    EngineMetrics      metrics() const;
    CostCurve          cost_curve() const;  // empty until the first speculative request
    // The target model, for llama.cpp's `common` helpers (chat templates) in the server; valid
    // until the Engine is destroyed or sleeps (EngineParams::sleep_idle_seconds).
    const llama_model * target_model() const;
    SpecParams         default_spec() const;
    void               set_default_spec(const SpecParams & spec);

    struct Impl;

  private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace specrpc
