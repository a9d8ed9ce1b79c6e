// The OpenAI-compatible methods: v1/models, v1/completions, v1/chat/completions. They map the
// OpenAI fields onto a llama-server completion request, run it like `completion`, and answer in
// OpenAI's shapes (streamed chunks as completion.chunk notifications whose data is a chunk object).
#include <chrono>
#include <random>

#include "common/log.h"
#include "server/service.h"

namespace specrpc::server {

namespace {

std::string random_id(const char * prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char hex[] = "0123456789abcdef";
    std::string s = prefix;
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr int64_t kMaxChoices = 16;  // `n`: choices are generated one after the other

// OpenAI request fields → llama-server ones, and `n` (the number of choices) → *n_choices.
// Errors name the OpenAI field.
std::optional<rpc::RpcError> map_openai_fields(json & p, int64_t * n_choices) {
    *n_choices = 1;
    if (auto it = p.find("n"); it != p.end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxChoices)
            return rpc::invalid_params("n must be an integer in [1, " + std::to_string(kMaxChoices) + "]", "n");
        if (it->get<int64_t>() > 1 && p.value("stream", json(false)) == json(true))
            return rpc::invalid_params("n > 1 is not supported with stream", "n");
        *n_choices = it->get<int64_t>();
        p.erase(it);
    }
    if (auto it = p.find("echo"); it != p.end() && !it->is_null()) {
        if (!it->is_boolean()) return rpc::invalid_params("echo must be a boolean", "echo");
        if (it->get<bool>()) return rpc::invalid_params("echo = true is not supported", "echo");
    }
    if (auto it = p.find("suffix"); it != p.end() && !it->is_null()) {
        if (!it->is_string() || !it->get_ref<const std::string &>().empty())
            return rpc::invalid_params("suffix is not supported", "suffix");
    }
    if (auto it = p.find("max_completion_tokens"); it != p.end() && !p.contains("max_tokens")) p["max_tokens"] = *it;
    // completions: logprobs = N (top-N); chat: logprobs = true with top_logprobs = N
    if (auto it = p.find("logprobs"); it != p.end() && !it->is_null()) {
        if (it->is_number_integer()) {
            p["n_probs"] = *it;
        } else if (it->is_boolean()) {
            if (it->get<bool>()) p["n_probs"] = p.value("top_logprobs", json(1));
        } else {
            return rpc::invalid_params("logprobs must be an integer or a boolean", "logprobs");
        }
    }
    return std::nullopt;
}

}  // namespace

rpc::MethodResult Service::models(const json &, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    const EngineInfo & info = eng->info();
    json meta = {{"n_vocab", info.n_vocab},       {"n_ctx_train", info.n_ctx_train}, {"n_ctx", info.n_ctx_slot},
                 {"total_slots", info.n_parallel}, {"desc", info.model_desc},        {"draft", info.draft_path}};
    std::set<std::string> aliases, tags;
    {
        std::lock_guard<std::mutex> lock(mu_);
        aliases = split_list(model_alias_);
        tags    = split_list(model_tags_);
    }
    return json{{"object", "list"},
                {"data", json::array({{{"id", model_name()},
                                       {"object", "model"},
                                       {"created", unix_now()},
                                       {"owned_by", "specrpc"},
                                       {"aliases", aliases},
                                       {"tags", tags},
                                       {"meta", meta}}})}};
}

// Shared body of both OpenAI methods once the prompt is known.
static rpc::MethodResult run_openai(Service & svc, const std::shared_ptr<Engine> & eng, json params, bool chat,
                                    rpc::CallContext & ctx,
                                    const std::function<std::variant<CompletionResult, rpc::RpcError>(
                                        const CompletionRequest &, const std::function<void(const CompletionChunk &)> &)> &
                                        run_fn,
                                    const std::function<void(const CompletionResult &, OaiMeta &)> & finish = {}) {
    int64_t n_choices = 1;
    if (auto err = map_openai_fields(params, &n_choices)) return *err;
    const CompletionRequest defaults = svc.request_defaults();
    auto parsed = parse_completion(params, *eng, &defaults);
    if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return *err;
    ParsedCompletion & pc = std::get<ParsedCompletion>(parsed);
    OaiMeta meta;
    meta.id          = random_id(chat ? "chatcmpl-" : "cmpl-");
    meta.created     = unix_now();
    meta.model       = svc.model_name();
    meta.fingerprint = std::string("b") + SPECRPC_VERSION + "-specrpc";  // llama.cpp's "b<build>-<commit>" form
    meta.warnings    = pc.warnings;
    const bool stream = pc.req.stream && static_cast<bool>(ctx.notify);
    const bool per_token = params.value("timings_per_token", json(false)) == json(true);
    const bool progress  = params.value("return_progress", json(false)) == json(true);
    bool include_usage = false;
    if (auto it = params.find("stream_options"); it != params.end() && it->is_object())
        include_usage = it->value("include_usage", json(false)) == json(true);
    const bool logprobs = pc.req.sampling.n_probs > 0;
    StreamClock clock;
    clock.n_prompt = static_cast<int32_t>(pc.req.prompt.size());
    bool first = true;
    auto send = [&](json chunk) { ctx.send("completion.chunk", {{"id", ctx.id}, {"data", std::move(chunk)}}); };
    // chat: a role-only first chunk, as OpenAI and llama-server send, then content only; with
    // return_progress every prompt-progress event is such a chunk too
    auto role_chunk = [&](const PromptProgress * p) {
        json j = oai_chunk("", meta, chat, true);
        if (p) {
            j["prompt_progress"] = progress_to_json(*p);
            j["timings"]         = progress_timings(*p);
        }
        send(std::move(j));
    };
    std::function<void(const CompletionChunk &)> on_chunk;
    int32_t n_so_far = 0;
    if (stream) {
        pc.req.return_progress = progress;
        on_chunk = [&](const CompletionChunk & c) {
            if (c.progress) {
                role_chunk(&*c.progress);
                return;
            }
            n_so_far += static_cast<int32_t>(c.tokens.size());
            json t = clock.timings(n_so_far);  // the first call marks the first token's time
            if (first && chat) role_chunk(nullptr);
            first = false;
            if (c.content.empty() && c.tokens.empty()) return;
            json j = oai_chunk(c.content, meta, chat, false);
            if (chat && logprobs) j["choices"][0]["logprobs"] = {{"content", probs_to_json(c.tokens, false)}};
            if (per_token) j["timings"] = std::move(t);
            send(std::move(j));
        };
    }
    auto r = run_fn(pc.req, on_chunk);
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    const CompletionResult & res = std::get<CompletionResult>(r);
    if (finish) finish(res, meta);
    if (res.stop_type == StopType::CANCELLED)
        return rpc::cancelled(oai_result(res, meta, chat, false));
    const bool rest = is_rest_call(ctx);
    json out = oai_result(res, meta, chat, stream && rest);
    // llama-server's debugging aid: the native result (rendered prompt included) beside the
    // OpenAI one, on request or for every request of a server started with --verbose
    const auto vb = params.find("verbose");
    if (vb != params.end() && vb->is_boolean() ? vb->get<bool>() : log_get_level() == LogLevel::DEBUG)
        out["__verbose"] = result_to_json(res, pc.req, *eng, pc.warnings, svc.model_name());
    for (int64_t i = 1; i < n_choices; ++i) {  // n > 1 (not streamed): more choices, usage summed
        auto ri = run_fn(pc.req, on_chunk);
        if (auto * err = std::get_if<rpc::RpcError>(&ri)) return *err;
        const CompletionResult & resi = std::get<CompletionResult>(ri);
        if (resi.stop_type == StopType::CANCELLED)
            return rpc::cancelled(oai_result(resi, meta, chat, false));
        json more = oai_result(resi, meta, chat, false);
        json choice = more["choices"][0];
        choice["index"] = i;
        out["choices"].push_back(std::move(choice));
        for (const char * k : {"prompt_tokens", "completion_tokens", "total_tokens"})
            out["usage"][k] = out["usage"][k].get<int64_t>() + more["usage"][k].get<int64_t>();
    }
    if (rest) rest_timings(out);
    if (stream && rest && include_usage) {  // OpenAI: the usage comes in a last chunk with no choices
        json usage = out;
        out.erase("usage");
        out.erase("timings");
        out.erase("draft_stats");
        send(std::move(out));
        usage["choices"] = json::array();
        return usage;
    }
    return out;
}

rpc::MethodResult Service::oai_completions(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    return run_openai(*this, eng, params, false, ctx, [&](const CompletionRequest & req, const auto & on_chunk) {
        ChunkFn fn;
        if (on_chunk) fn = [&](const CompletionChunk & c, int32_t) { on_chunk(c); };
        return run(eng, req, ctx, fn);
    });
}

std::variant<ChatTemplateOutput, rpc::RpcError> Service::chat_prompt(const json & params) const {
    auto chat = chat_templates();
    if (!chat) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto it = params.find("messages");
    // an empty list is allowed, as llama-server does: the prompt is the assistant prefix alone
    if (it == params.end() || !it->is_array()) return rpc::invalid_params("messages must be an array", "messages");
    for (const json & m : *it) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            return rpc::invalid_params("every message needs a string role", "messages");
        const json & c = m.contains("content") ? m["content"] : json(nullptr);
        if (m["role"] != "assistant" && !m.contains("content"))
            return rpc::invalid_params("All non-assistant messages must contain 'content'", "messages");
        if (c.is_array()) {
            for (const json & part : c) {
                if (part.is_object() && part.value("type", "") == "image_url")  // llama-server's words and status
                    return rpc::make_error(rpc::ERR_INTERNAL,
                                           "image input is not supported - this server has no multimodal projector",
                                           json{{"param", "messages"}});
                if (!part.is_object() || part.value("type", std::string()) != "text")
                    return rpc::invalid_params("only text content parts are supported (no image or audio input)",
                                               "messages");
            }
        } else if (!c.is_null() && !c.is_string()) {
            return rpc::invalid_params("message content must be a string or an array of text parts", "messages");
        }
    }
    ChatTemplateInput in;
    in.messages_json = it->dump();
    auto schema = requested_json_schema(params);
    if (auto * err = std::get_if<rpc::RpcError>(&schema)) return *err;
    const json & js = std::get<json>(schema);
    const std::string grammar = params.value("grammar", json(nullptr)).is_string() ? params["grammar"].get<std::string>() : "";
    if (!js.is_null() && !grammar.empty()) return rpc::invalid_params("Cannot use both json_schema and grammar", "grammar");
    if (!js.is_null()) {
        if (!js.is_object()) return rpc::invalid_params("json_schema must be an object", "json_schema");
        in.json_schema = js.dump();
    }
    in.grammar = grammar;
    if (auto t = params.find("tools"); t != params.end() && !t->is_null()) {
        if (!t->is_array()) return rpc::invalid_params("tools must be an array", "tools");
        if (!t->empty()) in.tools_json = t->dump();
        if (!t->empty() && !grammar.empty())
            return rpc::invalid_params("Cannot use custom grammar constraints with tools.", "grammar");
    }
    if (auto t = params.find("tool_choice"); t != params.end() && !t->is_null()) {
        if (!t->is_string()) return rpc::invalid_params("tool_choice must be auto, none or required", "tool_choice");
        in.tool_choice = t->get<std::string>();
    }
    if (auto t = params.find("parallel_tool_calls"); t != params.end() && t->is_boolean()) in.parallel_tool_calls = t->get<bool>();
    if (auto t = params.find("add_generation_prompt"); t != params.end() && t->is_boolean())
        in.add_generation_prompt = t->get<bool>();
    if (auto t = params.find("continue_final_message"); t != params.end() && !t->is_null())
        in.continue_final_message = t->dump();
    {
        // the server's --reasoning / --reasoning-format, then the request's own fields
        std::lock_guard<std::mutex> lock(mu_);
        in.reasoning_format = reasoning_format_;
        if (reasoning_ == "on" || reasoning_ == "off") {
            in.enable_thinking            = reasoning_ == "on";
            in.kwargs["enable_thinking"] = in.enable_thinking ? "true" : "false";
        }
    }
    if (auto t = params.find("reasoning_format"); t != params.end() && t->is_string()) in.reasoning_format = t->get<std::string>();
    if (auto t = params.find("chat_template_kwargs"); t != params.end() && !t->is_null()) {
        if (!t->is_object()) return rpc::invalid_params("chat_template_kwargs must be an object", "chat_template_kwargs");
        for (auto kv = t->begin(); kv != t->end(); ++kv) in.kwargs[kv.key()] = kv.value().dump();
        if (auto e = t->find("enable_thinking"); e != t->end() && e->is_boolean()) in.enable_thinking = e->get<bool>();
    }
    auto out = chat->apply(in);
    if (!out) return rpc::invalid_params(out.status().message(), out.status().param().empty() ? "messages" : out.status().param());
    return std::move(out.value());
}

