// Embeddings and reranking for `serve --embedding / --reranking` (llama-server's /embeddings,
// /v1/embeddings, /rerank): a second llama.cpp context on the model file, created with
// embeddings on and a pooling type, used by one request at a time. It is apart from the Engine
// because generation contexts never pool, and a pooled context never samples.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "specrpc/status.h"

struct llama_model;
struct llama_context;

namespace specrpc::server {

struct EmbedderOptions {
    std::string model_path;
    std::string pooling;        // none | mean | cls | last | rank; empty = the model's own
    int32_t     n_ctx = 512;    // tokens per input (one llama_decode call)
    int32_t     n_threads = 0;  // 0 = hardware concurrency
    int32_t     n_gpu_layers = 0;
};

class Embedder {
  public:
    static Result<std::unique_ptr<Embedder>> create(const EmbedderOptions & opts);
    ~Embedder();
    Embedder(const Embedder &) = delete;
    Embedder & operator=(const Embedder &) = delete;

    // pooled: one row (L2-normalised, or the scores for rank pooling); none: one row per token.
    // Errors: INVALID_ARGUMENT for an empty or too long input (more than n_ctx tokens).
    Result<std::vector<std::vector<float>>> embed(const std::vector<int32_t> & tokens);

    bool        pooled() const { return pooling_ != "none"; }
    bool        rank() const { return pooling_ == "rank"; }
    int32_t     n_ctx() const { return n_ctx_; }
    // The separators llama-server puts between a rerank query and its document.
    int32_t     bos() const, eos() const, sep() const;
    bool        add_bos() const, add_eos() const, add_sep() const;

  private:
    Embedder() = default;
    std::mutex      mu_;  // one input at a time: the context is not reentrant
    llama_model *   model_ = nullptr;
    llama_context * ctx_   = nullptr;
    std::string     pooling_;
    int32_t         n_ctx_ = 0, n_embd_ = 0;
};

}  // namespace specrpc::server
