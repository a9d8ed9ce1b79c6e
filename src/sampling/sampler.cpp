#include "sampling/sampler.h"

#include <cctype>
#include <exception>

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "llama.h"
#include "speculative/verify.h"

namespace specrpc {

Sampler::Sampler(int32_t n_vocab, const SamplingParams & params) : n_vocab_(n_vocab), params_(params) {}

Sampler::~Sampler() {
    if (stateful_) llama_sampler_free(stateful_);
    if (trunc_) llama_sampler_free(trunc_);
    if (miro_) llama_sampler_free(miro_);
}

static Status check_params(const SamplingParams & p, int32_t n_vocab) {
    auto finite = [](float x) { return std::isfinite(x); };
    if (!finite(p.temperature)) return invalid_arg("temperature must be finite", "temperature");
    if (!finite(p.top_p) || p.top_p < 0 || p.top_p > 1) return invalid_arg("top_p must be in [0, 1]", "top_p");
    if (!finite(p.min_p) || p.min_p < 0 || p.min_p > 1) return invalid_arg("min_p must be in [0, 1]", "min_p");
    if (!finite(p.typical_p) || p.typical_p < 0 || p.typical_p > 1)
        return invalid_arg("typical_p must be in [0, 1]", "typical_p");
    if (!finite(p.repeat_penalty) || p.repeat_penalty <= 0)
        return invalid_arg("repeat_penalty must be > 0", "repeat_penalty");
    if (p.repeat_last_n < -1) return invalid_arg("repeat_last_n must be >= -1", "repeat_last_n");
    if (!finite(p.presence_penalty)) return invalid_arg("presence_penalty must be finite", "presence_penalty");
    if (!finite(p.frequency_penalty)) return invalid_arg("frequency_penalty must be finite", "frequency_penalty");
    if (p.mirostat < 0 || p.mirostat > 2) return invalid_arg("mirostat must be 0, 1 or 2", "mirostat");
    if (!finite(p.mirostat_tau) || !finite(p.mirostat_eta)) return invalid_arg("mirostat tau/eta must be finite", "mirostat_tau");
    if (p.n_probs < 0) return invalid_arg("n_probs must be >= 0", "n_probs");
    for (const auto & [id, bias] : p.logit_bias) {
        if (id < 0 || id >= n_vocab)
            return invalid_arg("logit_bias token id " + std::to_string(id) + " out of range [0, " +
                                   std::to_string(n_vocab) + ")", "logit_bias");
        if (std::isnan(bias)) return invalid_arg("logit_bias value is NaN", "logit_bias");
    }
    return Status::ok();
}

// Feeds `text` (tokenised with special tokens, as the prompt was) to a fresh grammar sampler, so
// that an output-format grammar that begins with the chat template's generation prompt starts
// after it. A tokenizer may put a space piece before a leading special token: not part of the text.
static Status grammar_prefill(llama_sampler * g, const llama_vocab * vocab, const std::string & text) {
    std::vector<llama_token> toks(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t)text.size(), toks.data(), (int32_t)toks.size(), false, true);
    if (n < 0) return invalid_arg("grammar prefill does not tokenize", "grammar");
    toks.resize(n);
    for (size_t i = 0; i < toks.size(); ++i) {
        char piece[256];
        int32_t len = llama_token_to_piece(vocab, toks[i], piece, sizeof piece, 0, true);
        if (i == 0 && len > 0 && std::isspace((unsigned char)piece[0]) && !std::isspace((unsigned char)text[0])) continue;
        try {
            llama_sampler_accept(g, toks[i]);
        } catch (const std::exception & e) {
            return invalid_arg(std::string("the grammar rejects the chat template's generation prompt: ") + e.what(),
                               "grammar");
        }
    }
    return Status::ok();
}

