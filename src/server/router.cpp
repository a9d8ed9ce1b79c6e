// The router role (see router.h): what `specrpc serve` without a model answers.
#include "server/router.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <set>
#include <system_error>

namespace specrpc::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_gguf(const fs::path & p) { return p.extension() == ".gguf"; }
bool is_mmproj(const std::string & name) { return name.find("mmproj") != std::string::npos; }

// Methods that answer without a model (or decide themselves that they cannot).
const std::set<std::string> kKeep = {"health", "props", "v1/models", "models", "init", "deinit",
                                     "poll_system_status", "tools", "$/cancelRequest"};

}  // namespace

std::vector<RouterModel> scan_models_dir(const std::string & dir) {
    std::vector<RouterModel> out;
    if (dir.empty()) return out;
    std::error_code ec;
    for (const fs::directory_entry & e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (e.is_directory(ec)) {
            // a directory NAME with one model file (split models: their first shard)
            std::string first;
            for (const fs::directory_entry & f : fs::directory_iterator(e.path(), ec)) {
                const std::string fn = f.path().filename().string();
                if (!is_gguf(f.path()) || is_mmproj(fn)) continue;
                if (first.empty() || fn.find("-00001-of-") != std::string::npos) first = f.path().string();
            }
            if (!first.empty()) out.push_back({name, first});
        } else if (is_gguf(e.path()) && !is_mmproj(name)) {
            out.push_back({e.path().stem().string(), e.path().string()});
        }
    }
    std::sort(out.begin(), out.end(), [](const RouterModel & a, const RouterModel & b) { return a.name < b.name; });
    return out;
}

void install_router(rpc::Dispatcher & d, const RouterOptions & options) {
    const RouterOptions o = options;
    d.add_method("health", [](const json &, rpc::CallContext &) -> rpc::MethodResult {
        return json{{"status", "ok"}};
    });
    d.add_method("props", [o](const json &, rpc::CallContext &) -> rpc::MethodResult {
        // llama-server's router shape; model_path "none" and empty generation settings keep
        // clients that read a single-model /props from failing on missing keys.
        return json{{"role", "router"},
                    {"max_instances", o.models_max},
                    {"models_autoload", o.models_autoload},
                    {"model_alias", "specrpc"},
                    {"model_path", "none"},
                    {"default_generation_settings", {{"params", json::object()}, {"n_ctx", 0}}},
                    {"build_info", std::string("b") + SPECRPC_VERSION + "-specrpc"},
                    {"multi_model_routing", false}};
    });
    d.add_method("v1/models", [o](const json &, rpc::CallContext &) -> rpc::MethodResult {
        json data = json::array();
        const int64_t now = static_cast<int64_t>(std::time(nullptr));
        for (const RouterModel & m : scan_models_dir(o.models_dir)) {
            data.push_back({{"id", m.name},
                            {"aliases", json::array()},
                            {"tags", json::array()},
                            {"object", "model"},
                            {"owned_by", "llamacpp"},
                            {"created", now},
                            {"status", {{"value", "unloaded"}, {"args", json::array()}}},
                            {"path", m.path}});
        }
        return json{{"object", "list"}, {"data", std::move(data)}};
    });
    auto needs_model = [o](const json & params, rpc::CallContext &) -> rpc::MethodResult {
        const std::string name =
            params.is_object() && params.contains("model") && params["model"].is_string() ? params["model"].get<std::string>() : "";
        if (name.empty())
            return rpc::make_error(rpc::ERR_INVALID_PARAMS, "model name is missing from the request", {{"param", "model"}});
        const std::vector<RouterModel> models = scan_models_dir(o.models_dir);
        auto it = std::find_if(models.begin(), models.end(), [&](const RouterModel & m) { return m.name == name; });
        if (it == models.end())
            return rpc::make_error(rpc::ERR_INVALID_PARAMS, "model '" + name + "' not found", {{"param", "model"}});
        if (!o.models_autoload) return rpc::make_error(rpc::ERR_INVALID_PARAMS, "model is not loaded", {{"param", "model"}});
        return rpc::make_error(rpc::ERR_UNSUPPORTED,
                               "specrpc serve does not route between models (no model was given at start-up); serve '" +
                                   name + "' with: specrpc serve -m " + it->path);
    };
    for (const std::string & name : d.method_names())
        if (!kKeep.count(name)) d.add_method(name, needs_model);
}

}  // namespace specrpc::server
