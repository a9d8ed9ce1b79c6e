// JSON → CompletionRequest. One table drives the scalar fields: name, type, default (the
// engine's struct defaults), hard limits (outside: -32602 naming the field) and soft limits
// (outside: clamped, with a note in the result's `warnings`). Structured fields (prompt, stop,
// logit_bias, grammar, speculative) have their own parsers below, with their caps listed in
// kCaps. `null` means "default" for every field; unknown fields are ignored, as llama-server does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "server/service.h"

namespace specrpc::server {

namespace {

constexpr double INF = std::numeric_limits<double>::infinity();


enum class Kind { INT, FLOAT, BOOL };

// A scalar field of T (CompletionRequest or SpecParams).
template <typename T> struct Field {
    const char * name;
    Kind         kind;
    double       hard_min, hard_max;  // inclusive; outside → -32602
    double       soft_min, soft_max;  // inclusive; outside → clamped + warning
    void (*set)(T &, double);
    double (*get)(const T &);
    const char * doc;
};

using R = CompletionRequest;
using S = SpecParams;

// The setter and getter of a struct member, for the tables below.
#define SPR_FIELD(T, m)                                                                  \
    [](T & x, double v) { x.m = static_cast<std::remove_reference_t<decltype(x.m)>>(v); }, \
        [](const T & x) -> double { return static_cast<double>(x.m); }

// Request fields, in llama-server's order of /completion's documentation.
//   name                   type         hard min   hard max            soft min soft max        member
const Field<R> kFields[] = {
    {"n_predict",           Kind::INT,   -1,        INT32_MAX,          -INF, INF,    SPR_FIELD(R, n_predict),
     "tokens to generate, -1 = until EOS or the context is full (alias max_tokens); any larger value is a cap, as in llama-server"},
    {"n_keep",              Kind::INT,   -1,        INT32_MAX,          -INF, INF,    SPR_FIELD(R, n_keep),
     "prompt tokens kept when the prompt is truncated or the context shifts, -1 = all"},
    {"temperature",         Kind::FLOAT, -INF,      INF,                -INF, 100,    SPR_FIELD(R, sampling.temperature), "<= 0: greedy"},
    {"top_k",               Kind::INT,   INT32_MIN, INT32_MAX,          -INF, INF,    SPR_FIELD(R, sampling.top_k), "<= 0: off"},
    {"top_p",               Kind::FLOAT, -INF,      INF,                0,    1,      SPR_FIELD(R, sampling.top_p), "1: off"},
    {"min_p",               Kind::FLOAT, -INF,      INF,                0,    1,      SPR_FIELD(R, sampling.min_p), "0: off"},
    {"typical_p",           Kind::FLOAT, -INF,      INF,                0,    1,      SPR_FIELD(R, sampling.typical_p), "1: off"},
    {"repeat_penalty",      Kind::FLOAT, 1e-9,      INF,                -INF, 100,    SPR_FIELD(R, sampling.repeat_penalty), "> 0; 1: off"},
    {"repeat_last_n",       Kind::INT,   -1,        INT32_MAX,          -INF, 1 << 20, SPR_FIELD(R, sampling.repeat_last_n),
     "tokens the penalties see, -1 = context size"},
    {"presence_penalty",    Kind::FLOAT, -INF,      INF,                -2,   2,      SPR_FIELD(R, sampling.presence_penalty), "0: off"},
    {"frequency_penalty",   Kind::FLOAT, -INF,      INF,                -2,   2,      SPR_FIELD(R, sampling.frequency_penalty), "0: off"},
    {"mirostat",            Kind::INT,   0,         2,                  -INF, INF,    SPR_FIELD(R, sampling.mirostat),
     "0 off, 1 or 2 (disables speculation)"},
    {"mirostat_tau",        Kind::FLOAT, 0,         INF,                -INF, 100,    SPR_FIELD(R, sampling.mirostat_tau), "target entropy"},
    {"mirostat_eta",        Kind::FLOAT, 0,         INF,                -INF, 1,      SPR_FIELD(R, sampling.mirostat_eta), "learning rate"},
    {"seed",                Kind::INT,   -INF,      4294967295.0,       -INF, INF,
     [](R & r, double v) { r.sampling.seed = v < 0 ? 0xFFFFFFFFu : static_cast<uint32_t>(v); },
     [](const R & r) -> double { return r.sampling.seed; }, "RNG seed; negative or 4294967295 = random"},
    {"ignore_eos",          Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, sampling.ignore_eos),
     "do not stop at end-of-generation tokens"},
    {"n_probs",             Kind::INT,   0,         INT32_MAX,          0,    kCaps.n_probs_max, SPR_FIELD(R, sampling.n_probs),
     "top-n probabilities reported per token"},
    {"post_sampling_probs", Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, sampling.post_sampling_probs),
     "probabilities after the sampler chain"},
    {"cache_prompt",        Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, cache_prompt), "reuse the slot's KV prefix"},
    {"stream",              Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, stream), "send completion.chunk notifications"},
    {"truncate",            Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, truncate_prompt),
     "prompt too long: keep n_keep + the tail"},
    {"context_shift",       Kind::BOOL,  0,         1,                  0,    1,      SPR_FIELD(R, context_shift),
     "context full: drop tokens after n_keep and go on"},
};

