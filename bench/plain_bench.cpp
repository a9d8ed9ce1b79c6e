// Plain-decoding overhead: tokens/s of specrpc's generation loop (Engine::complete, greedy, no
// speculation) against a bare llama_decode + argmax loop written against the public llama.h, on
// the same model, thread count and context size. The two are interleaved (A/B, order alternating)
// over several prompts and repetitions; medians are reported. Target: engine ≥ 0.97x bare.
//
//   plain_bench [--quick] [--models DIR] [--model FILE]... [--reps N] [--tokens N] [--threads N]
//
// --model restricts the run to the given model files of DIR (default: stories260K-F32 and
// stories260K-x100M-Q8_0); handy under a profiler.
//
// --threads defaults to 2 (the machine's cores). On a machine shared with other jobs, 2 ggml
// threads on 2 cores spin at every barrier while a core is taken: expect very noisy numbers.
// Progress goes to stderr, the Markdown table to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "engine/backend.h"
#include "llama.h"
#include "specrpc/engine.hpp"

using namespace specrpc;
using bench::median;

namespace {

using Clock = std::chrono::steady_clock;

const char * kPrompts[] = {"Once upon a time",      "Lily wanted to",
                           "The little dog",        "Tom and Sue went to the park",
                           "One day, a big bear",   "Ben had a red ball. He",
                           "Mia and her mom baked a cake.", "There was a small bird in a tree.",
                           "The sun was shining and", "Max found a shiny stone"};

int kThreads = 2;  // --threads
constexpr int kCtx     = 512;

// The bare loop: prompt except its last token in one batch, then one token per llama_decode,
// next = argmax of the logits (lowest id on ties), n tokens. EOS is not special (as ignore_eos).
// Like the engine, it runs on a persistent ggml thread pool that is parked between runs.
struct Bare {
    llama_model *   model = nullptr;
    llama_context * ctx   = nullptr;
    int32_t         n_vocab = 0;

    bool init(const std::string & path, bool flash_attn) {
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers       = 0;
        model = llama_model_load_from_file(path.c_str(), mp);
        if (!model) return false;
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx           = kCtx;
        cp.n_batch         = 512;
        cp.n_ubatch        = 512;
        cp.n_seq_max       = 1;
        cp.n_threads       = kThreads;
        cp.n_threads_batch = kThreads;
        cp.no_perf         = true;
        // the engine's measured choice (EngineInfo::flash_attn): both loops run the same kernels
        cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        ctx = llama_init_from_model(model, cp);
        n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        if (!ctx) return false;
        // a persistent thread pool, as llama.cpp's own tools attach (and as the engine does)
        pool = cpu_threadpool_new(kThreads);
        if (pool) llama_attach_threadpool(ctx, pool, pool);
        return true;
    }
    ~Bare() {
        if (ctx) llama_free(ctx);
        cpu_threadpool_free(pool);
        if (model) llama_model_free(model);
    }
    ggml_threadpool * pool = nullptr;
    // Returns tokens/s of the generation part (after the prompt) and the generated ids.
    double run(const std::vector<llama_token> & prompt, int n, std::vector<llama_token> * out) {
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> p(prompt.begin(), prompt.end() - 1);
        if (!p.empty()) {
            llama_batch b = llama_batch_get_one(p.data(), static_cast<int32_t>(p.size()));
            if (llama_decode(ctx, b) != 0) return -1;
        }
        llama_token tok = prompt.back();
        out->clear();
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) {
            llama_batch b = llama_batch_get_one(&tok, 1);
            if (llama_decode(ctx, b) != 0) return -1;
            const float * l = llama_get_logits_ith(ctx, -1);
            int32_t best = 0;
            for (int32_t j = 1; j < n_vocab; ++j)
                if (l[j] > l[best]) best = j;
            tok = best;
            out->push_back(tok);
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        cpu_threadpool_pause(pool);  // no worker polls while the engine runs (the engine does the same)
        return n / s;
    }
};

struct ModelRow {
    std::string name;
    double engine_tps = 0, bare_tps = 0, ratio = 0, ratio_min = 0, ratio_max = 0;
    double best_engine_tps = 0, best_bare_tps = 0;  // per prompt the fastest repetition, summed
    int    identical = 0, compared = 0;
    bool   ok = false;
};

}  // namespace

