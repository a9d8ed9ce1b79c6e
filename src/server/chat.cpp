// Chat prompts for v1/chat/completions: the model's template (EngineInfo::chat_template, from
// llama_model_chat_template) applied with llama.cpp's public
// llama_chat_apply_template, which knows llama.cpp's built-in templates (no Jinja engine); chatml
// when the model has none.
#include <vector>

#include "llama.h"
#include "server/service.h"

namespace specrpc::server {

Result<std::string> apply_chat_template(const std::string & tmpl_in, const std::vector<ChatMessage> & messages,
                                        bool add_assistant) {
    // A model without a template gets chatml, as llama-server does (common_chat_templates_init).
    const std::string tmpl = tmpl_in.empty() ? std::string("chatml") : tmpl_in;
    std::vector<llama_chat_message> msgs;
    size_t total = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::vector<char> buf(2 * total + 256);
    int32_t n = llama_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), add_assistant, buf.data(),
                                          static_cast<int32_t>(buf.size()));
    if (n > static_cast<int32_t>(buf.size())) {
        buf.resize(static_cast<size_t>(n) + 1);
        n = llama_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), add_assistant, buf.data(),
                                      static_cast<int32_t>(buf.size()));
    }
    if (n < 0)
        return Status(ErrorCode::UNSUPPORTED,
                      "the chat template is not one llama.cpp's llama_chat_apply_template supports (no Jinja "
                      "engine here); start the server with --chat-template NAME (e.g. chatml)");
    return std::string(buf.data(), static_cast<size_t>(n));
}

}  // namespace specrpc::server
