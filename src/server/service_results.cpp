// CompletionResult / CompletionChunk / EngineMetrics → JSON, in llama-server's shapes (and the
// OpenAI ones for the v1/ methods). Pure functions.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "server/service.h"

namespace specrpc::server {

namespace {

json bytes_of(const std::string & s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

double safe_log(float p) { return std::log(std::max(static_cast<double>(p), 1e-38)); }

json token_prob(token_id id, const std::string & piece, float p, bool post) {
    json j = {{"id", id}, {"token", piece}, {"bytes", bytes_of(piece)}};
    if (post) j["prob"] = p;
    else j["logprob"] = safe_log(p);
    return j;
}

// A float field as the client wrote it (0.05, not 0.05000000074505806).
double float_value(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.7g", v);
    return std::strtod(buf, nullptr);
}

json field_json(const FieldValue & f) {
    if (f.type[0] == 'b') return f.value != 0;
    if (f.type[0] == 'i') return static_cast<int64_t>(f.value);
    return float_value(f.value);
}

json ids_of(const std::vector<TokenOutput> & toks) {
    json a = json::array();
    for (const auto & t : toks) a.push_back(t.id);
    return a;
}

}  // namespace

const char * stop_type_label(StopType t) {
    switch (t) {
        case StopType::EOS:     return "eos";
        case StopType::WORD:    return "word";
        case StopType::LIMIT:
        case StopType::CONTEXT: return "limit";
        default:                return "none";
    }
}

const char * openai_finish_reason(StopType t) {
    return t == StopType::LIMIT || t == StopType::CONTEXT ? "length" : "stop";
}

// llama-server: post-sampling → {prob, top_probs}; otherwise {logprob, top_logprobs}.
json probs_to_json(const std::vector<TokenOutput> & tokens, bool post) {
    json out = json::array();
    for (const auto & t : tokens) {
        json j   = token_prob(t.id, t.piece, t.prob, post);
        json top = json::array();
        for (const auto & c : t.top) top.push_back(token_prob(c.id, c.piece, c.prob, post));
        j[post ? "top_probs" : "top_logprobs"] = std::move(top);
        out.push_back(std::move(j));
    }
    return out;
}

// llama-server's generation rate: the first token comes from the prompt's last pass, so the rate
// is over the n - 1 tokens after it (0 for a single token).
static double gen_per_second(int32_t n, double ms) { return n > 1 && ms > 0 ? 1e3 * (n - 1) / ms : 0.0; }
static double gen_per_token_ms(int32_t n, double ms) { return n > 1 ? ms / (n - 1) : 0.0; }

json timings_to_json(const CompletionResult & r) {
    const auto & t = r.timings;
    const auto & s = r.spec;
    return {
        {"cache_n", r.tokens_cached},  // llama-server: prompt tokens reused from the slot's KV
        {"prompt_n", t.prompt_n},
        {"prompt_ms", t.prompt_ms},
        {"prompt_per_token_ms", t.prompt_per_token_ms()},
        {"prompt_per_second", t.prompt_per_second()},
        {"predicted_n", t.predicted_n},
        {"predicted_ms", t.predicted_ms},
        {"predicted_per_token_ms", gen_per_token_ms(t.predicted_n, t.predicted_ms)},
        {"predicted_per_second", gen_per_second(t.predicted_n, t.predicted_ms)},
        {"draft_n", s.draft_n},
        {"draft_n_accepted", s.draft_n_accepted},
        {"draft_n_steps", s.draft_n_steps},
        {"draft_accept_rate", s.accept_rate()},
        {"draft_mean_accept_len", s.mean_accept_len()},
        {"draft_accepted_at_pos", s.accepted_at_pos},
        {"draft_drafted_at_pos", s.drafted_at_pos},
        {"draft_gamma_hist", s.gamma_hist},
        {"draft_off_rounds", s.n_off_rounds},
        {"draft_empty_rounds", s.n_empty_rounds},
        {"draft_alpha_prior", s.alpha_prior},
        {"n_steps", s.n_steps},
        {"t_draft_ms", s.t_draft_ms},
        {"t_empty_draft_ms", s.t_empty_draft_ms},
        {"t_verify_ms", s.t_verify_ms},
        {"t_sample_ms", s.t_sample_ms},
    };
}

void rest_timings(json & j) {
    if (!j.is_object() || !j.contains("timings") || !j["timings"].is_object()) return;
    json & t = j["timings"];
    json stats = json::object();
    for (const char * k : {"draft_accepted_at_pos", "draft_drafted_at_pos", "draft_gamma_hist"}) {
        if (!t.contains(k)) continue;
        stats[std::string(k).substr(6)] = std::move(t[k]);
        t.erase(k);
    }
    if (!stats.empty()) j["draft_stats"] = std::move(stats);
}

json StreamClock::timings(int32_t n_predicted) {
    const auto now = std::chrono::steady_clock::now();
    if (n_predicted > 0 && !started) {
        started = true;
        t_first = now;
    }
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const int32_t pn = started ? n_prompt : 0;
    const double  pm = started ? ms(t_first - t0) : 0.0, gm = started ? ms(now - t_first) : 0.0;
    return {{"cache_n", 0},
            {"prompt_n", pn},
            {"prompt_ms", pm},
            {"prompt_per_token_ms", pn ? pm / pn : 0.0},
            {"prompt_per_second", pm > 0 ? 1e3 * pn / pm : 0.0},
            {"predicted_n", n_predicted},
            {"predicted_ms", gm},
            {"predicted_per_token_ms", gen_per_token_ms(n_predicted, gm)},
            {"predicted_per_second", gen_per_second(n_predicted, gm)}};
}

json progress_timings(const PromptProgress & p) {
    const int32_t pn = p.processed - p.cache;
    return {{"cache_n", p.cache}, {"prompt_n", pn}, {"prompt_ms", p.time_ms},
            {"prompt_per_token_ms", pn > 0 ? p.time_ms / pn : 0.0}, {"prompt_per_second", p.time_ms > 0 ? 1e3 * pn / p.time_ms : 0.0},
            {"predicted_n", 0}, {"predicted_ms", 0.0}, {"predicted_per_token_ms", 0.0}, {"predicted_per_second", 0.0}};
}

json progress_to_json(const PromptProgress & p) {
    return {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", p.time_ms}};
}

json result_to_json(const CompletionResult & r, const CompletionRequest & req, const Engine & engine,
                    const std::vector<std::string> & warnings, const std::string & model_name) {
    json j = {
        {"index", 0},
        {"content", r.content},
        {"tokens", ids_of(r.tokens)},
        {"id_slot", r.slot_id},
        {"stop", true},
        {"model", model_name},
        {"tokens_predicted", r.tokens_predicted},
        {"tokens_evaluated", r.tokens_evaluated},
        {"tokens_cached", r.tokens_cached},
        {"generation_settings", generation_settings(req, engine)},
        {"prompt", engine.detokenize(req.prompt, true)},
        {"has_new_line", r.content.find('\n') != std::string::npos},
        {"truncated", r.truncated || r.stop_type == StopType::CONTEXT},  // llama-server: also the context's end
        {"stop_type", stop_type_label(r.stop_type)},
        {"stopping_word", r.stopping_word},
        {"stopped_eos", r.stop_type == StopType::EOS},
        {"stopped_word", r.stop_type == StopType::WORD},
        {"stopped_limit", r.stop_type == StopType::LIMIT || r.stop_type == StopType::CONTEXT},
        {"timings", timings_to_json(r)},
    };
    if (r.stop_type == StopType::CANCELLED) j["cancelled"] = true;
    if (req.sampling.n_probs > 0)
        j["completion_probabilities"] = probs_to_json(r.tokens, req.sampling.post_sampling_probs);
    std::vector<std::string> all = warnings;
    all.insert(all.end(), r.warnings.begin(), r.warnings.end());
    if (!all.empty()) j["warnings"] = all;
    return j;
}

json chunk_to_json(const CompletionChunk & c, const CompletionRequest & req, int32_t n_so_far) {
    json j = {{"index", 0},
              {"content", c.content},
              {"tokens", ids_of(c.tokens)},
              {"stop", false},
              {"tokens_predicted", n_so_far}};
    if (req.sampling.n_probs > 0)
        j["completion_probabilities"] = probs_to_json(c.tokens, req.sampling.post_sampling_probs);
    return j;
}

json metrics_to_json(const EngineMetrics & m, const EngineInfo & info) {
    return {
        {"requests_done", m.requests_done},
        {"requests_cancelled", m.requests_cancelled},
        {"requests_failed", m.requests_failed},
        {"prompt_tokens_total", m.tokens_evaluated},
        {"prompt_ms_total", m.t_prompt_ms},
        {"tokens_predicted_total", m.tokens_predicted},
        {"predicted_ms_total", m.t_predicted_ms},
        {"requests_processing", m.slots_busy},
        {"requests_deferred", m.queue_len},
        {"draft_n", m.draft_n},
        {"draft_n_accepted", m.draft_n_accepted},
        {"draft_n_steps", m.draft_n_steps},
        {"draft_accept_rate", m.draft_n ? double(m.draft_n_accepted) / double(m.draft_n) : 0.0},
        {"n_ctx", info.n_ctx_slot},
        {"total_slots", info.n_parallel},
    };
}

std::string metrics_to_prometheus(const EngineMetrics & m, const EngineInfo & info, const ServiceCounters & c) {
    struct Metric {
        const char * name;
        const char * type;
        const char * help;
        double       value;
    };
    const double prompt_s = m.t_prompt_ms / 1e3, pred_s = m.t_predicted_ms / 1e3;
    const Metric metrics[] = {
        {"prompt_tokens_total", "counter", "Number of prompt tokens processed.", double(m.tokens_evaluated)},
        {"prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache (no decode).",
         double(c.tokens_cached)},
        {"prompt_seconds_total", "counter", "Prompt process time", prompt_s},
        {"n_decode_total", "counter", "Target decode passes of finished requests (prompt batches and generation steps).",
         double(c.n_decode)},
        {"n_tokens_max", "counter", "Largest context a request has filled (cached + prompt + generated tokens).",
         double(c.n_tokens_max)},
        {"tokens_predicted_total", "counter", "Number of generation tokens processed.", double(m.tokens_predicted)},
        {"tokens_predicted_seconds_total", "counter", "Predict process time", pred_s},
        {"requests_total", "counter", "Requests finished (including cancelled).", double(m.requests_done)},
        {"requests_cancelled_total", "counter", "Requests cancelled.", double(m.requests_cancelled)},
        {"requests_failed_total", "counter", "Requests that failed.", double(m.requests_failed)},
        {"prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s since the previous scrape.",
         c.window_prompt_ms > 0 ? 1e3 * double(c.window_prompt_n) / c.window_prompt_ms : 0.0},
        {"predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s since the previous scrape.",
         c.window_predicted_ms > 0 ? 1e3 * double(c.window_predicted_n) / c.window_predicted_ms : 0.0},
        {"requests_processing", "gauge", "Number of requests processing.", double(m.slots_busy)},
        {"requests_deferred", "gauge", "Number of requests deferred.", double(m.queue_len)},
        {"n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         double(m.n_busy_slots) / double(std::max<int64_t>(m.n_decode, 1))},
        {"n_ctx", "gauge", "Context size per slot.", double(info.n_ctx_slot)},
        {"spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed for verification.",
         double(m.draft_n)},
        {"spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted by the target.",
         double(m.draft_n_accepted)},
        {"spec_decode_num_drafts_total", "counter", "Verification passes that carried a draft.",
         double(m.draft_n_steps)},
        {"spec_decode_draft_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
         m.draft_n ? double(m.draft_n_accepted) / double(m.draft_n) : 0.0},
    };
    std::string out;
    char        buf[512];
    for (const auto & x : metrics) {
        std::snprintf(buf, sizeof buf, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %.17g\n", x.name,
                      x.help, x.name, x.type, x.name, x.value);
        out += buf;
    }
    return out;
}

// ---- settings ------------------------------------------------------------------------------

json completion_params_schema() {
    auto lim = [](double lo, double hi) -> json {
        if (std::isinf(lo) && std::isinf(hi)) return nullptr;
        return json::array({std::isinf(lo) ? json(nullptr) : json(lo), std::isinf(hi) ? json(nullptr) : json(hi)});
    };
    json out = json::array();
    auto add = [&](const FieldValue & f, const std::string & prefix) {
        out.push_back({{"name", prefix + f.name}, {"type", f.type}, {"default", field_json(f)},
                       {"hard", lim(f.hard_min, f.hard_max)}, {"soft", lim(f.soft_min, f.soft_max)}, {"doc", f.doc}});
    };
    for (const auto & f : request_fields(CompletionRequest{})) add(f, "");
    for (const auto & f : spec_fields(SpecParams{})) add(f, "speculative.");
    out.push_back({{"name", "prompt"}, {"type", "string | [string | token id]"}, {"doc", "required"}});
    out.push_back({{"name", "stop"}, {"type", "string | [string]"}, {"hard", {0, kCaps.stop_max}}});
    out.push_back({{"name", "logit_bias"}, {"type", "[[id|text, bias|false]] | {id|text: bias}"},
                   {"hard", {0, kCaps.logit_bias_max}}, {"soft", {-100, 100}}});
    out.push_back({{"name", "grammar"}, {"type", "string (GBNF)"}, {"hard", {0, kCaps.grammar_len_max}}});
    out.push_back({{"name", "speculative.type"}, {"type", "string | [string]"},
                   {"doc", "draft, ngram, lookup, synth, none; default: the server's"}});
    out.push_back({{"name", "tfs_z"}, {"type", "number"}, {"doc", "accepted and ignored (warning)"}});
    return out;
}

json spec_settings(const SpecParams & sp) {
    json types = json::array();
    for (SpecType t : sp.types) types.push_back(spec_type_name(t));
    json j = {{"type", types}};
    for (const auto & f : spec_fields(sp)) j[f.name] = field_json(f);
    if (!sp.synth_rates.empty()) j["synth_rates"] = sp.synth_rates;
    return j;
}

json generation_settings(const CompletionRequest & req, const Engine & engine) {
    json j;
    for (const auto & f : request_fields(req)) j[f.name] = field_json(f);
    j["max_tokens"] = req.n_predict;
    j["n_ctx"]      = engine.info().n_ctx_slot;
    j["stop"]       = req.stop;
    j["grammar"]    = req.sampling.grammar;
    j["adaptive_target"] = -1.0;  // llama.cpp's adaptive-p sampler: not provided here (disabled)
    j["adaptive_decay"]  = 0.9;
    // llama-server's form: {token, bias}, a ban (-inf) as null; ignore_eos shows as a ban of EOS
    json bias = json::array();
    for (const auto & [id, b] : req.sampling.logit_bias)
        bias.push_back({{"token", id}, {"bias", std::isinf(b) ? json(nullptr) : json(b)}});
    if (req.sampling.ignore_eos && engine.info().eos >= 0) bias.push_back({{"token", engine.info().eos}, {"bias", nullptr}});
    j["logit_bias"]  = bias;
    j["model"]       = engine.info().model_path;
    j["speculative"] = spec_settings(req.spec);
    j["speculative.n_max"] = req.spec.n_max;  // llama-server's flat names
    j["speculative.n_min"] = req.spec.n_min;
    j["speculative.p_min"] = float_value(req.spec.p_min);
    return j;
}

// ---- OpenAI shapes -----------------------------------------------------------------------------

json oai_usage(const CompletionResult & r) {
    return {{"prompt_tokens", r.tokens_evaluated},
            {"completion_tokens", r.tokens_predicted},
            {"total_tokens", r.tokens_evaluated + r.tokens_predicted},
            {"prompt_tokens_details", {{"cached_tokens", r.tokens_cached}}},
            {"completion_tokens_details",
             {{"accepted_prediction_tokens", r.spec.draft_n_accepted},
              {"rejected_prediction_tokens", r.spec.draft_n - r.spec.draft_n_accepted}}}};
}

// OpenAI `logprobs` from the per-token probabilities (null unless the request asked for them).
static json oai_logprobs(const CompletionResult & r, bool chat) {
    bool any = false;
    for (const auto & t : r.tokens) any |= !t.top.empty();
    if (!any) return nullptr;
    auto lp = [](float p) { return p > 0 ? std::log(p) : -9999.0; };
    if (chat) return {{"content", probs_to_json(r.tokens, false)}};  // llama-server's: with id and bytes
    json tokens = json::array(), token_lp = json::array(), top_lp = json::array(), offsets = json::array();
    size_t offset = 0;
    for (const auto & t : r.tokens) {
        tokens.push_back(t.piece);
        token_lp.push_back(lp(t.prob));
        json top = json::object();
        for (const auto & c : t.top) top[c.piece] = lp(c.prob);
        top_lp.push_back(top);
        offsets.push_back(offset);
        offset += t.piece.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_lp}, {"top_logprobs", top_lp}, {"text_offset", offsets}};
}

json oai_result(const CompletionResult & r, const OaiMeta & meta, bool chat, bool rest_stream_final) {
    json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(r.stop_type)}};
    const std::string text = rest_stream_final ? std::string() : r.content;
    if (chat) {
        if (rest_stream_final) choice["delta"] = json::object();
        else if (!meta.message.is_null()) {
            choice["message"] = meta.message;  // parsed by the chat template: tool calls, reasoning
            if (meta.message.contains("tool_calls") && !meta.message["tool_calls"].empty())
                choice["finish_reason"] = "tool_calls";
        } else choice["message"] = {{"role", "assistant"}, {"content", text}};
        choice["logprobs"] = rest_stream_final ? json(nullptr) : oai_logprobs(r, true);
    } else {
        choice["text"]     = text;
        choice["logprobs"] = rest_stream_final ? json(nullptr) : oai_logprobs(r, false);
    }
    const char * object = chat ? (rest_stream_final ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    json j = {{"id", meta.id},         {"object", object},        {"created", meta.created},
              {"model", meta.model},   {"system_fingerprint", meta.fingerprint},
              {"choices", json::array({choice})}, {"usage", oai_usage(r)}, {"timings", timings_to_json(r)}};
    if (!meta.warnings.empty()) j["warnings"] = meta.warnings;
    return j;
}

json oai_chunk(const std::string & content, const OaiMeta & meta, bool chat, bool first) {
    json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (chat) {
        choice["delta"] = first ? json{{"role", "assistant"}, {"content", nullptr}} : json{{"content", content}};
    } else {
        choice["text"]     = content;
        choice["logprobs"] = nullptr;
    }
    return {{"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", meta.fingerprint},
            {"choices", json::array({choice})}};
}

}  // namespace specrpc::server