Result<std::unique_ptr<Sampler>> Sampler::create(const SamplerModel & model, const SamplingParams & params, int32_t n_ctx) {
    const int32_t n_vocab = model.n_vocab;
    if (Status st = check_params(params, n_vocab); !st) return st;
    std::unique_ptr<Sampler> s(new Sampler(n_vocab, params));

    uint32_t seed = params.seed == 0xFFFFFFFFu ? std::random_device{}() : params.seed;
    s->params_.seed = seed;
    s->rng_.seed(seed);

    auto chain_params = llama_sampler_chain_default_params();
    chain_params.no_perf = true;

    // 1. stateful chain: logit bias (incl. ignore_eos), penalties, grammar
    s->stateful_ = llama_sampler_chain_init(chain_params);
    std::vector<llama_logit_bias> bias;
    for (const auto & [id, b] : params.logit_bias) bias.push_back({id, b});
    if (params.ignore_eos)
        for (int32_t i = 0; i < n_vocab; ++i)
            if (llama_vocab_is_eog(model.vocab, i)) bias.push_back({i, -INFINITY});
    if (!bias.empty())
        llama_sampler_chain_add(s->stateful_, llama_sampler_init_logit_bias(n_vocab, (int32_t)bias.size(), bias.data()));
    const bool penalties = params.repeat_last_n != 0 &&
        (params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f);
    if (penalties) {
        // -1 = the context size (llama-server's older convention and llama-cli's); 0 = off
        int32_t last_n = params.repeat_last_n == -1 ? (n_ctx > 0 ? n_ctx : model.n_ctx_train) : params.repeat_last_n;
        s->penalties_idx_  = llama_sampler_chain_n(s->stateful_);
        s->penalty_last_n_ = last_n;
        llama_sampler_chain_add(s->stateful_, llama_sampler_init_penalties(n_vocab, last_n, params.repeat_penalty,
                                                                          params.frequency_penalty,
                                                                          params.presence_penalty));
    }
    if (!params.grammar.empty()) {
        llama_sampler * g = nullptr;
        if (params.grammar_lazy) {
            // Trigger patterns come from the chat template's tool-call format, not from clients.
            std::vector<const char *> pats;
            for (const auto & p : params.grammar_trigger_patterns) pats.push_back(p.c_str());
            try {
                g = llama_sampler_init_grammar_lazy_patterns(model.vocab, params.grammar.c_str(), "root",
                                                             pats.data(), pats.size(),
                                                             params.grammar_trigger_tokens.data(),
                                                             params.grammar_trigger_tokens.size());
            } catch (const std::exception & e) {
                return invalid_arg(std::string("invalid grammar trigger: ") + e.what(), "grammar");
            }
        } else {
            g = llama_sampler_init_grammar(model.vocab, params.grammar.c_str(), "root");
        }
        if (!g) return invalid_arg("invalid GBNF grammar (parse failed or no 'root' rule)", "grammar");
        if (!params.grammar_lazy && !params.grammar_prefill.empty()) {
            if (Status st = grammar_prefill(g, model.vocab, params.grammar_prefill); !st) {
                llama_sampler_free(g);
                return st;
            }
        }
        llama_sampler_chain_add(s->stateful_, g);
    }
    s->has_state_ = penalties || !params.grammar.empty();

    // 2. truncation + temperature (stateless), llama-server's default order
    s->trunc_ = llama_sampler_chain_init(chain_params);
    if (params.top_k > 0) llama_sampler_chain_add(s->trunc_, llama_sampler_init_top_k(params.top_k));
    if (params.typical_p < 1.0f) llama_sampler_chain_add(s->trunc_, llama_sampler_init_typical(params.typical_p, 1));
    if (params.top_p < 1.0f) llama_sampler_chain_add(s->trunc_, llama_sampler_init_top_p(params.top_p, 1));
    if (params.min_p > 0.0f) llama_sampler_chain_add(s->trunc_, llama_sampler_init_min_p(params.min_p, 1));
    if (params.temperature > 0.0f) llama_sampler_chain_add(s->trunc_, llama_sampler_init_temp(params.temperature));

    if (params.mirostat) {
        s->miro_ = llama_sampler_chain_init(chain_params);
        llama_sampler_chain_add(s->miro_, llama_sampler_init_temp(std::max(params.temperature, 1e-3f)));
        llama_sampler_chain_add(s->miro_, params.mirostat == 1
            ? llama_sampler_init_mirostat(n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100)
            : llama_sampler_init_mirostat_v2(seed, params.mirostat_tau, params.mirostat_eta));
    }
    return s;
}

static void fill_candidates(const float * logits, int32_t n_vocab, std::vector<llama_token_data> & cur) {
    cur.resize(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) cur[i] = {i, logits[i], 0.0f};
}

void Sampler::apply_stateful(llama_sampler * chain, std::vector<llama_token_data> & cur) const {
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(chain, &arr);
    if (arr.data != cur.data()) cur.assign(arr.data, arr.data + arr.size);
    else cur.resize(arr.size);
}

