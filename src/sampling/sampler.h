// Per-request sampling: SamplingParams → llama.cpp sampler pieces, and the *transformed
// distribution* p (after logit bias, penalties, grammar, truncation and temperature) that both
// the plain path and the speculative verifier sample from. Stateful pieces (penalty history,
// grammar) advance only on accept(); dist() can look ahead along a draft path without mutating.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "specrpc/engine.hpp"
#include "speculative/dist.h"

struct llama_sampler;
struct llama_token_data;
struct llama_vocab;

namespace specrpc {

// What a sampler needs of the model it samples for, and no more, so that sampling sits below the
// engine that owns the model (the engine fills it from its Model).
struct SamplerModel {
    const llama_vocab * vocab       = nullptr;  // grammar, end-of-generation ids
    int32_t             n_vocab     = 0;
    int32_t             n_ctx_train = 0;        // what repeat_last_n = -1 means when n_ctx is 0
};

class Sampler {
  public:
    // Errors: invalid grammar, out-of-range logit-bias ids, invalid values → INVALID_ARGUMENT.
    // `n_ctx` is the context the request runs in: repeat_last_n = -1 means that many tokens
    // (0: the model's training context).
    static Result<std::unique_ptr<Sampler>> create(const SamplerModel & model, const SamplingParams & params,
                                                   int32_t n_ctx = 0);
    ~Sampler();

    bool greedy() const { return params_.temperature <= 0.0f && params_.mirostat == 0; }
    bool mirostat() const { return params_.mirostat != 0; }
    const SamplingParams & params() const { return params_; }

    // The distribution the next token is drawn from, given raw `logits` (n_vocab floats) and the
    // stateful samplers advanced along `path` (tokens after the last accepted one). Greedy: one-hot
    // on the argmax (lowest id on ties). Empty when the grammar allows nothing.
    Dist dist(const float * logits, const std::vector<token_id> & path = {});
    // The distribution after the stateful transforms only (bias, penalties, grammar) at
    // temperature 1, no truncation: what a drafter's confidence and branching look at.
    Dist candidates(const float * logits, const std::vector<token_id> & path = {});
    // The probability of `id` in candidates(logits, path), without sorting the vocabulary (a
    // greedy draft's confidence, once per drafted token); 0 when the grammar allows nothing.
    float candidate_prob(const float * logits, const std::vector<token_id> & path, token_id id);

    // Draws a token from `d` with this request's RNG (fresh uniform each call).
    token_id sample(const Dist & d);
    // Mirostat path (no distribution exposed): applies the full chain and returns its choice.
    token_id sample_mirostat(const float * logits);
    // Feeds the prompt to the penalties (its last repeat_last_n tokens), as llama-server does:
    // a token the prompt holds is penalised from the first generated position on. The grammar
    // and mirostat see generated tokens only. Call once, before the first accept().
    void accept_prompt(const std::vector<token_id> & prompt);
    // Advances penalties / grammar / mirostat state by an emitted token. Fails (and leaves the
    // request unusable) only if the grammar rejects the token, which the callers never cause.
    Status accept(token_id id);

    std::mt19937_64 & rng() { return rng_; }

    // Top-n (id, p) by probability: from the raw softmax of `logits`, or from `d` when post-sampling.
    std::vector<TokenProb> top_probs(const float * logits, int32_t n) const;

  private:
    Sampler(int32_t n_vocab, const SamplingParams & params);
    void apply_stateful(llama_sampler * chain, std::vector<::llama_token_data> & cur) const;
    // Candidates after the stateful chain advanced along `path`; false if the path itself is
    // impossible under the grammar (llama.cpp throws on such an accept: caught here).
    bool stateful_candidates(const float * logits, const std::vector<token_id> & path,
                             std::vector<::llama_token_data> & cur);

    int32_t         n_vocab_;
    SamplingParams  params_;
    llama_sampler * stateful_ = nullptr;  // chain: logit bias, penalties, grammar
    llama_sampler * trunc_    = nullptr;  // chain: top-k, typical, top-p, min-p, temperature
    llama_sampler * miro_     = nullptr;  // chain: temperature + mirostat (mirostat only)
    bool            has_state_ = false;   // penalties or grammar present (look-ahead needs a clone)
    int32_t         penalties_idx_ = -1;  // index of the penalties in `stateful_` (-1: none)
    int32_t         penalty_last_n_ = 0;  // tokens the penalties look at
    std::mt19937_64 rng_;
};

}  // namespace specrpc