// Per-request speculation: `speculative: {...}` or llama-server's flat `speculative.n_max` keys.
const Field<S> kSpecFields[] = {
    {"n_max",              Kind::INT,   0, S::kMaxDraft, -INF, INF, SPR_FIELD(S, n_max), "max draft length"},
    {"n_min",              Kind::INT,   0, S::kMaxDraft, -INF, INF, SPR_FIELD(S, n_min), "min draft length (<= n_max)"},
    {"p_min",              Kind::FLOAT, -1, 1, -INF, INF, SPR_FIELD(S, p_min), "draft model: stop below this probability (-1: learned stop when greedy, none when sampled)"},
    {"adaptive",           Kind::BOOL,  0, 1,  0,    1,   SPR_FIELD(S, adaptive), "choose the draft length from the cost model"},
    {"n_parallel",         Kind::INT,   1, 16, -INF, INF, SPR_FIELD(S, n_parallel), "draft tree branches (1 = chain)"},
    {"p_split",            Kind::FLOAT, 0, 1,  -INF, INF, SPR_FIELD(S, p_split), "tree: branch above this draft probability"},
    {"ngram_min",          Kind::INT,   1, 4,  -INF, INF, SPR_FIELD(S, ngram_min), "shortest n-gram / lookup match"},
    {"ngram_max",          Kind::INT,   1, 4,  -INF, INF, SPR_FIELD(S, ngram_max), "longest n-gram / lookup match"},
    {"sample_and_compare", Kind::BOOL,  0, 1,  0,    1,   SPR_FIELD(S, sample_and_compare), "T>0: greedy draft, one-hot verify"},
    {"verifier",           Kind::INT,   0, 3,  -INF, INF,
     [](S & x, double v) { x.verifier = static_cast<SpecVerifier>(static_cast<int32_t>(v)); },
     [](const S & x) -> double { return static_cast<double>(x.verifier); },
     "T>0: 0 auto (coupled if seeded, else block), 1 token-wise, 2 block, 3 coupled"},
};
#undef SPR_FIELD

using Err = rpc::RpcError;

