// A loaded GGUF model with its vocabulary facts (what the tokenizer guard and the draft/target
// compatibility check need). Owns the llama_model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "specrpc/engine.hpp"

struct llama_model;
struct llama_vocab;

namespace specrpc {

class RpcLinks;

class Model {
  public:
    // Loads `params.path`. Checks the file exists and is a GGUF before handing it to llama.cpp.
    static Result<std::shared_ptr<Model>> load(const ModelParams & params,
                                               std::function<bool(float)> on_progress = {});
    ~Model();

    llama_model *       get() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    const std::string & path() const { return path_; }
    int32_t             n_vocab() const { return n_vocab_; }
    int32_t             n_ctx_train() const { return n_ctx_train_; }
    std::string         desc() const;
    bool                has_byte_fallback() const { return byte_fallback_; }
    // For tokenizers without byte fallback: can every code point of `text` be represented?
    // Returns the offending code point's byte offset, or -1 when all are representable.
    int64_t             first_unrepresentable(const std::string & text) const;
    // The links to the RPC workers this model's layers are on (null: all local).
    const RpcLinks *    rpc() const { return rpc_links_.get(); }

  private:
    Model() = default;
    llama_model *       model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    std::string         path_;
    int32_t             n_vocab_ = 0, n_ctx_train_ = 0;
    bool                byte_fallback_ = true;
    std::unordered_set<std::string> chars_;  // single-code-point pieces (no-byte-fallback vocabs)
    std::shared_ptr<RpcLinks> rpc_links_;    // outlives model_ (its frees go through them)
};

// The draft/target vocabulary check, stricter than llama.cpp's: same vocab type, same special
// tokens (BOS/EOS and the add-BOS/EOS flags), sizes within 128 of each other, and identical token
// text for every id both have. The error names the first differing id and both texts.
Status vocab_check_compatible(const Model & target, const Model & draft);

}  // namespace specrpc
