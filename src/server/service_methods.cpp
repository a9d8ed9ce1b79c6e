// The small methods of the Service (tokenize, detokenize, health, props, metrics, slots, init,
// deinit) and the method table. Lifecycle and `completion` are in service.cpp.
#include <chrono>
#include <filesystem>

#include "server/service.h"

namespace specrpc::server {

namespace {

// llama-server's Process-Start-Time-Unix header on /metrics: lets a scraper tell a restarted
// server's counters from a reset. Set when the library is loaded.
const int64_t kProcessStart =
    std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

bool valid_utf8(const std::string & s) {
    for (size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

std::optional<rpc::RpcError> get_bool(const json & p, const char * key, bool * out) {
    auto it = p.find(key);
    if (it == p.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) return rpc::invalid_params(std::string(key) + " must be a boolean", key);
    *out = it->get<bool>();
    return std::nullopt;
}

}  // namespace

// ---- small methods -------------------------------------------------------------------------

// Tokenize inputs from this size on (or with pieces) are admitted like generation requests.
constexpr std::size_t kTokenizeWorkBytes = 64 << 10;
// with_pieces answers a JSON object per token (~300 bytes in memory): 8 MiB of text peaked at
// 2.75 GB. Longer inputs get -32602.
constexpr std::size_t kTokenizePiecesMax = 1 << 17;

rpc::MethodResult Service::tokenize(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    const char * key = params.contains("content") ? "content" : "text";
    auto it = params.find(key);
    if (it == params.end() || !it->is_string())
        return rpc::invalid_params(std::string(key) + " must be a string", "content");
    bool add_special = false, parse_special = true, with_pieces = false;
    if (auto e = get_bool(params, "add_special", &add_special)) return *e;
    if (auto e = get_bool(params, "parse_special", &parse_special)) return *e;
    if (auto e = get_bool(params, "with_pieces", &with_pieces)) return *e;
    const std::string & text = it->get_ref<const std::string &>();
    const bool heavy = with_pieces || text.size() >= kTokenizeWorkBytes;
    if (heavy)
        if (auto e = enter_work(ctx)) return *e;
    struct Leave {
        Service * s;
        ~Leave() { if (s) s->leave_work(); }
    } leave{heavy ? this : nullptr};
    auto toks = eng->tokenize(text, add_special && eng->info().add_bos, parse_special);
    if (!toks) return rpc::invalid_params(toks.status().message(), "content");
    if (with_pieces && toks.value().size() > kTokenizePiecesMax)
        return rpc::invalid_params("with_pieces: at most " + std::to_string(kTokenizePiecesMax) +
                                       " tokens (this text has " + std::to_string(toks.value().size()) +
                                       "); tokenize it without pieces or in parts",
                                   "with_pieces");
    json out = json::array();
    for (token_id id : toks.value()) {
        if (!with_pieces) {
            out.push_back(id);
            continue;
        }
        std::string piece = eng->token_piece(id);
        if (valid_utf8(piece)) out.push_back({{"id", id}, {"piece", piece}});
        else out.push_back({{"id", id}, {"piece", json(std::vector<uint8_t>(piece.begin(), piece.end()))}});
    }
    return json{{"tokens", out}};
}

rpc::MethodResult Service::detokenize(const json & params, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto it = params.find("tokens");
    if (it == params.end() || !it->is_array()) return rpc::invalid_params("tokens must be an array of token ids", "tokens");
    std::vector<token_id> toks;
    for (const json & t : *it) {
        if (!t.is_number_integer()) return rpc::invalid_params("tokens must contain only integers", "tokens");
        const int64_t v = t.get<int64_t>();
        if (v < 0 || v >= eng->info().n_vocab)
            return rpc::invalid_params("token id " + std::to_string(v) + " is out of range [0, " +
                                           std::to_string(eng->info().n_vocab) + ")",
                                       "tokens");
        toks.push_back(static_cast<token_id>(v));
    }
    return json{{"content", eng->detokenize(toks)}};
}

rpc::MethodResult Service::health(const json &, rpc::CallContext &) {
    if (state() != LoadState::READY) return not_ready_error();
    if (auto eng = engine())
        if (Status st = eng->health(); !st) return rpc::error_from_status(st);  // a lost RPC worker: 503
    return json{{"status", "ok"}, {"loading_progress", 1.0}};
}

rpc::MethodResult Service::props(const json &, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    const EngineInfo & info = eng->info();
    CompletionRequest def = request_defaults();  // the server's --temp, --seed, -n ...
    def.spec = eng->default_spec();
    auto chat = chat_templates();
    const std::string tmpl = chat ? chat->source() : std::string();
    return json{{"model_path", info.model_path},
                {"model", model_name()},
                {"model_alias", model_name()},
                {"model_desc", info.model_desc},
                {"draft_model_path", info.draft_path},
                {"n_ctx", info.n_ctx_slot},
                {"n_ctx_train", info.n_ctx_train},
                {"n_vocab", info.n_vocab},
                {"total_slots", info.n_parallel},
                {"n_threads", info.n_threads},
                {"flash_attn", info.flash_attn},
                {"draft_flash_attn", info.draft_flash_attn},
                {"default_generation_settings", {{"n_ctx", info.n_ctx_slot}, {"params", generation_settings(def, *eng)}}},
                {"speculative", spec_settings(def.spec)},
                {"chat_template", tmpl},
                {"has_chat_template", chat && chat->explicit_template()},
                {"chat_template_caps", chat ? json::parse(chat->caps_json()) : json::object()},
                {"build_info", std::string("specrpc ") + SPECRPC_VERSION},
                {"version", SPECRPC_VERSION},
                {"params_schema", completion_params_schema()},
                {"is_sleeping", eng->is_sleeping()}};
}

rpc::MethodResult Service::metrics(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    std::string format = is_rest_call(ctx) ? "prometheus" : "json";
    if (params.is_object() && params.contains("format")) {
        if (!params["format"].is_string()) return rpc::invalid_params("format must be a string", "format");
        format = params["format"].get<std::string>();
    }
    if (is_rest_call(ctx)) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!metrics_endpoint_)  // llama-server's answer without --metrics
            return rpc::make_error(rpc::ERR_UNSUPPORTED, "This server does not support metrics endpoint. Start it with `--metrics`");
    }
    const EngineMetrics m = eng->metrics();
    if (format == "json") return metrics_to_json(m, eng->info());
    if (format != "prometheus") return rpc::invalid_params("format must be json or prometheus", "format");
    ServiceCounters c{n_tokens_cached_.load(), n_decode_.load(), n_tokens_max_.load()};
    {
        // a scrape reports the throughput since the previous one, and starts the next window
        std::lock_guard<std::mutex> lock(mu_);
        c.window_prompt_n     = m.tokens_evaluated - last_scrape_.tokens_evaluated;
        c.window_prompt_ms    = m.t_prompt_ms - last_scrape_.t_prompt_ms;
        c.window_predicted_n  = m.tokens_predicted - last_scrape_.tokens_predicted;
        c.window_predicted_ms = m.t_predicted_ms - last_scrape_.t_predicted_ms;
        last_scrape_ = m;
    }
    rpc::RawBody raw{metrics_to_prometheus(m, eng->info(), c), "text/plain; version=0.0.4; charset=utf-8",
                     {{"Process-Start-Time-Unix", std::to_string(kProcessStart)}}};
    // a REST route sends the text as is; a JSON-RPC result carries it in an object
    json out{{"__raw_body", raw.body}, {"__content_type", raw.content_type},
             {"__headers", {{raw.headers[0].first, raw.headers[0].second}}}};
    ctx.raw_body = std::move(raw);
    return out;
}

rpc::MethodResult Service::slots(const json &, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    const EngineInfo & info = eng->info();
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!slots_endpoint_)
            return rpc::make_error(rpc::ERR_UNSUPPORTED, "This server does not support slots endpoint. Start it without --no-slots");
    }
    EngineMetrics m = eng->metrics();
    // before the engine's first step the slots are all idle and empty: list them anyway
    for (int32_t i = static_cast<int32_t>(m.slots.size()); i < info.n_parallel; ++i) m.slots.push_back(SlotState{i});
    const json spec = spec_settings(eng->default_spec());
    json out = json::array();
    for (const SlotState & s : m.slots)
        out.push_back({{"id", s.id}, {"n_ctx", info.n_ctx_slot}, {"is_processing", s.busy}, {"id_task", s.request_id},
                       {"n_past", s.n_past}, {"n_decoded", s.n_predicted}, {"speculative", spec}});
    return out;
}