std::string fmt_num(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

// Reads one scalar per its Field spec. Returns an error, or nullopt with *out set (clamped).
template <typename T>
std::optional<Err> read_scalar(const Field<T> & f, const json & v, const std::string & param, double * out,
                               std::vector<std::string> & warnings) {
    if (f.kind == Kind::BOOL) {
        if (!v.is_boolean()) return rpc::invalid_params(param + " must be a boolean", param);
        *out = v.get<bool>() ? 1 : 0;
        return std::nullopt;
    }
    if (!v.is_number()) return rpc::invalid_params(param + " must be a number", param);
    double x = v.get<double>();
    if (!std::isfinite(x)) return rpc::invalid_params(param + " must be finite", param);
    if (f.kind == Kind::INT && x != std::floor(x)) return rpc::invalid_params(param + " must be an integer", param);
    if (x < f.hard_min || x > f.hard_max) {
        std::string range = "[" + (std::isinf(f.hard_min) ? std::string("-inf") : fmt_num(f.hard_min)) + ", " +
                            (std::isinf(f.hard_max) ? std::string("inf") : fmt_num(f.hard_max)) + "]";
        return rpc::invalid_params(param + " = " + fmt_num(x) + " is out of range " + range, param);
    }
    if (x < f.soft_min || x > f.soft_max) {
        const double c = x < f.soft_min ? f.soft_min : f.soft_max;
        warnings.push_back(param + " = " + fmt_num(x) + " clamped to " + fmt_num(c));
        x = c;
    }
    *out = x;
    return std::nullopt;
}

// Tokenises text with the engine's guards; errors name `param`.
std::variant<std::vector<token_id>, Err> tokenize_param(const Engine & e, const std::string & text, bool add_bos,
                                                        bool parse_special, const std::string & param) {
    auto r = e.tokenize(text, add_bos, parse_special);
    if (!r) return rpc::invalid_params(r.status().message(), param);
    return std::move(r.value());
}

// prompt: a string, an array of token ids, or a mixed array of strings and ids (a one-element
// array holding such an array is accepted too, as llama-server does). BOS is added in front of a
// leading string when the model wants one.
std::optional<Err> parse_prompt(const json & p, const Engine & e, std::vector<token_id> & out) {
    const int32_t n_vocab = e.info().n_vocab;
    const bool    add_bos = e.info().add_bos;
    if (p.is_string()) {
        auto t = tokenize_param(e, p.get<std::string>(), add_bos, true, "prompt");
        if (auto * err = std::get_if<Err>(&t)) return *err;
        out = std::move(std::get<0>(t));
        return std::nullopt;
    }
    if (!p.is_array()) return rpc::invalid_params("prompt must be a string or an array of strings and token ids", "prompt");
    const json * arr = &p;
    if (p.size() == 1 && p[0].is_array()) arr = &p[0];
    if (arr->empty()) return rpc::invalid_params("prompt is empty", "prompt");
    // llama-server: an array of only strings is several prompts; strings mixed with ids are one
    const bool all_strings = std::all_of(arr->begin(), arr->end(), [](const json & el) { return el.is_string(); });
    if (all_strings && arr->size() > 1)
        return rpc::invalid_params("several prompts are answered by `completion` only (one result each)", "prompt");
    for (size_t i = 0; i < arr->size(); ++i) {
        const json & el = (*arr)[i];
        if (el.is_number_integer()) {
            const int64_t id = el.get<int64_t>();
            if (id < 0 || id >= n_vocab)
                return rpc::invalid_params("prompt token id " + std::to_string(id) + " at index " + std::to_string(i) +
                                               " is out of range [0, " + std::to_string(n_vocab) + ")",
                                           "prompt");
            out.push_back(static_cast<token_id>(id));
        } else if (el.is_string()) {
            auto t = tokenize_param(e, el.get<std::string>(), add_bos && i == 0, true, "prompt");
            if (auto * err = std::get_if<Err>(&t)) return *err;
            auto & v = std::get<0>(t);
            out.insert(out.end(), v.begin(), v.end());
        } else if (el.is_array()) {
            return rpc::invalid_params("several prompts in one request are not supported", "prompt");
        } else {
            return rpc::invalid_params("prompt element " + std::to_string(i) + " must be a string or a token id",
                                       "prompt");
        }
    }
    return std::nullopt;
}

std::optional<Err> parse_stop(const json & v, std::vector<std::string> & out, std::vector<std::string> & warnings) {
    if (v.is_string()) {
        if (!v.get_ref<const std::string &>().empty()) out.push_back(v.get<std::string>());
        return std::nullopt;
    }
    if (!v.is_array()) return rpc::invalid_params("stop must be a string or an array of strings", "stop");
    if (v.size() > kCaps.stop_max)
        return rpc::invalid_params("stop has " + std::to_string(v.size()) + " strings, at most " +
                                       std::to_string(kCaps.stop_max) + " are allowed",
                                   "stop");
    for (const json & s : v) {
        if (!s.is_string()) return rpc::invalid_params("stop must contain only strings", "stop");
        const std::string & str = s.get_ref<const std::string &>();
        if (str.size() > kCaps.stop_len_max)
            return rpc::invalid_params("a stop string is longer than " + std::to_string(kCaps.stop_len_max) + " bytes",
                                       "stop");
        if (str.empty()) {
            warnings.push_back("stop: empty string ignored");
            continue;
        }
        out.push_back(str);
    }
    return std::nullopt;
}

// One logit-bias value: a number (soft-clamped to [-100, 100]) or false (ban).
std::optional<Err> bias_value(const json & v, float * out, std::vector<std::string> & warnings) {
    if (v.is_boolean()) {
        if (v.get<bool>()) return rpc::invalid_params("logit_bias value true is not allowed (use a number or false)",
                                                      "logit_bias");
        *out = -INFINITY;
        return std::nullopt;
    }
    if (!v.is_number()) return rpc::invalid_params("logit_bias values must be numbers or false", "logit_bias");
    double b = v.get<double>();
    if (!std::isfinite(b)) return rpc::invalid_params("logit_bias values must be finite", "logit_bias");
    if (b < -100 || b > 100) {
        warnings.push_back("logit_bias value " + fmt_num(b) + " clamped to [-100, 100]");
        b = b < 0 ? -100 : 100;
    }
    *out = static_cast<float>(b);
    return std::nullopt;
}

// A logit-bias key: a token id (number or decimal string) or a text whose every token is biased.
std::optional<Err> bias_key(const json & k, const Engine & e, std::vector<token_id> & ids) {
    const int32_t n_vocab = e.info().n_vocab;
    auto check_id = [&](int64_t id) -> std::optional<Err> {
        if (id < 0 || id >= n_vocab)
            return rpc::invalid_params("logit_bias token id " + std::to_string(id) + " is out of range [0, " +
                                           std::to_string(n_vocab) + ")",
                                       "logit_bias");
        ids.push_back(static_cast<token_id>(id));
        return std::nullopt;
    };
    if (k.is_number_integer()) return check_id(k.get<int64_t>());
    if (!k.is_string()) return rpc::invalid_params("logit_bias keys must be token ids or strings", "logit_bias");
    const std::string & s = k.get_ref<const std::string &>();
    if (!s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos)
        return check_id(std::stoll(s));
    auto t = tokenize_param(e, s, false, false, "logit_bias");
    if (auto * err = std::get_if<Err>(&t)) return *err;
    for (token_id id : std::get<0>(t)) ids.push_back(id);
    return std::nullopt;
}

// logit_bias: [[id|"text", bias|false], ...] or {"id"|"text": bias|false, ...}.
std::optional<Err> parse_logit_bias(const json & v, const Engine & e, std::vector<std::pair<token_id, float>> & out,
                                    std::vector<std::string> & warnings) {
    if (!v.is_array() && !v.is_object())
        return rpc::invalid_params("logit_bias must be an array of [token, bias] pairs or an object", "logit_bias");
    if (v.size() > kCaps.logit_bias_max)
        return rpc::invalid_params("logit_bias has more than " + std::to_string(kCaps.logit_bias_max) + " entries",
                                   "logit_bias");
    auto add = [&](const json & key, const json & val) -> std::optional<Err> {
        float bias = 0;
        if (auto err = bias_value(val, &bias, warnings)) return err;
        std::vector<token_id> ids;
        if (auto err = bias_key(key, e, ids)) return err;
        for (token_id id : ids) out.emplace_back(id, bias);
        if (out.size() > kCaps.logit_bias_max)
            return rpc::invalid_params("logit_bias expands to more than " + std::to_string(kCaps.logit_bias_max) +
                                           " tokens",
                                       "logit_bias");
        return std::nullopt;
    };
    if (v.is_object()) {
        for (auto it = v.begin(); it != v.end(); ++it)
            if (auto err = add(json(it.key()), it.value())) return err;
        return std::nullopt;
    }
    for (const json & pair : v) {
        if (!pair.is_array() || pair.size() != 2)
            return rpc::invalid_params("logit_bias entries must be [token, bias] pairs", "logit_bias");
        if (auto err = add(pair[0], pair[1])) return err;
    }
    return std::nullopt;
}

std::optional<Err> parse_spec_types(const json & v, std::vector<SpecType> & out) {
    std::string list;
    if (v.is_string()) {
        list = v.get<std::string>();
    } else if (v.is_array()) {
        for (const json & n : v) {
            if (!n.is_string()) return rpc::invalid_params("speculative.type must hold strings", "speculative.type");
            list += n.get<std::string>() + ",";
        }
    } else {
        return rpc::invalid_params("speculative.type must be a string or a list of strings", "speculative.type");
    }
    if (Status st = spec_types_parse(list, &out); !st) return rpc::invalid_params(st.message(), "speculative.type");
    return std::nullopt;
}

// One speculative field (`key` without the "speculative." prefix).
std::optional<Err> parse_spec_field(const std::string & key, const json & v, const Engine & e, SpecParams & sp,
                                    std::vector<std::string> & warnings) {
    const std::string param = "speculative." + key;
    if (v.is_null()) return std::nullopt;
    if (key == "type" || key == "types") return parse_spec_types(v, sp.types);
    if (key == "synth_rates") {
        if (!v.is_array() || v.size() > 64)
            return rpc::invalid_params(param + " must be an array of at most 64 numbers", param);
        sp.synth_rates.clear();
        for (const json & x : v) {
            if (!x.is_number() || !(x.get<double>() >= 0 && x.get<double>() <= 1))
                return rpc::invalid_params(param + " values must be numbers in [0, 1]", param);
            sp.synth_rates.push_back(x.get<float>());
        }
        return std::nullopt;
    }
    if (key == "synth_reference") {
        if (!v.is_array() || v.size() > kCaps.synth_ref_max)
            return rpc::invalid_params(param + " must be an array of token ids", param);
        sp.synth_reference.clear();
        for (const json & x : v) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= e.info().n_vocab)
                return rpc::invalid_params(param + " must hold token ids in [0, n_vocab)", param);
            sp.synth_reference.push_back(x.get<token_id>());
        }
        return std::nullopt;
    }
    for (const auto & f : kSpecFields) {
        if (key != f.name) continue;
        double x = 0;
        if (auto err = read_scalar(f, v, param, &x, warnings)) return err;
        f.set(sp, x);
        return std::nullopt;
    }
    warnings.push_back("unknown field " + param + " ignored");
    return std::nullopt;
}

}  // namespace