// Softmax over the finite logits of `cur`, sorted by p descending (ids ascending on ties).
static Dist softmax_dist(const std::vector<llama_token_data> & cur) {
    float max_l = -INFINITY;
    for (const auto & c : cur) max_l = std::max(max_l, c.logit);
    Dist d;
    if (!std::isfinite(max_l)) return d;
    double sum = 0;
    for (const auto & c : cur)
        if (std::isfinite(c.logit)) {
            float e = std::exp(c.logit - max_l);
            if (e > 0) { d.push_back({c.id, e}); sum += e; }
        }
    for (auto & tp : d) tp.p = static_cast<float>(tp.p / sum);
    std::sort(d.begin(), d.end(), [](const TokenProb & a, const TokenProb & b) {
        return a.p != b.p ? a.p > b.p : a.id < b.id;
    });
    return d;
}

bool Sampler::stateful_candidates(const float * logits, const std::vector<token_id> & path,
                                  std::vector<llama_token_data> & cur) {
    fill_candidates(logits, n_vocab_, cur);
    if (path.empty() || !has_state_) {
        apply_stateful(stateful_, cur);
        return true;
    }
    // Look ahead along `path` on a clone: the real state is untouched.
    llama_sampler * clone = llama_sampler_clone(stateful_);
    bool ok = true;
    try {
        for (token_id t : path) llama_sampler_accept(clone, t);
        apply_stateful(clone, cur);
    } catch (const std::exception &) {
        ok = false;  // a path token the grammar forbids: nothing can follow it
    }
    llama_sampler_free(clone);
    return ok;
}

Dist Sampler::dist(const float * logits, const std::vector<token_id> & path) {
    std::vector<llama_token_data> cur;
    if (!stateful_candidates(logits, path, cur)) return {};
    if (greedy()) {
        // argmax, lowest id on ties; -inf (banned / grammar-rejected) never wins
        const llama_token_data * best = nullptr;
        for (const auto & c : cur)
            if (std::isfinite(c.logit) && (!best || c.logit > best->logit || (c.logit == best->logit && c.id < best->id)))
                best = &c;
        return best ? dist_one_hot(best->id) : Dist{};
    }
    // Truncation samplers may need probabilities computed from the current logits.
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(trunc_, &arr);
    std::vector<llama_token_data> kept(arr.data, arr.data + arr.size);
    return softmax_dist(kept);
}

Dist Sampler::candidates(const float * logits, const std::vector<token_id> & path) {
    std::vector<llama_token_data> cur;
    if (!stateful_candidates(logits, path, cur)) return {};
    return softmax_dist(cur);
}

float Sampler::candidate_prob(const float * logits, const std::vector<token_id> & path, token_id id) {
    std::vector<llama_token_data> cur;
    if (!stateful_candidates(logits, path, cur)) return 0.0f;
    float max_l = -INFINITY, l_id = -INFINITY;
    for (const auto & c : cur) {
        max_l = std::max(max_l, c.logit);
        if (c.id == id) l_id = c.logit;
    }
    if (!std::isfinite(max_l) || !std::isfinite(l_id)) return 0.0f;
    double sum = 0;
    for (const auto & c : cur)
        if (std::isfinite(c.logit)) sum += std::exp(c.logit - max_l);
    return static_cast<float>(std::exp(l_id - max_l) / sum);
}

token_id Sampler::sample(const Dist & d) { return sample_from(d, rng_); }

token_id Sampler::sample_mirostat(const float * logits) {
    std::vector<llama_token_data> cur;
    fill_candidates(logits, n_vocab_, cur);
    apply_stateful(stateful_, cur);
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(miro_, &arr);
    if (arr.selected < 0 || static_cast<size_t>(arr.selected) >= arr.size) return -1;
    return arr.data[arr.selected].id;
}

void Sampler::accept_prompt(const std::vector<token_id> & prompt) {
    if (penalties_idx_ < 0 || prompt.empty()) return;
    llama_sampler * pen = llama_sampler_chain_get(stateful_, penalties_idx_);
    const size_t n = std::min(prompt.size(), static_cast<size_t>(penalty_last_n_));
    for (size_t i = prompt.size() - n; i < prompt.size(); ++i) llama_sampler_accept(pen, prompt[i]);
}

Status Sampler::accept(token_id id) {
    try {
        llama_sampler_accept(stateful_, id);
        if (miro_) llama_sampler_accept(miro_, id);
    } catch (const std::exception & ex) {
        return Status(ErrorCode::INTERNAL, std::string("sampler rejected an emitted token: ") + ex.what());
    }
    return Status::ok();
}

std::vector<TokenProb> Sampler::top_probs(const float * logits, int32_t n) const {
    std::vector<llama_token_data> cur;
    fill_candidates(logits, n_vocab_, cur);
    Dist d = softmax_dist(cur);
    if (static_cast<int32_t>(d.size()) > n) d.resize(static_cast<size_t>(n));
    return d;
}

}  // namespace specrpc
