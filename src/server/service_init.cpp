// init's argument → LoadConfig. A command line with llama-server's flags is first turned into
// the JSON object form through kOptions (one row per key: its flags, type and limits), so both
// forms go through the same checks.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/log.h"
#include "server/service.h"

namespace specrpc::server {

namespace {

enum class T { STR, INT, FLOAT, FLAG, NEG_FLAG, LIST };  // FLAG/NEG_FLAG: JSON bool, no value on the line

struct Option {
    const char *                     key;      // JSON key
    T                                type;
    std::vector<const char *>        flags;    // command-line spellings
    double                           lo, hi;   // numeric limits (inclusive)
    std::vector<const char *>        aliases;  // other accepted JSON keys
};

const std::vector<Option> & options() {
    static const std::vector<Option> opts = {
        {"model", T::STR, {"-m", "--model"}, 0, 0, {}},
        {"model_draft", T::STR, {"-md", "--model-draft"}, 0, 0, {}},
        {"ctx_size", T::INT, {"-c", "--ctx-size"}, 0, 1 << 20, {"n_ctx"}},
        {"batch_size", T::INT, {"-b", "--batch-size"}, 17, 1 << 16, {"n_batch"}},
        {"threads", T::INT, {"-t", "--threads"}, 0, 1024, {"n_threads"}},
        {"parallel", T::INT, {"-np", "--parallel"}, 1, 64, {"n_parallel"}},
        {"rpc", T::LIST, {"--rpc"}, 0, 0, {"rpc_servers"}},
        {"n_gpu_layers", T::INT, {"-ngl", "--n-gpu-layers", "--gpu-layers"}, -1, 1 << 16, {}},
        {"no_mmap", T::FLAG, {"--no-mmap"}, 0, 0, {}},
        {"use_mmap", T::NEG_FLAG, {}, 0, 0, {}},
        {"kv_f32", T::FLAG, {"--kv-f32"}, 0, 0, {}},
        {"flash_attn", T::STR, {"-fa", "--flash-attn"}, 0, 0, {}},
        {"draft_flash_attn", T::STR, {"-fad", "--flash-attn-draft"}, 0, 0, {}},
        {"queue_max", T::INT, {"--queue-max"}, 0, 1 << 16, {"n_queue_max"}},
        {"tree_max", T::INT, {"--tree-max"}, 1, 16, {"n_tree_max"}},
        {"spec_type", T::LIST, {"--spec-type"}, 0, 0, {}},
        {"draft_max", T::INT, {"--draft-max", "--draft-n", "--spec-draft-n-max"}, 0, 64, {"n_draft"}},
        {"draft_min", T::INT, {"--draft-min", "--spec-draft-n-min"}, 0, 64, {}},
        {"draft_p_min", T::FLOAT, {"--draft-p-min", "--spec-draft-p-min"}, 0, 1, {}},
        {"draft_p_split", T::FLOAT, {"--draft-p-split"}, 0, 1, {}},
        {"draft_branches", T::INT, {"--draft-branches"}, 1, 16, {}},
        {"no_adaptive", T::FLAG, {"--no-adaptive"}, 0, 0, {}},
        {"adaptive", T::NEG_FLAG, {}, 0, 0, {}},
        {"sample_and_compare", T::FLAG, {"--sample-and-compare"}, 0, 0, {}},
        {"ngram_min", T::INT, {"--ngram-min"}, 1, 4, {}},
        {"ngram_max", T::INT, {"--ngram-max"}, 1, 4, {}},
        {"lookup_cache_static", T::STR, {"-lcs", "--lookup-cache-static"}, 0, 0, {}},
        {"lookup_cache_dynamic", T::STR, {"-lcd", "--lookup-cache-dynamic"}, 0, 0, {}},
        {"lookup_cache_max_mb", T::INT, {"--lookup-cache-max-mb"}, 0, 1 << 20, {}},
        {"model_alias", T::STR, {"-a", "--alias"}, 0, 0, {"alias"}},
        {"chat_template", T::STR, {"--chat-template"}, 0, 0, {}},
    };
    return opts;
}

// llama-server flags that make no sense for an embedded engine: accepted and ignored.
const char * const kIgnoredWithValue[] = {"--host", "--port", "--api-key", "--timeout", "--threads-http", "-to",
                                          "--log-file", "--seed", "-s"};
const char * const kIgnoredFlags[] = {"--metrics", "--log-disable", "--cont-batching", "-cb", "--mlock",
                                      "--no-webui", "--verbose", "-v", "--slots"};

// Splits a command line like a POSIX shell would (quotes, backslashes), without expansion.
Result<std::vector<std::string>> split_args(const std::string & s) {
    std::vector<std::string> out;
    std::string cur;
    bool in_tok = false;
    char quote  = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (quote) {
            if (c == quote) quote = 0;
            else if (c == '\\' && quote == '"' && i + 1 < s.size() && (s[i + 1] == '"' || s[i + 1] == '\\')) cur += s[++i];
            else cur += c;
        } else if (c == '\'' || c == '"') {
            quote = c;
            in_tok = true;
        } else if (c == '\\' && i + 1 < s.size()) {
            cur += s[++i];
            in_tok = true;
        } else if (std::isspace(static_cast<unsigned char>(c))) {
            if (in_tok) out.push_back(cur);
            cur.clear();
            in_tok = false;
        } else {
            cur += c;
            in_tok = true;
        }
    }
    if (quote) return invalid_arg("unterminated quote in the command line", "cmd");
    if (in_tok) out.push_back(cur);
    return out;
}

const Option * find_flag(const std::string & flag) {
    for (const auto & o : options())
        for (const char * f : o.flags)
            if (flag == f) return &o;
    return nullptr;
}

const Option * find_key(const std::string & key) {
    for (const auto & o : options()) {
        if (key == o.key) return &o;
        for (const char * a : o.aliases)
            if (key == a) return &o;
    }
    return nullptr;
}

Result<json> args_to_json(const std::vector<std::string> & args) {
    json j = json::object();
    size_t i = 0;
    if (!args.empty() && !args[0].empty() && args[0][0] != '-' && args[0][0] != '{') i = 1;  // program name
    for (; i < args.size(); ++i) {
        std::string flag = args[i], value;
        bool has_inline = false;
        if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag  = flag.substr(0, eq);
            has_inline = true;
        }
        bool ignored = false;
        for (const char * f : kIgnoredFlags) ignored |= flag == f;
        if (ignored) continue;
        for (const char * f : kIgnoredWithValue) ignored |= flag == f;
        if (ignored) {
            if (!has_inline) ++i;
            SPR_LOG_INFO("init: %s ignored by the embedded engine", flag.c_str());
            continue;
        }
        const Option * o = find_flag(flag);
        if (!o) return invalid_arg("unknown flag '" + flag + "'", flag);
        if (o->type == T::FLAG) {
            j[o->key] = true;
            continue;
        }
        if (!has_inline) {
            if (i + 1 >= args.size()) return invalid_arg("flag " + flag + " needs a value", flag);
            value = args[++i];
        }
        if (o->type == T::STR || o->type == T::LIST) {
            j[o->key] = value;
            continue;
        }
        char * end = nullptr;
        errno = 0;
        double x = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno != 0)
            return invalid_arg("flag " + flag + " needs a number, got '" + value + "'", flag);
        j[o->key] = o->type == T::INT && x == std::floor(x) && std::fabs(x) < 9e15 ? json(static_cast<int64_t>(x)) : json(x);
    }
    return j;
}

}  // namespace

