#include "engine/model.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/rpc_devices.h"
#include "llama.h"

namespace specrpc {

static Status check_gguf_file(const std::string & path) {
    if (path.empty()) return invalid_arg("model path is empty", "model");
    // Only regular files: opening a FIFO blocks until a writer appears (loading hung, and the
    // engine's creator with it, past SIGTERM), and a device or directory is no model either.
    struct stat sb;
    if (::stat(path.c_str(), &sb) != 0) return Status(ErrorCode::LOAD_FAILED, "cannot open model file '" + path + "'");
    if (!S_ISREG(sb.st_mode)) return Status(ErrorCode::LOAD_FAILED, "model path '" + path + "' is not a regular file");
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) return Status(ErrorCode::LOAD_FAILED, "cannot open model file '" + path + "'");
    char   magic[4] = {};
    size_t n        = std::fread(magic, 1, 4, f);
    std::fclose(f);
    if (n != 4 || std::memcmp(magic, "GGUF", 4) != 0)
        return Status(ErrorCode::LOAD_FAILED, "'" + path + "' is not a GGUF file");
    return Status::ok();
}

Result<std::shared_ptr<Model>> Model::load(const ModelParams & params, std::function<bool(float)> on_progress) {
    backend_init();
    if (Status st = check_gguf_file(params.path); !st) return st;

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = params.n_gpu_layers;
    // Only the devices asked for: the draft stays local even when the target runs on workers.
    std::vector<ggml_backend_dev_t> devices;
    std::shared_ptr<RpcLinks>       links;
    if (!params.rpc_servers.empty()) {
        if (Status st = rpc_devices(params.rpc_servers, devices, links); !st) return st;
        devices.push_back(nullptr);
        mp.devices = devices.data();
        if (mp.n_gpu_layers == 0) mp.n_gpu_layers = -1;
    }
    mp.load_mode          = params.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    struct Ctx { std::function<bool(float)> * cb; bool aborted; };
    Ctx ctx{&on_progress, false};
    if (on_progress) {
        mp.progress_callback = [](float p, void * ud) -> bool {
            auto * c = static_cast<Ctx *>(ud);
            c->aborted = c->aborted || !(*c->cb)(p);
            return !c->aborted;
        };
        mp.progress_callback_user_data = &ctx;
    }
    llama_model * lm = llama_model_load_from_file(params.path.c_str(), mp);
    if (links) {  // a worker lost while the weights were sent: they are not all there
        if (Status st = links->status(); !st) {
            if (lm) llama_model_free(lm);
            return st;
        }
    }
    if (!lm && ctx.aborted) return Status(ErrorCode::CANCELLED, "loading was aborted");  // not the file's fault
    if (!lm)
        return Status(ErrorCode::LOAD_FAILED,
                      "llama.cpp failed to load '" + params.path + "' (truncated or unsupported GGUF?)");

    auto m          = std::shared_ptr<Model>(new Model());
    m->model_       = lm;
    m->vocab_       = llama_model_get_vocab(lm);
    m->path_        = params.path;
    m->rpc_links_   = std::move(links);
    m->n_vocab_     = llama_vocab_n_tokens(m->vocab_);
    m->n_ctx_train_ = llama_model_n_ctx_train(lm);

    // Byte fallback: SPM vocabs carry <0x00>..<0xFF> byte tokens; without them llama.cpp's SPM
    // tokenizer aborts on characters outside the vocabulary (std::out_of_range), so we must check
    // every code point ourselves before tokenising.
    if (llama_vocab_type(m->vocab_) == LLAMA_VOCAB_TYPE_SPM) {
        bool has_bytes = false;
        for (int32_t i = 0; i < m->n_vocab_; ++i) {
            const char * t = llama_vocab_get_text(m->vocab_, i);
            if (t && std::strcmp(t, "<0x41>") == 0) { has_bytes = true; break; }
        }
        m->byte_fallback_ = has_bytes;
        if (!has_bytes) {
            for (int32_t i = 0; i < m->n_vocab_; ++i) {
                // SPM writes a space as U+2581 (3 bytes): map it back to ' '.
                const std::string raw = llama_vocab_get_text(m->vocab_, i);
                std::string t;
                for (size_t k = 0; k < raw.size();) {
                    if (raw.compare(k, 3, "\xE2\x96\x81") == 0) { t += ' '; k += 3; }
                    else t += raw[k++];
                }
                m->chars_.insert(t);
            }
            SPR_LOG_WARN("model '%s': vocabulary has no byte fallback; text outside its %d pieces is rejected",
                         params.path.c_str(), m->n_vocab_);
        }
    }
    return m;
}

