// What a target pass over n tokens costs on this machine, v(n) = t(n) / t(1), from bare
// llama_decode passes (the public llama.h, no engine) behind --depth cells of context (128):
//   steady       the same size again and again (llama.cpp reuses its graph: the passes a
//                speculating engine runs when its draft length holds);
//   alternating  sizes in turn (the graph rebuilt every pass: drafters whose lengths vary).
// With --engines E, E contexts of the one model share the process, each with its own ggml
// thread pool and driven by its own thread; they take turns, and each parks its pool when its
// turn ends, as the engine does when idle. E > 1 is what an application embedding several
// engines, or a benchmark holding one per drafter, runs: under an OpenMP build of ggml it priced
// multi-token passes 1.7x dearer (docs/benchmarks.md, "ggml's thread pool instead of OpenMP").
//
//   pass_bench [--models DIR] [--model FILE] [--engines E] [--threads N] [--reps N] [--sizes 1,2,4,8,16]
//              [--depth CELLS]
//
// --sizes (at most kMaxSize tokens each; 1 always timed) prices drafts longer than the engine's
// default n_max, to see whether a longer cap would pay. --depth (1 to kMaxDepth) times them behind
// another context: t(1) and v(n) both grow with the cells a pass attends over, most in the step
// past each multiple of 256 (llama.cpp pads the cells attended over to the next one), and the
// engine prices a pass against t(1) at its own depth (docs/design.md, section 3.4).
//
// Each engine reports its last repetition (the first warms caches). Markdown to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "engine/backend.h"
#include "llama.h"

using namespace specrpc;
using bench::median;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxSize  = 128;   // the largest size timed
constexpr int kMaxDepth = 3840;  // the deepest context timed behind (with kMaxSize, 4096 cells)

// One pass of n tokens (all with logits) at positions depth.., removed again; ms.
double timed_pass(llama_context * ctx, llama_batch & b, int n, int depth) {
    b.n_tokens = n;
    for (int i = 0; i < n; ++i) {
        b.token[i]     = 5 + i;
        b.pos[i]       = depth + i;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = 0;
        b.logits[i]    = 1;
    }
    const auto t0 = Clock::now();
    const int  rc = llama_decode(ctx, b);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    llama_memory_seq_rm(llama_get_memory(ctx), 0, depth, -1);
    return rc == 0 ? ms : -1;
}

struct Row {
    int                 engine = 0;
    double              t1     = 0;
    std::vector<double> steady, alternating;  // [n], sizes timed only
};

}  // namespace