rpc::MethodResult Service::init(const json & params, rpc::CallContext & ctx) {
    const bool network = rpc::is_network(ctx.transport);
    if (network && !opts_.allow_http_model_load) return rpc::make_error(rpc::ERR_METHOD_NOT_FOUND, "Method not found");
    Result<LoadConfig> cfg = params.is_array() && params.size() == 1 && params[0].is_string()
                                 ? parse_load_config(params[0].get<std::string>())
                                 : parse_load_config_json(params);
    if (!cfg) return rpc::error_from_status(cfg.status());
    if (network)
        if (Status st = check_model_paths(cfg.value()); !st) return rpc::error_from_status(st);
    bool async = false;
    if (params.is_object())
        if (auto e = get_bool(params, "async", &async)) return *e;
    Status st = async ? load_async(std::move(cfg.value())) : load(std::move(cfg.value()));
    if (!st) {
        rpc::RpcError err = rpc::error_from_status(st);
        json data = err.data.is_object() ? err.data : json::object();
        data["error_code"] = error_code_name(st.code());
        err.data = data;
        return err;
    }
    return status();
}

rpc::MethodResult Service::deinit(const json &, rpc::CallContext & ctx) {
    if (rpc::is_network(ctx.transport) && !opts_.allow_http_model_load)
        return rpc::make_error(rpc::ERR_METHOD_NOT_FOUND, "Method not found");
    unload();
    return status();
}

