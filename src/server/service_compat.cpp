// The other vendors' request shapes llama-server accepts: Anthropic's Messages API
// (v1/messages, v1/messages/count_tokens), OpenAI's Responses API (v1/responses), the chat
// token count (chat/completions/input_tokens), and /infill (at the end, over `completion`). The
// first three convert their request into a v1/chat/completions one and run it through oai_chat, so that chat templates, tool calls and
// the sampling fields behave exactly as on the chat route; only the answer is reshaped (and
// streamed chunks are translated into the vendor's events as they arrive).
#include <random>

#include "llama.h"
#include "server/service.h"

namespace specrpc::server {

namespace {

std::string random_hex_id(const char * prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char hex[] = "0123456789abcdef";
    std::string s = prefix;
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

std::string str_field(const json & j, const char * key) {
    if (!j.is_object()) return {};
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// An Anthropic image source as an OpenAI image_url content part (the chat route then answers
// that this server has no vision support).
json image_part(const json & block) {
    const json source = block.is_object() && block.contains("source") ? block["source"] : json::object();
    std::string url = str_field(source, "url");
    if (str_field(source, "type") == "base64") {
        std::string media = str_field(source, "media_type");
        url = "data:" + (media.empty() ? std::string("image/jpeg") : media) + ";base64," + str_field(source, "data");
    }
    return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

// Anthropic tool_result content (a string or text/image blocks) as a tool message's content.
json tool_result_content(const json & c) {
    if (c.is_string()) return c;
    if (!c.is_array()) return "";
    std::string text;
    json parts = json::array();
    bool images = false;
    for (const json & b : c) {
        const std::string type = str_field(b, "type");
        if (type == "text") {
            text += str_field(b, "text");
            parts.push_back({{"type", "text"}, {"text", str_field(b, "text")}});
        } else if (type == "image") {
            images = true;
            parts.push_back(image_part(b));
        }
    }
    return images ? parts : json(text);
}

// Anthropic Messages request -> chat completions request. Unknown block types are dropped, as
// llama-server does; errors name the Anthropic field.
std::variant<json, rpc::RpcError> anthropic_to_chat(const json & body) {
    if (!body.is_object()) return rpc::invalid_params("params must be an object", "params");
    json messages = json::array();
    if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
        std::string sys;
        if (it->is_string()) sys = it->get<std::string>();
        else if (it->is_array())
            for (const json & b : *it)
                if (str_field(b, "type") == "text") sys += str_field(b, "text");
        messages.push_back({{"role", "system"}, {"content", sys}});
    }
    auto mit = body.find("messages");
    if (mit == body.end() || !mit->is_array()) return rpc::invalid_params("messages must be an array", "messages");
    for (const json & msg : *mit) {
        if (!msg.is_object()) return rpc::invalid_params("every message must be an object", "messages");
        const std::string role = str_field(msg, "role");
        auto cit = msg.find("content");
        if (cit == msg.end() || !cit->is_array()) {
            if (cit == msg.end() && role == "assistant") continue;
            messages.push_back(msg);
            continue;
        }
        json content = json::array(), tool_calls = json::array(), tool_msgs = json::array();
        std::string reasoning;
        for (const json & b : *cit) {
            const std::string type = str_field(b, "type");
            if (type == "text") {
                content.push_back({{"type", "text"}, {"text", str_field(b, "text")}});
            } else if (type == "thinking") {
                reasoning += str_field(b, "thinking");
            } else if (type == "image") {
                content.push_back(image_part(b));
            } else if (type == "tool_use") {
                const json input = b.contains("input") ? b["input"] : json::object();
                tool_calls.push_back({{"id", str_field(b, "id")},
                                      {"type", "function"},
                                      {"function", {{"name", str_field(b, "name")}, {"arguments", input.dump()}}}});
            } else if (type == "tool_result") {
                tool_msgs.push_back({{"role", "tool"},
                                     {"tool_call_id", str_field(b, "tool_use_id")},
                                     {"content", tool_result_content(b.value("content", json()))}});
            }
        }
        if (!content.empty() || !tool_calls.empty() || !reasoning.empty()) {
            json m = {{"role", role}, {"content", content.empty() ? json("") : content}};
            if (!tool_calls.empty()) m["tool_calls"] = tool_calls;
            if (!reasoning.empty()) m["reasoning_content"] = reasoning;
            messages.push_back(std::move(m));
        }
        for (json & t : tool_msgs) messages.push_back(std::move(t));
    }
    json out = body;
    for (const char * k : {"system", "messages", "tools", "tool_choice", "stop_sequences", "thinking", "metadata"})
        out.erase(k);
    out["messages"] = std::move(messages);
    if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) out["stop"] = *it;
    if (auto it = body.find("tools"); it != body.end() && it->is_array()) {
        json tools = json::array();
        for (const json & t : *it)
            tools.push_back({{"type", "function"},
                             {"function",
                              {{"name", str_field(t, "name")},
                               {"description", str_field(t, "description")},
                               {"parameters", t.is_object() && t.contains("input_schema") ? t["input_schema"]
                                                                                           : json::object()}}}});
        out["tools"] = std::move(tools);
    }
    if (auto it = body.find("tool_choice"); it != body.end() && it->is_object()) {
        const std::string type = str_field(*it, "type");
        if (type == "auto" || type == "none") out["tool_choice"] = type;
        else if (type == "any") out["tool_choice"] = "required";
        else if (type == "tool")
            out["tool_choice"] = {{"type", "function"}, {"function", {{"name", str_field(*it, "name")}}}};
    }
    if (auto it = body.find("thinking"); it != body.end() && it->is_object())
        out["reasoning_format"] = str_field(*it, "type") == "enabled" ? "deepseek" : "none";
    return out;
}

const char * anthropic_stop_reason(const std::string & finish_reason) {
    if (finish_reason == "length") return "max_tokens";
    if (finish_reason == "tool_calls") return "tool_use";
    return "end_turn";
}

json anthropic_usage(const json & oai_usage) {
    const int64_t prompt = oai_usage.value("prompt_tokens", int64_t(0));
    int64_t cached = 0;
    if (oai_usage.contains("prompt_tokens_details")) cached = oai_usage["prompt_tokens_details"].value("cached_tokens", int64_t(0));
    return {{"cache_read_input_tokens", cached},
            {"input_tokens", prompt - cached},
            {"output_tokens", oai_usage.value("completion_tokens", int64_t(0))}};
}

// OpenAI tool_calls -> Anthropic tool_use blocks (arguments parsed; unparsable: {}).
void append_tool_uses(const json & tool_calls, json & blocks) {
    if (!tool_calls.is_array()) return;
    for (const json & tc : tool_calls) {
        const json fn = tc.value("function", json::object());
        json input = json::object();
        try {
            input = json::parse(str_field(fn, "arguments"));
        } catch (const std::exception &) {
        }
        blocks.push_back({{"type", "tool_use"}, {"id", str_field(tc, "id")}, {"name", str_field(fn, "name")},
                          {"input", input}});
    }
}

// Translates a streamed chat completion into Anthropic's events: message_start, one
// content_block_start/delta.../stop per block (thinking, text, then each tool call), and
// message_delta + message_stop at the end.
class AnthropicStream {
  public:
    AnthropicStream(const rpc::CallContext & out, std::string id, std::string model, int64_t n_input)
        : out_(out), id_(std::move(id)), model_(std::move(model)), n_input_(n_input) {}

    void on_chunk(const json & chunk) {
        start();
        if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return;
        const json delta = chunk["choices"][0].value("delta", json::object());
        if (auto r = str_field(delta, "reasoning_content"); !r.empty()) {
            open("thinking", {{"type", "thinking"}, {"thinking", ""}});
            emit("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                         {"delta", {{"type", "thinking_delta"}, {"thinking", r}}}});
        }
        if (auto t = str_field(delta, "content"); !t.empty()) {
            open("text", {{"type", "text"}, {"text", ""}});
            emit("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                         {"delta", {{"type", "text_delta"}, {"text", t}}}});
        }
        if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
            for (const json & tc : delta["tool_calls"]) {
                const json fn = tc.value("function", json::object());
                const std::string kind = "tool" + std::to_string(tc.value("index", 0));
                if (kind != kind_ || !str_field(fn, "name").empty())
                    open(kind, {{"type", "tool_use"}, {"id", str_field(tc, "id")}, {"name", str_field(fn, "name")},
                                {"input", json::object()}});
                if (auto a = str_field(fn, "arguments"); !a.empty())
                    emit("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                                 {"delta", {{"type", "input_json_delta"}, {"partial_json", a}}}});
            }
        }
    }

    void finish(const json & final_chunk) {
        start();
        close();
        std::string finish_reason;
        if (final_chunk.contains("choices") && final_chunk["choices"].is_array() && !final_chunk["choices"].empty())
            finish_reason = str_field(final_chunk["choices"][0], "finish_reason");
        const json usage = anthropic_usage(final_chunk.value("usage", json::object()));
        emit("message_delta", {{"type", "message_delta"},
                               {"delta", {{"stop_reason", anthropic_stop_reason(finish_reason)}, {"stop_sequence", nullptr}}},
                               {"usage", {{"output_tokens", usage["output_tokens"]}}}});
        emit("message_stop", {{"type", "message_stop"}});
    }

  private:
    void emit(const char * event, json data) const {
        out_.send("completion.chunk", {{"id", out_.id}, {"event", event}, {"data", std::move(data)}});
    }
    void start() {
        if (started_) return;
        started_ = true;
        emit("message_start",
             {{"type", "message_start"},
              {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"content", json::array()},
                           {"model", model_}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                           {"usage", {{"cache_read_input_tokens", 0}, {"input_tokens", n_input_}, {"output_tokens", 0}}}}}});
    }
    void open(const std::string & kind, json block) {
        if (kind == kind_) return;
        close();
        kind_  = kind;
        index_ = next_index_++;
        emit("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
    }
    void close() {
        if (kind_.empty()) return;
        emit("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
        kind_.clear();
    }

    const rpc::CallContext & out_;
    const std::string        id_, model_;
    const int64_t            n_input_;
    bool                     started_ = false;
    std::string              kind_;  // the open block: thinking, text, tool<i>; empty: none
    int                      index_ = -1, next_index_ = 0;
};

bool wants_stream(const json & p) { return p.is_object() && p.value("stream", json(false)) == json(true); }

// Responses API input -> chat messages (text, images, function calls and their outputs).
std::variant<json, rpc::RpcError> responses_to_chat(const json & body) {
    if (!body.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto iit = body.find("input");
    if (iit == body.end()) return rpc::invalid_params("'input' is required", "input");
    if (!str_field(body, "previous_response_id").empty())
        return rpc::invalid_params("previous_response_id is not supported", "previous_response_id");
    json messages = json::array();
    if (body.contains("instructions")) messages.push_back({{"role", "system"}, {"content", str_field(body, "instructions")}});
    auto last_assistant = [&]() -> json * {
        return !messages.empty() && messages.back().value("role", "") == "assistant" ? &messages.back() : nullptr;
    };
    if (iit->is_string()) {
        messages.push_back({{"role", "user"}, {"content", *iit}});
    } else if (iit->is_array()) {
        for (const json & item : *iit) {
            if (!item.is_object()) return rpc::invalid_params("input items must be objects", "input");
            const std::string type = str_field(item, "type"), role = str_field(item, "role");
            if (!role.empty() && (type.empty() || type == "message")) {
                json parts = json::array();
                const json & c = item.contains("content") ? item["content"] : json("");
                if (c.is_string()) {
                    parts.push_back({{"type", "text"}, {"text", c}});
                } else if (c.is_array()) {
                    for (const json & p : c) {
                        const std::string pt = str_field(p, "type");
                        if (pt == "input_text" || pt == "output_text") parts.push_back({{"type", "text"}, {"text", str_field(p, "text")}});
                        else if (pt == "input_image") parts.push_back({{"type", "image_url"}, {"image_url", {{"url", p.value("image_url", json(""))}}}});
                        else if (pt == "refusal") parts.push_back({{"type", "text"}, {"text", str_field(p, "refusal")}});
                        else return rpc::invalid_params("unsupported content type '" + pt + "'", "input");
                    }
                } else {
                    return rpc::invalid_params("message content must be a string or an array", "input");
                }
                json * prev = role == "assistant" ? last_assistant() : nullptr;
                if (prev && (*prev)["content"].is_array()) {
                    for (json & p : parts) (*prev)["content"].push_back(std::move(p));
                } else {
                    messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", parts}});
                }
            } else if (type == "function_call") {
                json tc = {{"id", str_field(item, "call_id")},
                           {"type", "function"},
                           {"function", {{"name", str_field(item, "name")}, {"arguments", str_field(item, "arguments")}}}};
                if (json * prev = last_assistant()) (*prev)["tool_calls"].push_back(std::move(tc));
                else messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({tc})}});
            } else if (type == "function_call_output") {
                const json & o = item.contains("output") ? item["output"] : json("");
                std::string text;
                if (o.is_string()) text = o.get<std::string>();
                else if (o.is_array())
                    for (const json & p : o) text += str_field(p, "text");
                messages.push_back({{"role", "tool"}, {"tool_call_id", str_field(item, "call_id")}, {"content", text}});
            } else if (type == "reasoning") {
                std::string text;
                if (item.contains("content") && item["content"].is_array() && !item["content"].empty())
                    text = str_field(item["content"][0], "text");
                if (json * prev = last_assistant()) (*prev)["reasoning_content"] = text;
                else messages.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", text}});
            } else {
                return rpc::invalid_params("cannot determine the type of an input item", "input");
            }
        }
    } else {
        return rpc::invalid_params("input must be a string or an array of items", "input");
    }
    json out = body;
    for (const char * k : {"input", "instructions", "max_output_tokens", "tools", "reasoning", "store", "text"}) out.erase(k);
    out["messages"] = std::move(messages);
    if (body.contains("max_output_tokens")) out["max_tokens"] = body["max_output_tokens"];
    if (auto it = body.find("tools"); it != body.end() && it->is_array()) {
        json tools = json::array();
        for (json t : *it) {
            if (str_field(t, "type") != "function") continue;  // built-in tools have no chat equivalent
            t.erase("type");
            tools.push_back({{"type", "function"}, {"function", t}});
        }
        if (!tools.empty()) out["tools"] = std::move(tools);
    }
    if (auto it = body.find("reasoning"); it != body.end() && it->is_object() && it->contains("effort"))
        out["reasoning_effort"] = (*it)["effort"];
    return out;
}

json responses_usage(const json & oai_usage) {
    const json d = oai_usage.value("prompt_tokens_details", json::object());
    return {{"input_tokens", oai_usage.value("prompt_tokens", 0)},
            {"output_tokens", oai_usage.value("completion_tokens", 0)},
            {"total_tokens", oai_usage.value("total_tokens", 0)},
            {"input_tokens_details", {{"cached_tokens", d.value("cached_tokens", 0)}}}};
}

// The output items of a finished response: reasoning, message, function calls.
json responses_output(const std::string & reasoning, const std::string & text, const json & tool_calls,
                      const std::string & msg_id, const std::string & rs_id) {
    json output = json::array();
    if (!reasoning.empty())
        output.push_back({{"id", rs_id}, {"type", "reasoning"}, {"summary", json::array()},
                          {"content", json::array({{{"type", "reasoning_text"}, {"text", reasoning}}})},
                          {"encrypted_content", ""}, {"status", "completed"}});
    if (!text.empty())
        output.push_back({{"id", msg_id}, {"type", "message"}, {"role", "assistant"}, {"status", "completed"},
                          {"content", json::array({{{"type", "output_text"}, {"annotations", json::array()},
                                                    {"logprobs", json::array()}, {"text", text}}})}});
    if (tool_calls.is_array())
        for (const json & tc : tool_calls) {
            const json fn = tc.value("function", json::object());
            output.push_back({{"id", "fc_" + str_field(tc, "id")}, {"type", "function_call"}, {"status", "completed"},
                              {"arguments", str_field(fn, "arguments")}, {"call_id", str_field(tc, "id")},
                              {"name", str_field(fn, "name")}});
        }
    return output;
}

// Translates a streamed chat completion into Responses API events.
class ResponsesStream {
  public:
    ResponsesStream(const rpc::CallContext & out, std::string id, std::string model)
        : out_(out), id_(std::move(id)), model_(std::move(model)),
          msg_id_(random_hex_id("msg_")), rs_id_(random_hex_id("rs_")) {}

    void on_chunk(const json & chunk) {
        std::vector<json> events;
        if (!created_) {
            created_ = true;
            const json resp = {{"id", id_}, {"object", "response"}, {"status", "in_progress"}, {"model", model_}};
            events.push_back({{"type", "response.created"}, {"response", resp}});
            events.push_back({{"type", "response.in_progress"}, {"response", resp}});
        } else if (chunk.contains("prompt_progress")) {
            events.push_back({{"type", "response.in_progress"},
                              {"response", {{"id", id_}, {"object", "response"}, {"status", "in_progress"}}}});
        }
        const json delta = chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()
                               ? chunk["choices"][0].value("delta", json::object())
                               : json::object();
        if (auto r = str_field(delta, "reasoning_content"); !r.empty()) {
            if (!reasoning_started_) {
                reasoning_started_ = true;
                events.push_back({{"type", "response.output_item.added"},
                                  {"item", {{"id", rs_id_}, {"type", "reasoning"}, {"summary", json::array()},
                                            {"content", json::array()}, {"encrypted_content", ""}, {"status", "in_progress"}}}});
            }
            reasoning_ += r;
            events.push_back({{"type", "response.reasoning_text.delta"}, {"item_id", rs_id_}, {"delta", r}});
        }
        if (auto t = str_field(delta, "content"); !t.empty()) {
            if (!text_started_) {
                text_started_ = true;
                events.push_back({{"type", "response.output_item.added"},
                                  {"item", {{"id", msg_id_}, {"type", "message"}, {"role", "assistant"},
                                            {"status", "in_progress"}, {"content", json::array()}}}});
                events.push_back({{"type", "response.content_part.added"}, {"item_id", msg_id_},
                                  {"part", {{"type", "output_text"}, {"text", ""}}}});
            }
            text_ += t;
            events.push_back({{"type", "response.output_text.delta"}, {"item_id", msg_id_}, {"delta", t}});
        }
        if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
            for (const json & tc : delta["tool_calls"]) {
                const json fn = tc.value("function", json::object());
                const size_t i = tc.value("index", size_t(0));
                if (i >= calls_.size()) calls_.resize(i + 1, json{{"id", ""}, {"type", "function"},
                                                                  {"function", {{"name", ""}, {"arguments", ""}}}});
                json & call = calls_[i];
                if (auto id = str_field(tc, "id"); !id.empty()) call["id"] = id;
                if (auto n = str_field(fn, "name"); !n.empty()) {
                    call["function"]["name"] = n;
                    events.push_back({{"type", "response.output_item.added"},
                                      {"item", {{"id", "fc_" + str_field(call, "id")}, {"type", "function_call"},
                                                {"arguments", ""}, {"call_id", str_field(call, "id")}, {"name", n},
                                                {"status", "in_progress"}}}});
                }
                if (auto a = str_field(fn, "arguments"); !a.empty()) {
                    call["function"]["arguments"] = str_field(call["function"], "arguments") + a;
                    events.push_back({{"type", "response.function_call_arguments.delta"},
                                      {"item_id", "fc_" + str_field(call, "id")}, {"delta", a}});
                }
            }
        }
        if (!events.empty()) {  // llama.cpp's telemetry rides on the last event of the chunk
            if (chunk.contains("timings")) events.back()["timings"] = chunk["timings"];
            if (chunk.contains("prompt_progress")) events.back()["prompt_progress"] = chunk["prompt_progress"];
        }
        for (json & e : events) emit(std::move(e));
    }

    void finish(const json & final_chunk) {
        if (!created_) on_chunk(json::object());
        json calls = json::array();
        for (const json & c : calls_) calls.push_back(c);
        const json output = responses_output(reasoning_, text_, calls, msg_id_, rs_id_);
        for (const json & item : output) {
            if (item["type"] == "message") {
                const json part = item["content"][0];
                emit({{"type", "response.output_text.done"}, {"item_id", msg_id_}, {"text", text_}});
                emit({{"type", "response.content_part.done"}, {"item_id", msg_id_}, {"part", part}});
            }
            emit({{"type", "response.output_item.done"}, {"item", item}});
        }
        json done = {{"type", "response.completed"},
                     {"response", {{"id", id_}, {"object", "response"}, {"created_at", final_chunk.value("created", 0)},
                                   {"status", "completed"}, {"model", model_}, {"output", output},
                                   {"usage", responses_usage(final_chunk.value("usage", json::object()))}}}};
        if (final_chunk.contains("timings")) done["timings"] = final_chunk["timings"];
        emit(std::move(done));
    }

  private:
    void emit(json data) const {
        const std::string event = data["type"].get<std::string>();
        out_.send("completion.chunk", {{"id", out_.id}, {"event", event}, {"data", std::move(data)}});
    }

    const rpc::CallContext & out_;
    const std::string        id_, model_, msg_id_, rs_id_;
    bool                     created_ = false, reasoning_started_ = false, text_started_ = false;
    std::string              reasoning_, text_;
    std::vector<json>        calls_;
};

}  // namespace

rpc::MethodResult Service::chat_input_tokens(const json & params, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    auto prompt = chat_prompt(params);
    if (auto * err = std::get_if<rpc::RpcError>(&prompt)) return *err;
    auto toks = eng->tokenize(std::get<ChatTemplateOutput>(prompt).prompt, eng->info().add_bos, true);
    if (!toks) return rpc::invalid_params(toks.status().message(), "messages");
    return json{{"input_tokens", toks.value().size()}};
}

rpc::MethodResult Service::anthropic_count_tokens(const json & params, rpc::CallContext & ctx) {
    auto chat = anthropic_to_chat(params);
    if (auto * err = std::get_if<rpc::RpcError>(&chat)) return *err;
    return chat_input_tokens(std::get<json>(chat), ctx);
}

// OpenAI's Responses token count (/v1/responses/input_tokens): the request as a chat, counted.
rpc::MethodResult Service::responses_input_tokens(const json & params, rpc::CallContext & ctx) {
    auto chat = responses_to_chat(params);
    if (auto * err = std::get_if<rpc::RpcError>(&chat)) return *err;
    rpc::MethodResult r = chat_input_tokens(std::get<json>(chat), ctx);
    if (auto * j = std::get_if<json>(&r)) (*j)["object"] = "response.input_tokens";
    return r;
}

rpc::MethodResult Service::chat_as(json & chat, rpc::CallContext & ctx,
                                   const std::function<void(const json &)> & on_chunk) {
    chat["stream"] = static_cast<bool>(on_chunk);
    rpc::CallContext inner = ctx;
    inner.notify = nullptr;
    if (on_chunk)
        inner.notify = [&on_chunk](const std::string &, const json & p) { on_chunk(p.value("data", json::object())); };
    return oai_chat(chat, inner);
}

rpc::MethodResult Service::anthropic_messages(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    auto conv = anthropic_to_chat(params);
    if (auto * err = std::get_if<rpc::RpcError>(&conv)) return *err;
    json chat = std::move(std::get<json>(conv));
    const std::string id = random_hex_id("msg_");
    const bool stream = wants_stream(params) && static_cast<bool>(ctx.notify);
    if (!stream) {
        rpc::MethodResult r = chat_as(chat, ctx, nullptr);
        if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
        const json & res = std::get<json>(r);
        const json choice = res["choices"][0];
        const json message = choice.value("message", json::object());
        json blocks = json::array();
        if (auto rc = str_field(message, "reasoning_content"); !rc.empty())
            blocks.push_back({{"type", "thinking"}, {"thinking", rc}, {"signature", ""}});
        if (auto text = str_field(message, "content"); !text.empty()) blocks.push_back({{"type", "text"}, {"text", text}});
        append_tool_uses(message.value("tool_calls", json()), blocks);
        return json{{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"content", blocks},
                    {"model", res.value("model", model_name())},
                    {"stop_reason", anthropic_stop_reason(str_field(choice, "finish_reason"))},
                    {"stop_sequence", nullptr},
                    {"usage", anthropic_usage(res.value("usage", json::object()))}};
    }
    // message_start reports the prompt's size before the first token: count it the same way
    int64_t n_input = 0;
    {
        rpc::MethodResult n = chat_input_tokens(chat, ctx);
        if (auto * err = std::get_if<rpc::RpcError>(&n)) return *err;
        n_input = std::get<json>(n)["input_tokens"].get<int64_t>();
    }
    AnthropicStream as(ctx, id, model_name(), n_input);
    rpc::MethodResult r = chat_as(chat, ctx, [&as](const json & data) { as.on_chunk(data); });
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    as.finish(std::get<json>(r));
    return nullptr;  // every event was sent already
}

rpc::MethodResult Service::responses(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    auto conv = responses_to_chat(params);
    if (auto * err = std::get_if<rpc::RpcError>(&conv)) return *err;
    json chat = std::move(std::get<json>(conv));
    const std::string id = random_hex_id("resp_");
    const bool stream = wants_stream(params) && static_cast<bool>(ctx.notify);
    if (!stream) {
        rpc::MethodResult r = chat_as(chat, ctx, nullptr);
        if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
        const json & res = std::get<json>(r);
        const json message = res["choices"][0].value("message", json::object());
        const int64_t t = res.value("created", int64_t(0));
        return json{{"id", id},
                    {"object", "response"},
                    {"created_at", t},
                    {"completed_at", t},
                    {"status", "completed"},
                    {"model", res.value("model", model_name())},
                    {"output", responses_output(str_field(message, "reasoning_content"), str_field(message, "content"),
                                                message.value("tool_calls", json()), random_hex_id("msg_"),
                                                random_hex_id("rs_"))},
                    {"usage", responses_usage(res.value("usage", json::object()))}};
    }
    ResponsesStream rs(ctx, id, model_name());
    rpc::MethodResult r = chat_as(chat, ctx, [&rs](const json & data) { rs.on_chunk(data); });
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    rs.finish(std::get<json>(r));
    return nullptr;
}

}  // namespace specrpc::server