rpc::MethodResult Service::apply_template(const json & params, rpc::CallContext &) {
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto r = chat_prompt(params);
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    return json{{"prompt", std::get<ChatTemplateOutput>(r).prompt}};
}

rpc::MethodResult Service::oai_chat(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto r = chat_prompt(params);
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    const ChatTemplateOutput tmpl = std::move(std::get<ChatTemplateOutput>(r));
    SPR_LOG_DEBUG("chat template: format %d, grammar %zu bytes%s, %zu triggers, %zu extra stops", tmpl.format,
                  tmpl.grammar.size(), tmpl.grammar_lazy ? " (lazy)" : "", tmpl.triggers.size(),
                  tmpl.additional_stops.size());
    json p = params;
    for (const char * k : {"messages", "tools", "tool_choice", "json_schema", "response_format"}) p.erase(k);
    // the template's grammar replaces the client's (it is built from it); a Jinja template hands
    // a plain client grammar back untouched, which then stays in the request (and is checked there)
    if (!tmpl.grammar.empty()) p.erase("grammar");
    p.erase("continue_final_message");
    p["prompt"] = tmpl.prompt;
    const bool has_tools = params.contains("tools") && params["tools"].is_array() && !params["tools"].empty() &&
                           params.value("tool_choice", json("auto")) != "none";
    std::string reasoning;
    {
        std::lock_guard<std::mutex> lock(mu_);
        reasoning = reasoning_format_;
    }
    if (auto t = params.find("reasoning_format"); t != params.end() && t->is_string()) reasoning = t->get<std::string>();
    const bool user_grammar = params.contains("grammar") && params["grammar"].is_string();
    auto chat = chat_templates();
    return run_openai(*this, eng, std::move(p), true, ctx,
        [&](const CompletionRequest & req_in, const auto & on_chunk) -> std::variant<CompletionResult, rpc::RpcError> {
            // What the template asks of generation: its grammar (a schema, or the tool-call
            // format, lazy until the model starts a call) and its extra stop strings.
            CompletionRequest req = req_in;
            if (!tmpl.grammar.empty()) {
                req.sampling.grammar      = tmpl.grammar;
                req.sampling.grammar_lazy = tmpl.grammar_lazy;
                // only the template's own grammars (schema, tool calls) start with its generation
                // prompt; a client's grammar describes the output alone
                if (!user_grammar) req.sampling.grammar_prefill = tmpl.generation_prompt;
                for (const auto & t : tmpl.triggers) {
                    if (t.token >= 0) req.sampling.grammar_trigger_tokens.push_back(t.token);
                    else req.sampling.grammar_trigger_patterns.push_back(t.pattern);
                }
            }
            for (const auto & s : tmpl.additional_stops) req.stop.push_back(s);
            ChunkFn fn;
            if (on_chunk) fn = [&](const CompletionChunk & c, int32_t) { on_chunk(c); };
            return run(eng, req, ctx, fn);
        },
        [&](const CompletionResult & res, OaiMeta & meta) {
            if (!chat || (!has_tools && reasoning == "none")) return;
            auto msg = chat->parse(res.content, false, tmpl, reasoning, has_tools);
            if (msg) meta.message = json::parse(msg.value().message_json);
        });
}

}  // namespace specrpc::server
