// init's argument → LoadConfig. A command line with llama-server's flags is first turned into
// the JSON object form through the options table (server/server_options.h), so both forms go
// through the same checks.
#include <algorithm>
#include <cctype>

#include "common/log.h"
#include "server/server_options.h"
#include "server/service.h"

namespace specrpc::server {

namespace {

// A command line's flags as init's JSON keys (each value as its row's type), so that both forms
// go through the same checks. Flags of serve's transports are ignored: they have no use here.
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
        const ServerOption * o = find_option_flag(flag);
        if (!o || !(o->where & (IN_INIT | IGNORED_IN_INIT))) return invalid_arg("unknown flag '" + flag + "'", flag);
        const bool takes_value = o->type == OptType::IGNORED ? !o->flag_only : o->type != OptType::BOOL;
        if (!(o->where & IN_INIT)) {
            if (takes_value) {
                if (!has_inline) ++i;
                SPR_LOG_INFO("init: %s ignored by the embedded engine", flag.c_str());
            }
            continue;
        }
        if (!takes_value) {
            j[o->key] = std::find_if(o->flags.begin(), o->flags.end(), [&](const char * f) {
                            return f[0] == '!' && flag == f + 1;
                        }) == o->flags.end();
            continue;
        }
        if (!has_inline) {
            if (i + 1 >= args.size()) return invalid_arg("flag " + flag + " needs a value", flag);
            value = args[++i];
        }
        if (o->type == OptType::STR || o->type == OptType::LIST || o->type == OptType::CHOICE) {
            j[o->key] = value;
            continue;
        }
        Result<json> v = option_value_from_text(*o, flag, value);
        if (!v) return v.status();
        j[o->key] = v.value();
    }
    return j;
}

}  // namespace

Result<std::vector<std::string>> split_command_line(const std::string & s) {
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

Result<LoadConfig> parse_load_config_json(const json & j) {
    if (!j.is_object()) return invalid_arg("init expects a JSON object or a command line", "cmd");
    if (j.contains("cmd")) {  // {"cmd": "-m ... "} plus optional overrides is not supported: one form
        if (!j["cmd"].is_string()) return invalid_arg("cmd must be a string", "cmd");
        if (j.size() > 1 && !(j.size() == 2 && j.contains("async")))
            return invalid_arg("give either cmd or the keys, not both", "cmd");
        return parse_load_config(j["cmd"].get<std::string>());
    }
    ServerConfig cfg;
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string & key = it.key();
        if (key == "async") continue;  // handled by the caller
        const ServerOption * o = find_option_key(key);
        if (!o || !(o->where & IN_INIT)) return invalid_arg("unknown key '" + key + "'", key);
        if (it.value().is_null()) continue;
        if (Status st = option_apply(*o, key, it.value(), cfg); !st) return st;
    }
    if (cfg.engine.target.path.empty()) return invalid_arg("no model given (-m PATH or \"model\": PATH)", "model");
    if (Status st = finalize_server_config(cfg); !st) return st;
    return LoadConfig(std::move(cfg));
}

Result<LoadConfig> parse_load_config(const std::string & text) {
    size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return invalid_arg("init: empty command line", "cmd");
    if (text[first] == '{') {
        json j = json::parse(text, nullptr, false);
        if (j.is_discarded()) return invalid_arg("init: malformed JSON", "cmd");
        return parse_load_config_json(j);
    }
    auto args = split_command_line(text);
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
    if (cfg.engine.n_ctx > 0 && cfg.engine.n_ctx < kMinCtxSlot)
        return invalid_arg("ctx_size gives " + std::to_string(cfg.engine.n_ctx) + " tokens per slot: a slot needs at least " +
                               std::to_string(kMinCtxSlot) + " (0 = the model's training context)", "ctx_size");
    auto & sp = cfg.spec;
    sp.types.clear();
    if (cfg.spec_types == "auto" || cfg.spec_types.empty()) {
        if (!cfg.engine.draft.path.empty()) sp.types = {SpecType::DRAFT};
    } else {
        if (Status st = spec_types_parse(cfg.spec_types, &sp.types); !st) return invalid_arg(st.message(), "spec_type");
        for (SpecType t : sp.types)
            if (t == SpecType::DRAFT && cfg.engine.draft.path.empty())
                return invalid_arg(kDraftNeedsModel, "spec_type");
    }
    if (sp.n_min > sp.n_max) return invalid_arg("draft_min must be <= draft_max", "draft_min");
    if (sp.ngram_min > sp.ngram_max) return invalid_arg("ngram_min must be <= ngram_max", "ngram_min");
    // a default tree shape reserves its branches (--draft-branches 3 works without --tree-max 3)
    cfg.engine.n_tree_max = std::max(cfg.engine.n_tree_max, sp.n_parallel);
    return Status::ok();
}

}  // namespace specrpc::server
