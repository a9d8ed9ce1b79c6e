// llama-server's embedding and rerank routes over the Embedder (embedder.h): /embeddings
// (llama-server's shape, every pooling), /v1/embeddings (OpenAI's, pooled only, base64 on request)
// and /rerank (Jina's shape, or TEI's when the documents come as `texts`).
#include <algorithm>
#include <cstring>

#include "server/embedder.h"
#include "server/service.h"

namespace specrpc::server {

namespace {

std::string base64(const void * data, size_t n) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char * p = static_cast<const unsigned char *>(data);
    std::string out;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t(p[i]) << 16) | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out += tbl[(v >> 18) & 63];
        out += tbl[(v >> 12) & 63];
        out += i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        out += i + 2 < n ? tbl[v & 63] : '=';
    }
    return out;
}

}  // namespace

// One input: a string, or an array of token ids and strings (tokenised without BOS after the first).
std::variant<std::vector<token_id>, rpc::RpcError> Service::embed_tokens(const Engine & eng, const json & in,
                                                                          const char * param) const {
    std::vector<token_id> out;
    auto add_text = [&](const std::string & s, bool bos) -> std::optional<rpc::RpcError> {
        auto t = eng.tokenize(s, bos && eng.info().add_bos, true);
        if (!t) return rpc::invalid_params(t.status().message(), param);
        out.insert(out.end(), t.value().begin(), t.value().end());
        return std::nullopt;
    };
    if (in.is_string()) {
        if (auto e = add_text(in.get<std::string>(), true)) return *e;
        return out;
    }
    if (!in.is_array()) return rpc::invalid_params(std::string(param) + " must be a string or an array", param);
    for (size_t i = 0; i < in.size(); ++i) {
        const json & el = in[i];
        if (el.is_number_integer()) {
            const int64_t id = el.get<int64_t>();
            if (id < 0 || id >= eng.info().n_vocab)
                return rpc::invalid_params("token id " + std::to_string(id) + " is out of range", param);
            out.push_back(static_cast<token_id>(id));
        } else if (el.is_string()) {
            if (auto e = add_text(el.get<std::string>(), i == 0)) return *e;
        } else {
            return rpc::invalid_params(std::string(param) + " elements must be strings or token ids", param);
        }
    }
    return out;
}

