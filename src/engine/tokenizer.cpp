#include "engine/tokenizer.h"

#include <climits>

#include "llama.h"

namespace specrpc {

Result<std::vector<token_id>> tokenize_text(const Model & model, const std::string & text, bool add_bos,
                                            bool parse_special) {
    if (text.size() > static_cast<size_t>(INT32_MAX / 2)) return invalid_arg("text too long", "prompt");
    if (int64_t bad = model.first_unrepresentable(text); bad >= 0) {
        size_t end = static_cast<size_t>(bad) + 1;
        while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
        return invalid_arg("the model's vocabulary (no byte fallback) cannot represent the character '" +
                               text.substr(bad, end - bad) + "' at byte " + std::to_string(bad),
                           "prompt");
    }
    std::vector<token_id> out(text.size() + 8);
    int32_t n = llama_tokenize(model.vocab(), text.data(), static_cast<int32_t>(text.size()), out.data(),
                               static_cast<int32_t>(out.size()), add_bos, parse_special);
    if (n == INT32_MIN) return invalid_arg("text too long to tokenize", "prompt");
    if (n < 0) {
        out.resize(static_cast<size_t>(-n));
        n = llama_tokenize(model.vocab(), text.data(), static_cast<int32_t>(text.size()), out.data(),
                           static_cast<int32_t>(out.size()), add_bos, parse_special);
        if (n < 0) return Status(ErrorCode::INTERNAL, "tokenizer failed");
    }
    out.resize(static_cast<size_t>(n));
    return out;
}

Status validate_token_ids(const Model & model, const std::vector<token_id> & tokens) {
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= model.n_vocab())
            return invalid_arg("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                   " is out of range [0, " + std::to_string(model.n_vocab()) + ")",
                               "prompt");
    return Status::ok();
}

std::string token_to_piece(const Model & model, token_id id, bool render_special) {
    if (id < 0 || id >= model.n_vocab()) return {};
    char    buf[128];
    int32_t n = llama_token_to_piece(model.vocab(), id, buf, sizeof buf, 0, render_special);
    if (n >= 0) return std::string(buf, static_cast<size_t>(n));
    std::string s(static_cast<size_t>(-n), '\0');
    n = llama_token_to_piece(model.vocab(), id, s.data(), static_cast<int32_t>(s.size()), 0, render_special);
    return n >= 0 ? s.substr(0, static_cast<size_t>(n)) : std::string();
}

std::string detokenize_tokens(const Model & model, const std::vector<token_id> & tokens, bool render_special) {
    if (!validate_token_ids(model, tokens)) return {};
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(model.vocab(), tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                                 static_cast<int32_t>(out.size()), false, render_special);
    if (n < 0) {
        out.resize(static_cast<size_t>(-n));
        n = llama_detokenize(model.vocab(), tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                             static_cast<int32_t>(out.size()), false, render_special);
    }
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return out;
}

}  // namespace specrpc