Result<LoadConfig> parse_load_config_json(const json & j) {
    if (!j.is_object()) return invalid_arg("init expects a JSON object or a command line", "cmd");
    if (j.contains("cmd")) {  // {"cmd": "-m ... "} plus optional overrides is not supported: one form
        if (!j["cmd"].is_string()) return invalid_arg("cmd must be a string", "cmd");
        if (j.size() > 1 && !(j.size() == 2 && j.contains("async")))
            return invalid_arg("give either cmd or the keys, not both", "cmd");
        return parse_load_config(j["cmd"].get<std::string>());
    }
    LoadConfig cfg;
    auto & e = cfg.engine;
    auto & sp = cfg.spec;
    int32_t fa = -1, fa_draft = -2;  // -2: as the target's
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string & key = it.key();
        const json & v = it.value();
        if (key == "async") continue;  // handled by the caller
        const Option * o = find_key(key);
        if (!o) return invalid_arg("unknown key '" + key + "'", key);
        if (v.is_null()) continue;
        std::string s;
        double x = 0;
        bool b = false;
        switch (o->type) {
            case T::STR:
                if (!v.is_string()) return invalid_arg(key + " must be a string", key);
                s = v.get<std::string>();
                break;
            case T::LIST:
                if (v.is_string()) {
                    s = v.get<std::string>();
                } else if (v.is_array()) {
                    for (const json & n : v) {
                        if (!n.is_string()) return invalid_arg(key + " must be a string or a list of strings", key);
                        s += (s.empty() ? "" : ",") + n.get<std::string>();
                    }
                    if (s.empty()) s = "none";
                } else {
                    return invalid_arg(key + " must be a string or a list of strings", key);
                }
                break;
            case T::FLAG:
            case T::NEG_FLAG:
                if (!v.is_boolean()) return invalid_arg(key + " must be a boolean", key);
                b = v.get<bool>();
                break;
            case T::INT:
            case T::FLOAT:
                if (!v.is_number()) return invalid_arg(key + " must be a number", key);
                x = v.get<double>();
                if (!std::isfinite(x) || (o->type == T::INT && x != std::floor(x)))
                    return invalid_arg(key + " must be " + (o->type == T::INT ? "an integer" : "finite"), key);
                if (x < o->lo || x > o->hi)
                    return invalid_arg(key + " = " + std::to_string(x) + " is out of range [" + std::to_string(o->lo) +
                                           ", " + std::to_string(o->hi) + "]",
                                       key);
                break;
        }
        const std::string k = o->key;
        const int32_t xi = static_cast<int32_t>(x);
        if (k == "model") e.target.path = s;
        else if (k == "model_draft") e.draft.path = s;
        else if (k == "ctx_size") e.n_ctx = xi;
        else if (k == "batch_size") e.n_batch = xi;
        else if (k == "threads") e.n_threads = xi;
        else if (k == "parallel") e.n_parallel = xi;
        else if (k == "n_gpu_layers") e.target.n_gpu_layers = e.draft.n_gpu_layers = xi;
        else if (k == "no_mmap") e.target.use_mmap = e.draft.use_mmap = !b;
        else if (k == "use_mmap") e.target.use_mmap = e.draft.use_mmap = b;
        else if (k == "kv_f32") e.kv_f32 = b;
        else if (k == "rpc") {  // the target only: the draft runs here, where it costs no round trips
            e.target.rpc_servers.clear();
            for (size_t a = 0, z; s != "none" && a <= s.size(); a = z + 1) {
                z = std::min(s.find(',', a), s.size());
                if (z > a) e.target.rpc_servers.push_back(s.substr(a, z - a));
            }
        }
        else if (k == "flash_attn" || k == "draft_flash_attn") {
            const int32_t x_fa = s == "on" ? 1 : s == "off" ? 0 : s == "auto" ? -1 : -3;
            if (x_fa == -3) return invalid_arg(key + " must be \"on\", \"off\" or \"auto\", got '" + s + "'", key);
            (k == "flash_attn" ? fa : fa_draft) = x_fa;
        }
        else if (k == "queue_max") e.n_queue_max = xi;
        else if (k == "tree_max") e.n_tree_max = xi;
        else if (k == "spec_type") cfg.spec_types = s;
        else if (k == "draft_max") sp.n_max = xi;
        else if (k == "draft_min") sp.n_min = xi;
        else if (k == "draft_p_min") sp.p_min = static_cast<float>(x);
        else if (k == "draft_p_split") sp.p_split = static_cast<float>(x);
        else if (k == "draft_branches") sp.n_parallel = xi;
        else if (k == "no_adaptive") sp.adaptive = !b;
        else if (k == "adaptive") sp.adaptive = b;
        else if (k == "sample_and_compare") sp.sample_and_compare = b;
        else if (k == "ngram_min") sp.ngram_min = xi;
        else if (k == "ngram_max") sp.ngram_max = xi;
        else if (k == "lookup_cache_static") cfg.lookup_static = s;
        else if (k == "lookup_cache_dynamic") cfg.lookup_dynamic = s;
        else if (k == "lookup_cache_max_mb") e.ngram_cache_max_mb = xi;
        else if (k == "model_alias") cfg.model_alias = s;
        else if (k == "chat_template") cfg.chat_template = s;
    }
    e.flash_attn       = fa;
    e.draft_flash_attn = fa_draft == -2 ? fa : fa_draft;  // -fa sets both, as llama-server's
    if (e.target.path.empty()) return invalid_arg("no model given (-m PATH or \"model\": PATH)", "model");
    if (Status st = finalize_load_config(cfg); !st) return st;
    return cfg;
}