rpc::MethodResult Service::embeddings_impl(const json & params, bool oai) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    std::shared_ptr<Embedder> emb;
    {
        std::lock_guard<std::mutex> lock(mu_);
        emb = embedder_;
    }
    if (!emb || emb->rank())
        return rpc::make_error(rpc::ERR_UNSUPPORTED, "This server does not support embeddings. Start it with `--embeddings`");
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    const char * key = params.contains("input") ? "input" : "content";
    auto it = params.find(key);
    if (it == params.end() || it->is_null()) return rpc::invalid_params("\"input\" must be provided", "input");
    if (oai && !emb->pooled())
        return rpc::invalid_params("Pooling type 'none' is not OAI compatible. Please use a different pooling type", "input");
    bool b64 = false;
    if (auto f = params.find("encoding_format"); f != params.end() && !f->is_null()) {
        if (*f == "base64") b64 = true;
        else if (*f != "float") return rpc::invalid_params("encoding_format must be float or base64", "encoding_format");
    }
    // several inputs: an array of strings and/or arrays; one input: a string or a flat array
    std::vector<json> inputs;
    const bool multi = it->is_array() && !it->empty() &&
                       std::all_of(it->begin(), it->end(), [](const json & e) { return e.is_string() || e.is_array(); });
    if (multi) inputs.assign(it->begin(), it->end());
    else inputs.push_back(*it);
    json data = json::array();
    int64_t n_tokens = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
        auto toks = embed_tokens(*eng, inputs[i], key);
        if (auto * err = std::get_if<rpc::RpcError>(&toks)) return *err;
        auto & t = std::get<std::vector<token_id>>(toks);
        if (t.empty() && eng->info().bos >= 0) t.push_back(eng->info().bos);  // "" still embeds (BOS alone)
        auto rows = emb->embed(t);
        if (!rows) return rpc::invalid_params(rows.status().message(), key);
        n_tokens += static_cast<int64_t>(t.size());
        if (!oai) {
            data.push_back({{"index", i}, {"embedding", rows.value()}});
            continue;
        }
        const std::vector<float> & v = rows.value()[0];
        json e = {{"object", "embedding"}, {"index", i}};
        if (b64) e["embedding"] = base64(v.data(), v.size() * sizeof(float));
        else e["embedding"] = v;
        data.push_back(std::move(e));
    }
    if (!oai) return data;
    return json{{"object", "list"}, {"model", model_name()}, {"data", data},
                {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
}

rpc::MethodResult Service::embeddings(const json & params, rpc::CallContext &) { return embeddings_impl(params, false); }
rpc::MethodResult Service::oai_embeddings(const json & params, rpc::CallContext &) { return embeddings_impl(params, true); }

rpc::MethodResult Service::rerank(const json & params, rpc::CallContext &) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    std::shared_ptr<Embedder> emb;
    {
        std::lock_guard<std::mutex> lock(mu_);
        emb = embedder_;
    }
    if (!emb || !emb->rank())
        return rpc::make_error(rpc::ERR_UNSUPPORTED, "This server does not support reranking. Start it with `--reranking`");
    if (!params.is_object()) return rpc::invalid_params("params must be an object", "params");
    auto q = params.find("query");
    if (q == params.end() || !q->is_string()) return rpc::invalid_params("\"query\" must be a string", "query");
    const bool tei = params.contains("texts");
    const char * key = tei ? "texts" : "documents";
    auto d = params.find(key);
    if (d == params.end() || !d->is_array() || d->empty())
        return rpc::invalid_params(std::string("\"") + key + "\" must be a non-empty array of strings", key);
    for (const json & doc : *d)
        if (!doc.is_string()) return rpc::invalid_params(std::string("\"") + key + "\" must hold strings", key);
    int64_t top_n = static_cast<int64_t>(d->size());
    if (auto t = params.find("top_n"); t != params.end() && !t->is_null()) {
        if (!t->is_number_integer()) return rpc::invalid_params("top_n must be an integer", "top_n");
        top_n = std::max<int64_t>(0, std::min<int64_t>(top_n, t->get<int64_t>()));
    }
    const bool return_text = params.value("return_text", json(false)) == json(true);
    auto query = eng->tokenize(q->get<std::string>(), false, false);
    if (!query) return rpc::invalid_params(query.status().message(), "query");
    struct Scored { size_t index; float score; };
    std::vector<Scored> scored;
    int64_t n_tokens = 0;
    for (size_t i = 0; i < d->size(); ++i) {
        auto doc = eng->tokenize((*d)[i].get<std::string>(), false, false);
        if (!doc) return rpc::invalid_params(doc.status().message(), key);
        // llama-server's layout for models without a rerank template: [BOS] query [EOS] [SEP] doc [EOS]
        std::vector<token_id> t;
        if (emb->add_bos()) t.push_back(emb->bos());
        t.insert(t.end(), query.value().begin(), query.value().end());
        if (emb->add_eos()) t.push_back(emb->eos());
        if (emb->add_sep()) t.push_back(emb->sep());
        t.insert(t.end(), doc.value().begin(), doc.value().end());
        if (emb->add_eos()) t.push_back(emb->eos());
        auto rows = emb->embed(t);
        if (!rows) return rpc::invalid_params(rows.status().message(), key);
        n_tokens += static_cast<int64_t>(t.size());
        scored.push_back({i, rows.value()[0][0]});
    }
    std::stable_sort(scored.begin(), scored.end(), [](const Scored & a, const Scored & b) { return a.score > b.score; });
    scored.resize(static_cast<size_t>(top_n));
    json results = json::array();
    for (const Scored & s : scored) {
        json r = {{"index", s.index}, {tei ? "score" : "relevance_score", s.score}};
        if (return_text) r["text"] = (*d)[s.index];
        results.push_back(std::move(r));
    }
    if (tei) return results;
    return json{{"model", model_name()}, {"object", "list"}, {"results", results},
                {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
}

}  // namespace specrpc::server
