// Tokenise / detokenise with the guards llama.cpp lacks: text a no-byte-fallback vocabulary cannot
// represent is an error (not an abort), and token ids are range-checked before use.
#pragma once

#include <string>
#include <vector>

#include "engine/model.h"

namespace specrpc {

Result<std::vector<token_id>> tokenize_text(const Model & model, const std::string & text, bool add_bos,
                                            bool parse_special);
Status      validate_token_ids(const Model & model, const std::vector<token_id> & tokens);
std::string token_to_piece(const Model & model, token_id id, bool render_special = false);
std::string detokenize_tokens(const Model & model, const std::vector<token_id> & tokens, bool render_special);

}  // namespace specrpc