int main(int argc, char ** argv) {
    std::string models_dir = SPECRPC_MODELS_DIR;
    bool        quick = false;
    int         reps = -1, n_tok = -1;
    std::vector<std::string> files;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--quick") quick = true;
        else if (a == "--models" && i + 1 < argc) models_dir = argv[++i];
        else if (a == "--model" && i + 1 < argc) files.push_back(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (a == "--tokens" && i + 1 < argc) n_tok = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) kThreads = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: %s [--quick] [--models DIR] [--model FILE]... [--reps N] [--tokens N] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    if (reps <= 0) reps = quick ? 3 : 5;
    if (n_tok <= 0) n_tok = quick ? 128 : 256;
    const int n_prompts = quick ? 3 : 6;

    backend_init();
    std::vector<ModelRow> rows;
    if (files.empty()) files = {"stories260K-F32.gguf", "stories260K-x100M-Q8_0.gguf"};
    for (const std::string & file : files) {
        ModelRow row;
        row.name = file;
        const std::string path = models_dir + "/" + file;
        EngineParams ep;
        ep.target.path = path;
        ep.n_ctx       = kCtx;
        ep.n_threads   = kThreads;
        ep.n_parallel  = 1;
        auto er = Engine::create(ep);
        if (!er) {
            std::fprintf(stderr, "[plain] cannot load %s: %s\n", path.c_str(), er.status().to_string().c_str());
            rows.push_back(row);
            continue;
        }
        auto engine = std::move(er.value());
        Bare bare;
        if (!bare.init(path, engine->info().flash_attn)) {
            std::fprintf(stderr, "[plain] bare loop: cannot load %s\n", path.c_str());
            rows.push_back(row);
            continue;
        }
        std::vector<std::vector<llama_token>> prompts;
        for (int i = 0; i < n_prompts; ++i) prompts.push_back(engine->tokenize(kPrompts[i], true, false).value());

        auto run_engine = [&](const std::vector<llama_token> & p, std::vector<llama_token> * out) {
            CompletionRequest r;
            r.prompt               = p;
            r.n_predict            = n_tok;
            r.sampling.temperature = 0.0f;
            r.sampling.ignore_eos  = true;
            r.cache_prompt         = false;  // the bare loop re-evaluates the prompt too
            auto res = engine->complete(r);
            if (!res) return -1.0;
            out->clear();
            for (const auto & t : res.value().tokens) out->push_back(t.id);
            return res.value().timings.predicted_per_second();
        };
        // warm-up (page in the weights, first-use allocations)
        {
            std::vector<llama_token> o;
            run_engine(prompts[0], &o);
            bare.run(prompts[0], 32, &o);
        }
        // per repetition: tokens/s over all prompts (total tokens / total time) for each side
        std::vector<double> e_tps, b_tps, ratios;
        std::vector<double> e_best(n_prompts, 1e30), b_best(n_prompts, 1e30);  // seconds per prompt
        for (int rep = 0; rep < reps; ++rep) {
            double e_time = 0, b_time = 0;
            for (int i = 0; i < n_prompts; ++i) {
                std::vector<llama_token> oe, ob;
                double te = 0, tb = 0;
                if ((rep + i) % 2 == 0) { te = run_engine(prompts[i], &oe); tb = bare.run(prompts[i], n_tok, &ob); }
                else                    { tb = bare.run(prompts[i], n_tok, &ob); te = run_engine(prompts[i], &oe); }
                if (te <= 0 || tb <= 0) { std::fprintf(stderr, "[plain] run failed\n"); return 1; }
                e_time += n_tok / te;
                b_time += n_tok / tb;
                e_best[i] = std::min(e_best[i], n_tok / te);
                b_best[i] = std::min(b_best[i], n_tok / tb);
                if (rep == 0) { row.compared++; row.identical += oe == ob; }
            }
            const double et = n_prompts * n_tok / e_time, bt = n_prompts * n_tok / b_time;
            e_tps.push_back(et); b_tps.push_back(bt); ratios.push_back(et / bt);
            std::fprintf(stderr, "[plain] %s rep %d/%d: engine %.1f t/s, bare %.1f t/s, ratio %.3f\n", file.c_str(), rep + 1,
                         reps, et, bt, et / bt);
        }
        row.engine_tps = median(e_tps);
        row.bare_tps   = median(b_tps);
        row.ratio      = median(ratios);
        row.ratio_min  = *std::min_element(ratios.begin(), ratios.end());
        row.ratio_max  = *std::max_element(ratios.begin(), ratios.end());
        double eb = 0, bb = 0;
        for (int i = 0; i < n_prompts; ++i) { eb += e_best[i]; bb += b_best[i]; }
        row.best_engine_tps = n_prompts * n_tok / eb;
        row.best_bare_tps   = n_prompts * n_tok / bb;
        row.ok         = true;
        rows.push_back(row);
    }

    std::printf("## Plain decoding: engine loop vs bare llama_decode loop\n\n");
    std::printf("%d prompts x %d tokens, greedy, %d threads, n_ctx %d, %d interleaved repetitions%s. t/s = tokens ÷ "
                "generation time over all prompts, median over the repetitions (the target applies to this ratio); "
                "best-of = per prompt the fastest repetition of each side. Same output = greedy tokens equal.\n\n",
                n_prompts, n_tok, kThreads, kCtx, reps, quick ? ", --quick" : "");
    std::printf("| model | engine t/s | bare loop t/s | ratio (median) | ratio range | best-of-%d engine / bare t/s | best-of ratio | same output | target ≥ 0.97x |\n", reps);
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    bool all_pass = true;
    for (const auto & r : rows) {
        if (!r.ok) {
            std::printf("| %s | — | — | — | — | — | — | — | FAIL (not run) |\n", r.name.c_str());
            all_pass = false;
            continue;
        }
        const bool pass = r.ratio >= 0.97;
        all_pass &= pass;
        std::printf("| %s | %.1f | %.1f | %.3fx | %.3f–%.3f | %.1f / %.1f | %.3fx | %d/%d | %s |\n", r.name.c_str(),
                    r.engine_tps, r.bare_tps, r.ratio, r.ratio_min, r.ratio_max, r.best_engine_tps, r.best_bare_tps,
                    r.best_engine_tps / r.best_bare_tps, r.identical, r.compared, pass ? "PASS" : "FAIL");
    }
    std::printf("\n");
    std::fprintf(stderr, "[plain] overall: %s\n", all_pass ? "PASS" : "FAIL");
    // rc 1 only when a model could not be run; a missed target is a result, not an error
    for (const auto & r : rows)
        if (!r.ok) return 1;
    return 0;
}