int main(int argc, char ** argv) {
    std::string dir = SPECRPC_MODELS_DIR, file = "stories260K-copy-x100M-Q8_0.gguf";
    int         n_engines = 1, threads = 2, reps = 2, depth = 128;
    std::vector<int> sizes = {1, 2, 4, 8, 16};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--models" && i + 1 < argc) dir = argv[++i];
        else if (a == "--model" && i + 1 < argc) file = argv[++i];
        else if (a == "--engines" && i + 1 < argc) n_engines = std::max(1, std::atoi(argv[++i]));
        else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--sizes" && i + 1 < argc) {
            sizes = {1};
            for (const char * p = argv[++i]; *p;) {
                char * end = nullptr;
                const long n = std::strtol(p, &end, 10);
                if (end == p || n < 1 || n > kMaxSize) {
                    std::fprintf(stderr, "--sizes: sizes from 1 to %d, comma-separated\n", kMaxSize);
                    return 2;
                }
                if (n > 1) sizes.push_back(int(n));
                p = *end == ',' ? end + 1 : end;
            }
            std::sort(sizes.begin(), sizes.end());
            sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
        } else if (a == "--depth" && i + 1 < argc) {
            depth = std::atoi(argv[++i]);
            if (depth < 1 || depth > kMaxDepth) {
                std::fprintf(stderr, "--depth: from 1 to %d cells\n", kMaxDepth);
                return 2;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--models DIR] [--model FILE] [--engines E] [--threads N] [--reps N] "
                         "[--sizes 1,2,4,8,16] [--depth CELLS]\n", argv[0]);
            return 2;
        }
    }
    const int max_size = sizes.back();
    backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = 0;
    llama_model * model   = llama_model_load_from_file((dir + "/" + file).c_str(), mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s/%s\n", dir.c_str(), file.c_str());
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    std::mutex       turn;  // one engine computes at a time
    std::vector<Row> rows(static_cast<size_t>(n_engines));
    bool             failed = false;
    std::vector<std::thread> workers;
    for (int e = 0; e < n_engines; ++e)
        workers.emplace_back([&, e] {
            llama_context_params cp = llama_context_default_params();
            cp.n_ctx           = uint32_t(depth + kMaxSize);  // the context, then the largest pass
            cp.n_batch         = uint32_t(depth + kMaxSize);  // the context in one pass
            cp.n_ubatch        = 512;
            cp.n_seq_max       = 1;
            cp.n_threads       = threads;
            cp.n_threads_batch = threads;
            llama_context *   ctx  = llama_init_from_model(model, cp);
            ggml_threadpool * pool = ctx ? cpu_threadpool_new(threads) : nullptr;
            if (pool) llama_attach_threadpool(ctx, pool, pool);
            llama_batch b = llama_batch_init(std::max(depth, kMaxSize), 0, 1);
            bool ok = ctx != nullptr;
            {
                std::lock_guard<std::mutex> lock(turn);
                b.n_tokens = depth;
                for (int i = 0; i < depth; ++i) {
                    b.token[i]     = (7 + 31 * i) % n_vocab;
                    b.pos[i]       = i;
                    b.n_seq_id[i]  = 1;
                    b.seq_id[i][0] = 0;
                    b.logits[i]    = i == depth - 1;
                }
                ok = ok && llama_decode(ctx, b) == 0;
                cpu_threadpool_pause(pool);
            }
            for (int rep = 0; ok && rep < reps; ++rep) {
                std::lock_guard<std::mutex> lock(turn);
                std::vector<std::vector<double>> st(size_t(max_size) + 1), alt(size_t(max_size) + 1);
                for (int n : sizes)
                    for (int i = 0; i < 12; ++i) st[n].push_back(timed_pass(ctx, b, n, depth));
                for (int i = 0; i < 8; ++i)
                    for (int n : sizes) alt[n].push_back(timed_pass(ctx, b, n, depth));
                cpu_threadpool_pause(pool);  // parked while another engine runs
                Row & r = rows[size_t(e)];
                r.engine = e;
                r.t1     = median(st[1]);
                r.steady.assign(size_t(max_size) + 1, 0.0);
                r.alternating.assign(size_t(max_size) + 1, 0.0);
                for (int n : sizes) {
                    if (median(st[n]) < 0 || median(alt[n]) < 0) ok = false;
                    r.steady[n]      = median(st[n]) / r.t1;
                    r.alternating[n] = median(alt[n]) / r.t1;
                }
                std::fprintf(stderr, "engine %d: repetition %d of %d done\n", e + 1, rep + 1, reps);
            }
            llama_batch_free(b);
            if (ctx) llama_free(ctx);
            cpu_threadpool_free(pool);
            if (!ok) {
                std::lock_guard<std::mutex> lock(turn);
                failed = true;
            }
        });
    for (auto & w : workers) w.join();
    llama_model_free(model);
    if (failed) {
        std::fprintf(stderr, "a pass failed\n");
        return 1;
    }

    std::printf("## Pass costs: %s, %d thread(s), %d engine(s) in the process, %d cells of context\n\n",
                file.c_str(), threads, n_engines, depth);
    std::printf("| engine | t(1) ms |");
    for (int n : sizes)
        if (n > 1) std::printf(" steady v(%d) |", n);
    for (int n : sizes) std::printf(" alternating v(%d) |", n);
    std::printf("\n|---|---:|");
    for (size_t k = 0; k < 2 * sizes.size() - 1; ++k) std::printf("---:|");
    std::printf("\n");
    for (const Row & r : rows) {
        std::printf("| %d | %.2f |", r.engine + 1, r.t1);
        for (int n : sizes)
            if (n > 1) std::printf(" %.2f |", r.steady[n]);
        for (int n : sizes) std::printf(" %.2f |", r.alternating[n]);
        std::printf("\n");
    }
    return 0;
}
