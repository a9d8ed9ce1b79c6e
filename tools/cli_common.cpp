#include "cli_common.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace specrpc::cli {

using nlohmann::json;

namespace {

// A row's spellings CLI11 takes: "-x" and "--long" ("!--no-x" negates a flag); multi-letter
// single-dash ones are translated to the row's first long form (translate_args).
std::string cli11_names(const server::ServerOption & o) {
    std::string names;
    for (const char * f : o.flags) {
        const std::string s = f[0] == '!' ? f + 1 : f;
        if (s.size() > 2 && s[1] != '-') continue;
        names += (names.empty() ? "" : ",") + std::string(f);
    }
    return names;
}

std::string long_name(const server::ServerOption & o) {
    for (const char * f : o.flags)
        if (f[0] == '-' && f[1] == '-') return f;
    return "";
}

std::string default_text(const server::ServerOption & o) {
    if (!o.get) return "";
    static const server::ServerConfig defaults;
    const json v = o.get(defaults);
    if (v.is_string()) return v.get<std::string>();
    if (v.is_array()) return "";
    if (v.is_number_float()) {  // 0.8, not the float's 0.800000011920929
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", v.get<double>());
        return buf;
    }
    return v.dump();
}

// The first bad value on the command line: reported by finalize() as every other option error
// is (exit code 1 and "error: ..."), not as a CLI11 usage error.
Status g_option_error;
void fail(const Status & st) {
    if (g_option_error) g_option_error = st;
}

}  // namespace

std::vector<std::string> translate_args(int argc, char ** argv) {
    std::vector<std::string> out;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        bool known = false;
        if (s == "-cnv") { s = "--conversation"; known = true; }
        for (const auto & o : server::server_options()) {
            if (known || !(o.where & server::IN_CLI)) continue;
            for (const char * f : o.flags)
                if (s == f && s.size() > 2 && s[1] != '-') { s = long_name(o); known = true; break; }
        }
        // CLI11 reads an unknown "-tb" as "-t b" (--threads = b): name the flag instead.
        const bool multi_letter = s.size() > 2 && s[0] == '-' &&
                                  std::all_of(s.begin() + 1, s.end(), [](char c) { return std::isalpha((unsigned char)c); });
        if (!known && multi_letter) throw CLI::ExtrasError({s});
        out.push_back(s);
    }
    std::reverse(out.begin(), out.end());  // CLI11 parses a reversed vector
    return out;
}

void add_options(CLI::App & app, CommonArgs & a, unsigned where) {
    for (const auto & row : server::server_options()) {
        if (!(row.where & where)) continue;
        const server::ServerOption * o = &row;
        const std::string names = cli11_names(row);
        const std::string flag  = long_name(row);
        CLI::Option * opt = nullptr;
        if (row.type == server::OptType::IGNORED) {
            for (const char * f : row.flags) {
                if (f[1] != '-') continue;  // -cb, -ub: translated to their long forms
                opt = row.flag_only ? app.add_flag(f, row.doc) : app.add_option(f, row.doc);
                opt->group("llama-server compatibility (ignored)");
            }
            continue;
        }
        if (row.type == server::OptType::BOOL) {
            opt = app.add_flag_function(names, [o, &a, flag](int64_t count) {
                if (Status st = server::option_apply(*o, flag, json(count > 0), a); !st) fail(st);
            }, row.doc);
        } else {
            opt = app.add_option(names, [o, &a, flag](const CLI::results_t & res) {
                json v = json::array();
                for (const std::string & text : res) {
                    Result<json> x = server::option_value_from_text(*o, flag, text);
                    if (!x) {
                        fail(x.status());
                        return true;
                    }
                    if (x.value().is_array()) for (json & e : x.value()) v.push_back(std::move(e));
                    else v = std::move(x.value());
                }
                if (Status st = server::option_apply(*o, flag, v, a); !st) fail(st);
                return true;
            }, row.doc);
            if (const std::string def = default_text(row); !def.empty()) opt->default_str(def);
            if (row.type == server::OptType::LIST || row.type == server::OptType::FLOAT_LIST)
                opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->delimiter(',');
        }
        if (row.env) {
            opt->envname(row.env);
            if (row.llama_env) {
                if (!std::getenv(row.env) && std::getenv(row.llama_env)) setenv(row.env, std::getenv(row.llama_env), 0);
                opt->description(opt->get_description() + " (or " + row.llama_env + ")");
            }
        }
        if (std::string(row.key) == "model" && (where & server::IN_TOOLS)) opt->required();
    }
}

Status finalize(CommonArgs & a) {
    if (!g_option_error) return g_option_error;
    if (a.log_level == "debug") log_set_level(LogLevel::DEBUG);
    else if (a.log_level == "warn") log_set_level(LogLevel::WARN);
    else if (a.log_level == "error") log_set_level(LogLevel::ERROR);
    else if (a.log_level == "none") log_set_level(LogLevel::NONE);
    return server::finalize_server_config(a);
}

Result<std::unique_ptr<Engine>> load_engine(CommonArgs & a) {
    int last = -1;
    a.engine.on_progress = [&last](float p, const std::string & what) {
        int pct = static_cast<int>(p * 100);
        if (pct / 5 != last / 5) {
            std::fprintf(stderr, "\rloading %-6s %3d%%", what.c_str(), pct);
            if (pct >= 100) std::fprintf(stderr, "\n");
            last = pct;
        }
        return true;
    };
    auto e = Engine::create(a.engine);
    if (last >= 0 && last < 100) std::fprintf(stderr, "\n");
    if (!e) return e;
    if (!a.lookup_static.empty())
        if (Status st = e.value()->load_ngram_cache(a.lookup_static, false); !st) return st;
    if (!a.lookup_dynamic.empty()) {
        Status st = e.value()->load_ngram_cache(a.lookup_dynamic, true);
        if (!st && st.code() != ErrorCode::NOT_FOUND) return st;
    }
    e.value()->set_default_spec(a.spec);
    return e;
}

}  // namespace specrpc::cli