// ---- /infill ---------------------------------------------------------------------------------

namespace specrpc::server {

// The model's fill-in-the-middle tokens, read once from its vocabulary (a vocab-only load).
struct Service::FimTokens {
    int32_t pre = -1, suf = -1, mid = -1, rep = -1, sep = -1;
    std::string error;  // non-empty: the model cannot do infill
};

rpc::MethodResult Service::infill(const json & params, rpc::CallContext & ctx) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    // the request is checked first: a malformed one is a 400 whatever the model
    for (const char * k : {"input_prefix", "input_suffix", "prompt"})
        if (params.contains(k) && !params[k].is_null() && !params[k].is_string())
            return rpc::invalid_params(std::string(k) + " must be a string", k);
    json extra = params.value("input_extra", json::array());
    if (!extra.is_array()) return rpc::invalid_params("input_extra must be an array of {filename, text}", "input_extra");
    for (const json & e : extra) {
        if (!e.is_object() || !e.contains("text") || !e["text"].is_string() ||
            (e.contains("filename") && !e["filename"].is_string()))
            return rpc::invalid_params("input_extra items must be objects with a string text (and a string filename)",
                                       "input_extra");
    }
    std::shared_ptr<FimTokens> fim;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!fim_) {
            fim_ = std::make_shared<FimTokens>();
            llama_model_params mp = llama_model_default_params();
            mp.vocab_only = true;
            llama_model * m = llama_model_load_from_file(eng->info().model_path.c_str(), mp);
            if (!m) {
                fim_->error = "cannot read the model's vocabulary";
            } else {
                const llama_vocab * v = llama_model_get_vocab(m);
                fim_->pre = llama_vocab_fim_pre(v);
                fim_->suf = llama_vocab_fim_suf(v);
                fim_->mid = llama_vocab_fim_mid(v);
                fim_->rep = llama_vocab_fim_rep(v);
                fim_->sep = llama_vocab_fim_sep(v);
                if (fim_->pre < 0 || fim_->suf < 0 || fim_->mid < 0)
                    fim_->error = "this model has no fill-in-the-middle tokens (FIM prefix/suffix/middle)";
                llama_model_free(m);
            }
        }
        fim = fim_;
    }
    if (!fim->error.empty()) return rpc::make_error(rpc::ERR_UNSUPPORTED, fim->error);
    auto tok = [&](const std::string & s) { return eng->tokenize(s, false, false); };
    std::vector<token_id> prompt;
    // llama.cpp's repo-level layout: [REP]repo\n then [SEP]filename\ntext per extra file, when the
    // model has those tokens; otherwise the extra texts go in front of the prefix
    std::string extra_text;
    for (const json & e : extra) {
        if (fim->sep >= 0) {
            prompt.push_back(fim->sep);
            auto t = tok(e.value("filename", std::string()) + "\n" + e["text"].get<std::string>());
            if (!t) return rpc::invalid_params(t.status().message(), "input_extra");
            prompt.insert(prompt.end(), t.value().begin(), t.value().end());
        } else {
            extra_text += e["text"].get<std::string>();
        }
    }
    auto pre = tok(extra_text + params.value("input_prefix", std::string()));
    auto suf = tok(params.value("input_suffix", std::string()));
    auto mid = tok(params.value("prompt", std::string()));
    for (auto * r : {&pre, &suf, &mid})
        if (!*r) return rpc::invalid_params(r->status().message(), "input_prefix");
    std::vector<token_id> out;
    if (eng->info().add_bos && eng->info().bos >= 0) out.push_back(eng->info().bos);
    out.insert(out.end(), prompt.begin(), prompt.end());
    out.push_back(fim->pre);
    out.insert(out.end(), pre.value().begin(), pre.value().end());
    out.push_back(fim->suf);
    out.insert(out.end(), suf.value().begin(), suf.value().end());
    out.push_back(fim->mid);
    out.insert(out.end(), mid.value().begin(), mid.value().end());
    json p = params;
    for (const char * k : {"input_prefix", "input_suffix", "input_extra"}) p.erase(k);
    p["prompt"] = out;
    return completion(p, ctx);
}

}  // namespace specrpc::server
