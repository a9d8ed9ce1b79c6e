// The bridge to llama.cpp's `common` chat and schema code (see chat_templates.h for why it exists
// and why JSON crosses it as text). `common` reports bad input by throwing; every entry point here
// turns that into a Status so no exception leaves this file.
#include "server/chat_templates.h"

#include <exception>

#include "chat.h"
#include "json-schema-to-grammar.h"
#include "llama.h"

namespace specrpc::server {

struct ChatTemplates::Impl {
    common_chat_templates_ptr tmpls;
    bool                      use_jinja = true;
};

// llama.cpp's built-in template names ("chatml", "llama3", ...): not Jinja source.
static bool is_builtin_name(const std::string & s) {
    std::vector<const char *> names(256);
    int32_t n = llama_chat_builtin_templates(names.data(), names.size());
    for (int32_t i = 0; i < n && i < (int32_t)names.size(); ++i)
        if (s == names[i]) return true;
    return false;
}

ChatTemplates::ChatTemplates(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplates::~ChatTemplates() = default;

Result<std::shared_ptr<ChatTemplates>> ChatTemplates::create(const llama_model * model,
                                                             const std::string & override_src, bool use_jinja) {
    try {
        auto impl       = std::make_unique<Impl>();
        impl->use_jinja = use_jinja && !(override_src != "chatml" && is_builtin_name(override_src));
        impl->tmpls     = common_chat_templates_init(model, override_src);
        if (!impl->tmpls) return invalid_arg("chat template could not be loaded", "chat_template");
        // Render a probe conversation now, so a template that fails on ordinary input is reported
        // at start-up rather than on every request.
        common_chat_templates_inputs probe;
        probe.messages.push_back({});
        probe.messages.back().role    = "user";
        probe.messages.back().content = "hi";
        probe.use_jinja               = impl->use_jinja;
        (void)common_chat_templates_apply(impl->tmpls.get(), probe);
        return std::shared_ptr<ChatTemplates>(new ChatTemplates(std::move(impl)));
    } catch (const std::exception & e) {
        return invalid_arg(std::string("chat template: ") + e.what(), "chat_template");
    }
}

// Words a lazy grammar waits for are matched literally; the sampler takes regexes.
static std::string regex_quote(const std::string & s) {
    static const std::string special = R"(.^$|()[]{}*+?\)";
    std::string out;
    for (char c : s) {
        if (special.find(c) != std::string::npos) out += '\\';
        out += c;
    }
    return out;
}

Result<ChatTemplateOutput> ChatTemplates::apply(const ChatTemplateInput & in) const {
    common_chat_templates_inputs inputs;
    try {
        inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(in.messages_json));
        if (!in.tools_json.empty()) inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(in.tools_json));
        inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(in.tool_choice);
    } catch (const std::exception & e) {
        return invalid_arg(e.what(), "messages");
    }
    inputs.use_jinja             = impl_->use_jinja;
    inputs.json_schema           = in.json_schema;
    inputs.grammar               = in.grammar;
    inputs.add_generation_prompt = in.add_generation_prompt;
    // A last assistant message is a prefill the model continues (llama-server's prefill_assistant;
    // vLLM's continue_final_message says the same explicitly): its text ends the prompt, with no
    // end-of-turn after it and no new generation prompt.
    try {
        if (!in.continue_final_message.empty())
            inputs.continue_final_message = common_chat_continuation_parse(common_json::parse(in.continue_final_message));
    } catch (const std::exception & e) {
        return invalid_arg(std::string("continue_final_message: ") + e.what(), "continue_final_message");
    }
    const auto & msgs = inputs.messages;
    if (inputs.continue_final_message == COMMON_CHAT_CONTINUATION_NONE && in.prefill_assistant && !msgs.empty() &&
        msgs.back().role == "assistant") {
        if (msgs.size() >= 2 && msgs[msgs.size() - 2].role == "assistant")
            return invalid_arg("Cannot have 2 or more assistant messages at the end of the list.", "messages");
        inputs.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
        inputs.add_generation_prompt  = false;
    }
    if (inputs.continue_final_message != COMMON_CHAT_CONTINUATION_NONE) {
        if (inputs.add_generation_prompt)
            return invalid_arg("Cannot set both add_generation_prompt and continue_final_message to true.",
                               "continue_final_message");
        if (!msgs.empty() && msgs.back().role == "assistant" && !msgs.back().tool_calls.empty())
            return invalid_arg("Cannot continue an assistant message that contains tool calls.", "messages");
    }
    inputs.enable_thinking       = in.enable_thinking;
    inputs.chat_template_kwargs  = in.kwargs;
    inputs.reasoning_format      = common_reasoning_format_from_name(in.reasoning_format);
    if (in.parallel_tool_calls >= 0) {
        inputs.parallel_tool_calls = in.parallel_tool_calls != 0;
    } else {
        auto caps = common_chat_templates_get_caps(impl_->tmpls.get());
        inputs.parallel_tool_calls = caps["supports_parallel_tool_calls"];
    }
    common_chat_params p;
    try {
        p = common_chat_templates_apply(impl_->tmpls.get(), inputs);
    } catch (const std::exception & e) {
        return invalid_arg(e.what(), "messages");
    }
    ChatTemplateOutput out;
    out.prompt            = std::move(p.prompt);
    out.grammar           = std::move(p.grammar);
    out.grammar_lazy      = p.grammar_lazy;
    out.additional_stops  = std::move(p.additional_stops);
    out.format            = static_cast<int>(p.format);
    out.generation_prompt = std::move(p.generation_prompt);
    out.parser            = std::move(p.parser);
    for (const auto & t : p.grammar_triggers) {
        ChatGrammarTrigger g;
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: g.token = t.token; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: g.pattern = regex_quote(t.value); break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: g.pattern = t.value; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                const std::string & v = t.value;
                g.pattern = v.empty() ? "^$" : (v.front() == '^' ? "" : "^") + v + (v.back() == '$' ? "" : "$");
                break;
            }
        }
        out.triggers.push_back(std::move(g));
    }
    return out;
}