Model::~Model() {
    if (model_) llama_model_free(model_);
}

std::string Model::desc() const {
    char buf[256] = {};
    llama_model_desc(model_, buf, sizeof buf);
    return buf;
}

static size_t utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c >> 5) == 0x6) return 2;
    if ((c >> 4) == 0xE) return 3;
    if ((c >> 3) == 0x1E) return 4;
    return 1;  // invalid lead byte: treat as one unit (it will be unrepresentable)
}

int64_t Model::first_unrepresentable(const std::string & text) const {
    if (byte_fallback_) return -1;
    for (size_t i = 0; i < text.size();) {
        size_t n = utf8_len(static_cast<unsigned char>(text[i]));
        if (i + n > text.size()) return static_cast<int64_t>(i);
        std::string cp = text.substr(i, n);
        if (cp != " " && cp != "\n" && !chars_.count(cp)) return static_cast<int64_t>(i);
        // newline and space are handled by SPM normalisation; a vocab without them still must not
        // crash: check them too when absent.
        if ((cp == "\n" || cp == " ") && !chars_.count(cp) && !chars_.count(cp == " " ? " " : "<0x0A>"))
            return static_cast<int64_t>(i);
        i += n;
    }
    return -1;
}

Status vocab_check_compatible(const Model & tgt, const Model & dft) {
    const llama_vocab * vt = tgt.vocab();
    const llama_vocab * vd = dft.vocab();
    auto fail = [](std::string msg) { return Status(ErrorCode::VOCAB_MISMATCH, std::move(msg), "model_draft"); };
    if (llama_vocab_type(vt) != llama_vocab_type(vd))
        return fail("draft vocab type " + std::to_string(llama_vocab_type(vd)) + " differs from target's " +
                    std::to_string(llama_vocab_type(vt)));
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd) ||
        llama_vocab_get_add_eos(vt) != llama_vocab_get_add_eos(vd))
        return fail("draft and target differ in add-BOS/add-EOS flags");
    if (llama_vocab_bos(vt) != llama_vocab_bos(vd) || llama_vocab_eos(vt) != llama_vocab_eos(vd))
        return fail("draft BOS/EOS (" + std::to_string(llama_vocab_bos(vd)) + "/" + std::to_string(llama_vocab_eos(vd)) +
                    ") differ from target's (" + std::to_string(llama_vocab_bos(vt)) + "/" +
                    std::to_string(llama_vocab_eos(vt)) + ")");
    const int32_t nt = tgt.n_vocab(), nd = dft.n_vocab();
    constexpr int32_t kMaxSizeDiff = 128;
    if (std::abs(nt - nd) > kMaxSizeDiff)
        return fail("vocab sizes differ by more than " + std::to_string(kMaxSizeDiff) + ": target " +
                    std::to_string(nt) + ", draft " + std::to_string(nd));
    for (int32_t i = 0; i < std::min(nt, nd); ++i) {
        const char * a = llama_vocab_get_text(vt, i);
        const char * b = llama_vocab_get_text(vd, i);
        if (std::strcmp(a ? a : "", b ? b : "") != 0)
            return fail("token " + std::to_string(i) + " differs: target '" + std::string(a ? a : "") +
                        "' vs draft '" + std::string(b ? b : "") + "'");
    }
    return Status::ok();
}

}  // namespace specrpc
