// The bridge to llama.cpp's `common` (src/server/chat_templates.cpp): Jinja rendering, the grammar
// and parser of a tool-call format, JSON Schema → GBNF, and errors as values (never exceptions).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "llama.h"
#include "server/chat_templates.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::server;
using nlohmann::json;

namespace {

// Hermes-style tools: llama.cpp recognises <tool_call>{json}</tool_call> blocks in this template.
const char * kToolsJinja =
    "{%- if tools %}<|im_start|>system\n<tools>{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}</tools>\n"
    "For each function call return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for tc in message.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";

const char * kWeather = R"([{"type":"function","function":{"name":"get_weather","description":"w",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

struct Model {
    llama_model * m = nullptr;
    Model() {
        llama_backend_init();
        auto p       = llama_model_default_params();
        m            = llama_model_load_from_file(test::model_path("stories260K-F32.gguf").c_str(), p);
    }
    ~Model() { llama_model_free(m); }
};

Model & model() {
    static Model m;
    return m;
}

}  // namespace

TEST(ChatTemplates, RendersJinjaAndFallsBackToChatml) {
    ASSERT_NE(model().m, nullptr);
    auto ct = ChatTemplates::create(model().m, "{% for m in messages %}<{{ m.role | upper }}>{{ m.content }}{% endfor %}");
    ASSERT_TRUE(ct.is_ok()) << ct.status().message();
    ChatTemplateInput in;
    in.messages_json = R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"ok"}])";
    auto out = ct.value()->apply(in);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    EXPECT_EQ(out.value().prompt, "<USER>hi<ASSISTANT>yo<USER>ok");
    // a last assistant message is a prefill: the prompt ends with its text, to be continued
    in.messages_json = R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])";
    in.add_generation_prompt = true;
    out = ct.value()->apply(in);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    EXPECT_EQ(out.value().prompt, "<USER>hiyo");
    in.prefill_assistant = false;  // closed as a turn of its own
    out = ct.value()->apply(in);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    EXPECT_EQ(out.value().prompt, "<USER>hi<ASSISTANT>yo");

    auto chatml = ChatTemplates::create(model().m, "");  // stories260K has no template
    ASSERT_TRUE(chatml.is_ok());
    in.messages_json = R"([{"role":"user","content":"hi"}])";
    EXPECT_EQ(chatml.value()->apply(in).value().prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplates, ErrorsAreValues) {
    // an unterminated block: common throws; the bridge returns INVALID_ARGUMENT
    auto bad = ChatTemplates::create(model().m, "{% for m in messages %}{{ m.content }");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), ErrorCode::INVALID_ARGUMENT);

    auto ct = ChatTemplates::create(model().m, kToolsJinja);
    ASSERT_TRUE(ct.is_ok()) << ct.status().message();
    ChatTemplateInput in;
    in.messages_json = "[{\"role\":\"user\"";  // not JSON
    EXPECT_FALSE(ct.value()->apply(in).is_ok());
    in.messages_json = R"([{"role":"user","content":"x"}])";
    in.tools_json    = R"([{"type":"function"}])";  // a tool without a function
    EXPECT_FALSE(ct.value()->apply(in).is_ok());
    in.tools_json  = kWeather;
    in.tool_choice = "sometimes";
    EXPECT_FALSE(ct.value()->apply(in).is_ok());
}

TEST(ChatTemplates, ToolCallGrammarAndParse) {
    auto ct = ChatTemplates::create(model().m, kToolsJinja);
    ASSERT_TRUE(ct.is_ok()) << ct.status().message();
    ChatTemplateInput in;
    in.messages_json = R"([{"role":"user","content":"Weather in Paris?"}])";
    in.tools_json    = kWeather;
    in.tool_choice   = "required";
    auto out = ct.value()->apply(in);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    const ChatTemplateOutput & o = out.value();
    EXPECT_NE(o.prompt.find("get_weather"), std::string::npos);
    EXPECT_NE(o.grammar.find("get_weather"), std::string::npos) << o.grammar;
    EXPECT_FALSE(o.grammar_lazy);  // required: the grammar applies from the first token

    auto parsed = ct.value()->parse(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false, o,
        "none", true);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    json msg = json::parse(parsed.value().message_json);
    ASSERT_TRUE(msg.contains("tool_calls")) << msg.dump();
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Paris");

    // auto: free text stays content, the grammar is lazy (waits for a call to start)
    in.tool_choice = "auto";
    auto lazy = ct.value()->apply(in);
    ASSERT_TRUE(lazy.is_ok());
    EXPECT_TRUE(lazy.value().grammar_lazy);
    EXPECT_FALSE(lazy.value().triggers.empty());
    auto text = ct.value()->parse("It is sunny.", false, lazy.value(), "none", true);
    ASSERT_TRUE(text.is_ok());
    json t = json::parse(text.value().message_json);
    EXPECT_EQ(t["content"], "It is sunny.");
    EXPECT_TRUE(!t.contains("tool_calls") || t["tool_calls"].empty());
}

TEST(ChatTemplates, JsonSchemaToGrammar) {
    auto g = json_schema_to_gbnf(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_NE(g.value().find("root ::="), std::string::npos);
    auto bad = json_schema_to_gbnf(R"({"$ref":"#/definitions/nowhere"})");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().param(), "json_schema");
    EXPECT_FALSE(json_schema_to_gbnf("{not json").is_ok());
}