void Service::register_methods(rpc::Dispatcher & d) {
    auto bind = [this](rpc::MethodResult (Service::*fn)(const json &, rpc::CallContext &)) {
        return [this, fn](const json & p, rpc::CallContext & ctx) { return (this->*fn)(p, ctx); };
    };
    d.add_method("completion", bind(&Service::completion));
    d.add_method("tokenize", bind(&Service::tokenize));
    d.add_method("detokenize", bind(&Service::detokenize));
    d.add_method("health", bind(&Service::health));
    d.add_method("props", bind(&Service::props));
    d.add_method("metrics", bind(&Service::metrics));
    d.add_method("slots", bind(&Service::slots));
    d.add_method("slot_action", bind(&Service::slot_action));
    d.add_method("v1/models", bind(&Service::models));
    d.add_method("v1/completions", bind(&Service::oai_completions));
    d.add_method("v1/chat/completions", bind(&Service::oai_chat));
    d.add_method("apply_template", bind(&Service::apply_template));
    d.add_method("v1/messages", bind(&Service::anthropic_messages));
    d.add_method("v1/messages/count_tokens", bind(&Service::anthropic_count_tokens));
    d.add_method("v1/responses", bind(&Service::responses));
    d.add_method("v1/chat/completions/input_tokens", bind(&Service::chat_input_tokens));
    d.add_method("v1/responses/input_tokens", bind(&Service::responses_input_tokens));
    d.add_method("embeddings", bind(&Service::embeddings));
    d.add_method("v1/embeddings", bind(&Service::oai_embeddings));
    d.add_method("rerank", bind(&Service::rerank));
    d.add_method("infill", bind(&Service::infill));
    d.add_method("init", bind(&Service::init));
    d.add_method("deinit", bind(&Service::deinit));
    d.add_method("poll_system_status", [this](const json &, rpc::CallContext &) -> rpc::MethodResult { return status(); });
    // the legacy C-ABI names
    d.add_alias("get_completion", "completion");
    d.add_alias("completions", "completion");
    d.add_alias("models", "v1/models");
}

}  // namespace specrpc::server