Result<LoadConfig> parse_load_config(const std::string & text) {
    size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return invalid_arg("init: empty command line", "cmd");
    if (text[first] == '{') {
        json j = json::parse(text, nullptr, false);
        if (j.is_discarded()) return invalid_arg("init: malformed JSON", "cmd");
        return parse_load_config_json(j);
    }
    auto args = split_args(text);
    if (!args) return args.status();
    auto j = args_to_json(args.value());
    if (!j) return j.status();
    return parse_load_config_json(j.value());
}

Status finalize_load_config(LoadConfig & cfg) {
    if (cfg.engine.n_ctx > 0 && !cfg.kv_unified && cfg.engine.n_parallel > 1) {
        if (cfg.engine.n_ctx < cfg.engine.n_parallel)
            return invalid_arg("ctx_size " + std::to_string(cfg.engine.n_ctx) + " is less than one token per slot",
                               "ctx_size");
        cfg.engine.n_ctx /= cfg.engine.n_parallel;  // llama-server: n_ctx_seq = n_ctx / n_parallel
    }
    auto & sp = cfg.spec;
    sp.types.clear();
    if (cfg.spec_types == "auto" || cfg.spec_types.empty()) {
        if (!cfg.engine.draft.path.empty()) sp.types = {SpecType::DRAFT};
    } else {
        std::string cur;
        for (char c : cfg.spec_types + ",") {
            if (c != ',') {
                if (c != ' ') cur += c;
                continue;
            }
            if (cur.empty()) continue;
            SpecType t;
            if (!spec_type_from_name(cur, &t))
                return invalid_arg("unknown spec type '" + cur + "' (draft, ngram, lookup, synth, none)", "spec_type");
            if (t == SpecType::DRAFT && cfg.engine.draft.path.empty())
                return invalid_arg("spec type 'draft' needs a draft model (-md)", "spec_type");
            if (t != SpecType::NONE) sp.types.push_back(t);
            cur.clear();
        }
    }
    if (sp.n_min > sp.n_max) return invalid_arg("draft_min must be <= draft_max", "draft_min");
    if (sp.ngram_min > sp.ngram_max) return invalid_arg("ngram_min must be <= ngram_max", "ngram_min");
    // a default tree shape reserves its branches (--draft-branches 3 works without --tree-max 3)
    cfg.engine.n_tree_max = std::max(cfg.engine.n_tree_max, sp.n_parallel);
    return Status::ok();
}

}  // namespace specrpc::server