std::variant<ParsedCompletion, rpc::RpcError> parse_completion(const json & params, const Engine & engine,
                                                               const CompletionRequest * defaults) {
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    ParsedCompletion pc;
    CompletionRequest & req = pc.req;
    if (defaults) req = *defaults;
    req.spec = engine.default_spec();
    auto & warnings = pc.warnings;

    // 1. prompt (required)
    auto pit = params.find("prompt");
    if (pit == params.end() || pit->is_null()) return rpc::invalid_params("prompt is required", "prompt");
    if (auto err = parse_prompt(*pit, engine, req.prompt)) return *err;
    pc.prompt_json = *pit;

    // 2. scalar fields from the table (max_tokens is n_predict's alias)
    for (const auto & f : kFields) {
        auto it = params.find(f.name);
        if ((it == params.end() || it->is_null()) && std::string(f.name) == "n_predict") it = params.find("max_tokens");
        if (it == params.end() || it->is_null()) continue;
        double x = 0;
        const std::string param = it.key();
        if (auto err = read_scalar(f, *it, param, &x, warnings)) return *err;
        f.set(req, x);
    }

    // 3. structured fields
    if (auto it = params.find("stop"); it != params.end() && !it->is_null())
        if (auto err = parse_stop(*it, req.stop, warnings)) return *err;
    if (auto it = params.find("logit_bias"); it != params.end() && !it->is_null())
        if (auto err = parse_logit_bias(*it, engine, req.sampling.logit_bias, warnings)) return *err;
    if (auto it = params.find("grammar"); it != params.end() && !it->is_null()) {
        if (!it->is_string()) return rpc::invalid_params("grammar must be a string (GBNF)", "grammar");
        if (it->get_ref<const std::string &>().size() > kCaps.grammar_len_max)
            return rpc::invalid_params("grammar is longer than " + std::to_string(kCaps.grammar_len_max) + " bytes",
                                       "grammar");
        req.sampling.grammar = it->get<std::string>();
    }
    {
        auto schema = requested_json_schema(params);
        if (auto * err = std::get_if<rpc::RpcError>(&schema)) return *err;
        const json & js = std::get<json>(schema);
        if (!js.is_null()) {
            if (!req.sampling.grammar.empty())
                return rpc::invalid_params("Cannot use both json_schema and grammar", "json_schema");
            if (!js.is_object()) return rpc::invalid_params("json_schema must be an object", "json_schema");
            auto g = json_schema_to_gbnf(js.dump());
            if (!g) return rpc::invalid_params(g.status().message(), "json_schema");
            req.sampling.grammar = g.value();
        }
    }
    if (auto it = params.find("speculative"); it != params.end() && !it->is_null()) {
        if (!it->is_object()) return rpc::invalid_params("speculative must be an object", "speculative");
        for (auto s = it->begin(); s != it->end(); ++s)
            if (auto err = parse_spec_field(s.key(), s.value(), engine, req.spec, warnings)) return *err;
    }
    for (auto it = params.begin(); it != params.end(); ++it) {  // llama-server's flat keys
        if (it.key().rfind("speculative.", 0) == 0)
            if (auto err = parse_spec_field(it.key().substr(12), it.value(), engine, req.spec, warnings)) return *err;
    }
    if (req.spec.n_min > req.spec.n_max)
        return rpc::invalid_params("speculative.n_min must be <= speculative.n_max", "speculative.n_min");
    if (req.spec.ngram_min > req.spec.ngram_max)
        return rpc::invalid_params("speculative.ngram_min must be <= speculative.ngram_max", "speculative.ngram_min");
    for (SpecType t : req.spec.types)
        if (t == SpecType::DRAFT && engine.info().draft_path.empty())
            return rpc::invalid_params(kDraftNeedsModel,
                                       "speculative.type");

    // 4. accepted and ignored
    if (auto it = params.find("tfs_z"); it != params.end() && !it->is_null()) {
        if (!it->is_number()) return rpc::invalid_params("tfs_z must be a number", "tfs_z");
        warnings.push_back("tfs_z is not supported by llama.cpp any more and was ignored");
    }
    if (auto it = params.find("id_slot"); it != params.end() && !it->is_null()) {
        if (!it->is_number_integer()) return rpc::invalid_params("id_slot must be an integer", "id_slot");
        const int64_t id = it->get<int64_t>();
        if (id < -1 || id >= engine.info().n_parallel)
            return rpc::invalid_params("id_slot " + std::to_string(id) + " does not exist (slots 0.." +
                                           std::to_string(engine.info().n_parallel - 1) + ", -1 = any)", "id_slot");
        req.id_slot = static_cast<int32_t>(id);
    }

    // 5. the context: the prompt must leave room for at least one generated token
    const int32_t n_ctx = engine.info().n_ctx_slot;
    if (static_cast<int32_t>(req.prompt.size()) >= n_ctx && !req.truncate_prompt) {
        return rpc::make_error(rpc::ERR_CONTEXT_EXCEEDED,
                               "the request exceeds the available context size: the prompt has " +
                                   std::to_string(req.prompt.size()) +
                                   " tokens, the context per slot is " + std::to_string(n_ctx) +
                                   " (set truncate: true to keep its tail)",
                               json{{"n_prompt_tokens", req.prompt.size()}, {"n_ctx", n_ctx}});
    }
    if (req.n_keep > n_ctx / 2) {
        warnings.push_back("n_keep = " + std::to_string(req.n_keep) + " clamped to " + std::to_string(n_ctx / 2));
        req.n_keep = n_ctx / 2;
    }
    return pc;
}