Result<ChatParsed> ChatTemplates::parse(const std::string & text, bool partial, const ChatTemplateOutput & how,
                                        const std::string & reasoning_format, bool parse_tool_calls) const {
    try {
        common_chat_parser_params pp;
        pp.format            = static_cast<common_chat_format>(how.format);
        pp.generation_prompt = how.generation_prompt;
        pp.reasoning_format  = common_reasoning_format_from_name(reasoning_format);
        pp.parse_tool_calls  = parse_tool_calls;
        if (!how.parser.empty()) pp.parser.load(how.parser);
        common_chat_msg msg = common_chat_parse(text, partial, pp);
        if (msg.role.empty()) msg.role = "assistant";
        return ChatParsed{msg.to_json_oaicompat().dump()};
    } catch (const std::exception & e) {
        return Status(ErrorCode::INTERNAL, std::string("parsing the model's output: ") + e.what());
    }
}

std::string ChatTemplates::source() const { return common_chat_templates_source(impl_->tmpls.get()); }

bool ChatTemplates::explicit_template() const { return common_chat_templates_was_explicit(impl_->tmpls.get()); }

std::string ChatTemplates::caps_json() const {
    std::string out = "{";
    for (const auto & [k, v] : common_chat_templates_get_caps(impl_->tmpls.get())) {
        if (out.size() > 1) out += ",";
        out += "\"" + k + "\":" + (v ? "true" : "false");
    }
    return out + "}";
}

Result<std::string> json_schema_to_gbnf(const std::string & schema_json) {
    try {
        return json_schema_to_grammar(common_json::parse(schema_json));
    } catch (const std::exception & e) {
        return invalid_arg(std::string("invalid JSON schema: ") + e.what(), "json_schema");
    }
}

}  // namespace specrpc::server
