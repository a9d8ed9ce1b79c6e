// Chat prompts, tool calls and JSON schemas through llama.cpp's `common` library, the reference
// implementation llama-server uses: the Jinja template from the GGUF (or --chat-template /
// --chat-template-file), the grammar that constrains tool calls and the parser that reads them
// back, and JSON Schema → GBNF. A hand-written copy of these would drift from llama-server's
// behaviour, which clients and llama-server's own test suite rely on.
//
// Nothing here takes or returns a JSON library type: `common` is built against its own vendored
// nlohmann::json (another version than the Debian one the server uses), so JSON crosses this
// boundary as text and the two libraries never meet in one translation unit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

struct llama_model;

namespace specrpc::server {

// What a chat request asks the template for (the OpenAI fields, as JSON text where they are JSON).
struct ChatTemplateInput {
    std::string messages_json = "[]";   // OpenAI messages array
    std::string tools_json;             // OpenAI tools array; empty = none
    std::string tool_choice = "auto";   // auto | none | required
    std::string json_schema;            // JSON Schema text; empty = none
    std::string grammar;                // GBNF; empty = none (exclusive with json_schema and tools)
    bool        add_generation_prompt = true;
    std::string continue_final_message;  // the request's field as JSON text (true, "content",
                                         // "reasoning_content"); empty = absent
    bool        prefill_assistant = true;  // a last assistant message is continued, not closed
    int         parallel_tool_calls = -1;  // -1: as the template supports; 0/1: the request's
    bool        enable_thinking = true;
    std::string reasoning_format = "none";  // none | auto | deepseek | deepseek-legacy
    std::map<std::string, std::string> kwargs;  // chat_template_kwargs, values as JSON text
};

// One trigger of a lazy grammar: the grammar applies only once the output matches it.
struct ChatGrammarTrigger {
    std::string pattern;   // a regex (words escaped), empty when token >= 0
    int32_t     token = -1;
};

// The rendered prompt and what generation needs to honour the template's output format.
struct ChatTemplateOutput {
    std::string prompt;
    std::string grammar;                      // GBNF from json_schema or tools; empty = none
    bool        grammar_lazy = false;         // apply only after a trigger (tool calls)
    std::vector<ChatGrammarTrigger> triggers;
    std::vector<std::string> additional_stops;
    // What parse() needs to read the output back (opaque to callers).
    int         format = 0;
    std::string generation_prompt, parser;
};

// A chat message parsed from generated text: content, reasoning and tool calls.
struct ChatParsed {
    std::string message_json;   // {"role":"assistant","content":...,"tool_calls":[...],...}
};

class ChatTemplates {
  public:
    // Errors: INVALID_ARGUMENT when the template does not parse.
    // override_src: --chat-template's text, or one of llama.cpp's built-in template names (then
    // rendered by llama_chat_apply_template, as llama-server does without Jinja); empty = the
    // model's own, chatml when it has none.
    static Result<std::shared_ptr<ChatTemplates>> create(const llama_model * model, const std::string & override_src,
                                                         bool use_jinja = true);
    ~ChatTemplates();

    // Errors: INVALID_ARGUMENT naming what is wrong with the messages, tools or schema.
    Result<ChatTemplateOutput> apply(const ChatTemplateInput & in) const;
    // Reads generated text back into a message; partial = still streaming.
    Result<ChatParsed> parse(const std::string & text, bool partial, const ChatTemplateOutput & how,
                             const std::string & reasoning_format, bool parse_tool_calls) const;

    std::string source() const;       // the template's text
    std::string caps_json() const;    // {"supports_tools": true, ...} as llama-server's /props
    bool        explicit_template() const;  // the model (or the command line) gave one

  private:
    struct Impl;
    explicit ChatTemplates(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// JSON Schema (text) → GBNF. Errors: INVALID_ARGUMENT with llama.cpp's reason.
Result<std::string> json_schema_to_gbnf(const std::string & schema_json);

}  // namespace specrpc::server
