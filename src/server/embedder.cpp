#include "server/embedder.h"

#include <cmath>
#include <thread>

#include "llama.h"

namespace specrpc::server {

namespace {

const char * pooling_name(enum llama_pooling_type t) {
    switch (t) {
        case LLAMA_POOLING_TYPE_NONE: return "none";
        case LLAMA_POOLING_TYPE_MEAN: return "mean";
        case LLAMA_POOLING_TYPE_CLS:  return "cls";
        case LLAMA_POOLING_TYPE_LAST: return "last";
        case LLAMA_POOLING_TYPE_RANK: return "rank";
        default:                      return "none";
    }
}

}  // namespace

Result<std::unique_ptr<Embedder>> Embedder::create(const EmbedderOptions & o) {
    enum llama_pooling_type pt = LLAMA_POOLING_TYPE_UNSPECIFIED;
    if (o.pooling == "none") pt = LLAMA_POOLING_TYPE_NONE;
    else if (o.pooling == "mean") pt = LLAMA_POOLING_TYPE_MEAN;
    else if (o.pooling == "cls") pt = LLAMA_POOLING_TYPE_CLS;
    else if (o.pooling == "last") pt = LLAMA_POOLING_TYPE_LAST;
    else if (o.pooling == "rank") pt = LLAMA_POOLING_TYPE_RANK;
    else if (!o.pooling.empty())
        return Status(ErrorCode::INVALID_ARGUMENT, "--pooling must be none, mean, cls, last or rank");
    std::unique_ptr<Embedder> e(new Embedder());
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = o.n_gpu_layers;
    e->model_ = llama_model_load_from_file(o.model_path.c_str(), mp);
    if (!e->model_) return Status(ErrorCode::INVALID_ARGUMENT, "embeddings: cannot load " + o.model_path);
    const int32_t n_threads = o.n_threads > 0 ? o.n_threads : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx        = static_cast<uint32_t>(std::max(8, o.n_ctx));
    cp.n_batch      = cp.n_ctx;  // one input is one decode call: pooling sees all of it
    cp.n_ubatch     = cp.n_ctx;
    cp.n_seq_max    = 1;
    cp.n_threads    = n_threads;
    cp.n_threads_batch = n_threads;
    cp.embeddings   = true;
    cp.pooling_type = pt;
    e->ctx_ = llama_init_from_model(e->model_, cp);
    if (!e->ctx_) return Status(ErrorCode::INVALID_ARGUMENT, "embeddings: cannot create a context for " + o.model_path);
    e->pooling_ = pooling_name(llama_pooling_type(e->ctx_));
    e->n_ctx_   = static_cast<int32_t>(llama_n_ctx(e->ctx_));
    e->n_embd_  = llama_model_n_embd(e->model_);
    return e;
}

Embedder::~Embedder() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
}

Result<std::vector<std::vector<float>>> Embedder::embed(const std::vector<int32_t> & tokens) {
    if (tokens.empty()) return Status(ErrorCode::INVALID_ARGUMENT, "the input is empty");
    if (static_cast<int32_t>(tokens.size()) > n_ctx_)
        return Status(ErrorCode::INVALID_ARGUMENT, "input (" + std::to_string(tokens.size()) +
                                                       " tokens) is too large to process: the embedding context is " +
                                                       std::to_string(n_ctx_) + " tokens (-c / --parallel)");
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab) return Status(ErrorCode::INVALID_ARGUMENT, "token id " + std::to_string(t) + " is out of range");
    std::lock_guard<std::mutex> lock(mu_);
    llama_memory_clear(llama_get_memory(ctx_), true);
    llama_batch batch = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
        batch.token[i]     = tokens[i];
        batch.pos[i]       = static_cast<llama_pos>(i);
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = true;  // an output per token: pooling "none" reads them all
    }
    batch.n_tokens = static_cast<int32_t>(tokens.size());
    const int rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    if (rc != 0) return Status(ErrorCode::INTERNAL, "embeddings: llama_decode failed (" + std::to_string(rc) + ")");
    std::vector<std::vector<float>> out;
    if (!pooled()) {
        for (size_t i = 0; i < tokens.size(); ++i) {
            const float * v = llama_get_embeddings_ith(ctx_, static_cast<int32_t>(i));
            if (!v) return Status(ErrorCode::INTERNAL, "embeddings: no output for a token");
            out.emplace_back(v, v + n_embd_);
        }
        return out;
    }
    const float * v = llama_get_embeddings_seq(ctx_, 0);
    if (!v) return Status(ErrorCode::INTERNAL, "embeddings: no pooled output");
    if (rank()) {  // the score is the first value (models without a classifier head give the hidden state)
        out.push_back({v[0]});
        return out;
    }
    std::vector<float> row(v, v + n_embd_);
    double norm = 0;
    for (float x : row) norm += double(x) * x;
    norm = std::sqrt(norm);
    if (norm > 0)
        for (float & x : row) x = static_cast<float>(x / norm);
    out.push_back(std::move(row));
    return out;
}

int32_t Embedder::bos() const { return llama_vocab_bos(llama_model_get_vocab(model_)); }
int32_t Embedder::eos() const {
    const llama_vocab * v = llama_model_get_vocab(model_);
    return llama_vocab_eos(v) != LLAMA_TOKEN_NULL ? llama_vocab_eos(v) : llama_vocab_sep(v);
}
int32_t Embedder::sep() const { return llama_vocab_sep(llama_model_get_vocab(model_)); }
bool Embedder::add_bos() const { return llama_vocab_get_add_bos(llama_model_get_vocab(model_)); }
bool Embedder::add_eos() const { return llama_vocab_get_add_eos(llama_model_get_vocab(model_)); }
bool Embedder::add_sep() const { return llama_vocab_get_add_sep(llama_model_get_vocab(model_)); }

}  // namespace specrpc::server