template <typename T> std::vector<FieldValue> field_values(const Field<T> * fields, size_t n, const T & x) {
    std::vector<FieldValue> out;
    for (size_t i = 0; i < n; ++i) {
        const Field<T> & f = fields[i];
        const char * type = f.kind == Kind::INT ? "integer" : f.kind == Kind::FLOAT ? "number" : "boolean";
        out.push_back({f.name, type, f.hard_min, f.hard_max, f.soft_min, f.soft_max, f.get(x), f.doc});
    }
    return out;
}

std::vector<FieldValue> request_fields(const CompletionRequest & req) {
    return field_values(kFields, std::size(kFields), req);
}

std::vector<FieldValue> spec_fields(const SpecParams & sp) { return field_values(kSpecFields, std::size(kSpecFields), sp); }

std::variant<json, rpc::RpcError> requested_json_schema(const json & params) {
    json schema = params.value("json_schema", json(nullptr));
    if (auto it = params.find("response_format"); it != params.end() && !it->is_null()) {
        if (!it->is_object()) return rpc::invalid_params("response_format must be an object", "response_format");
        const std::string type = it->value("type", std::string());
        if (type == "json_object") {
            if (it->contains("schema") || schema.is_null()) schema = it->value("schema", json::object());
        } else if (type == "json_schema") {
            schema = it->value("json_schema", json::object()).value("schema", json::object());
        } else if (!type.empty() && type != "text") {
            return rpc::invalid_params("response_format type must be one of \"text\" or \"json_object\", but got: " + type,
                                       "response_format");
        }
    }
    if (schema.is_object() && schema.empty()) schema["type"] = "object";  // an empty schema: any object
    return schema;
}

}  // namespace specrpc::server
