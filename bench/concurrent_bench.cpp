// The concurrent benchmark: N requests generated at once by one engine (continuous batching: one
// draft batch and one target pass per step for every slot), plain vs speculative, N = 1, 2, 4.
//
//   concurrent_bench [--quick] [--models DIR] [--threads N] [--tokens N] [--reps N] [--only TEXT]
//
// --only: the targets whose file name contains TEXT (e.g. x25M).
//
// Each slot chooses its own γ from the single-sequence cost curve (docs/design.md §3). With N
// sequences in a pass that is only an approximation: a slot's draft adds v(B + γ + 1) − v(B + 1)
// to a pass that already carries B tokens of the others. The table shows what the approximation
// gives on this machine, where batching plain tokens is itself expensive (v(2) ≈ 2.3 on the 100M
// targets, so two plain sequences in one pass run slower together than one alone).
// Both sides run on the same engine, alternating, the prompt prefix not cached; wall time from
// the first submit to the last answer. The Markdown table goes to stdout, progress to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "specrpc/engine.hpp"

using namespace specrpc;
using specrpc::bench::kPrompts;
using specrpc::bench::short_name;

namespace {

struct Options {
    std::string models_dir = SPECRPC_MODELS_DIR;
    int         threads    = 2;
    int         tokens     = 128;
    int         reps       = 3;
    std::string only;        // empty = every target
};

// Totals over the repetitions of one configuration.
struct Tally {
    double  wall_ms = 0;
    int64_t tokens = 0, draft_n = 0, accepted = 0, steps = 0;
    double  tps() const { return wall_ms > 0 ? 1e3 * static_cast<double>(tokens) / wall_ms : 0; }
};

// Submits one request per prompt at once and waits for all of them; false if one failed.
bool run_batch(Engine & e, const std::vector<std::vector<token_id>> & prompts, const Options & o, float temp,
               bool spec, uint32_t seed, Tally & t) {
    std::vector<std::promise<Result<CompletionResult>>> done(prompts.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < prompts.size(); ++i) {
        CompletionRequest r;
        r.prompt               = prompts[i];
        r.n_predict            = o.tokens;
        r.cache_prompt         = false;
        r.sampling.ignore_eos  = true;
        r.sampling.temperature = temp;
        r.sampling.top_k       = 40;
        r.sampling.top_p       = 0.95f;
        r.sampling.seed        = seed + static_cast<uint32_t>(i);
        if (spec) r.spec = e.default_spec();
        else r.spec.types.clear();
        CompletionSink sink;
        sink.on_done = [&done, i](Result<CompletionResult> res) { done[i].set_value(std::move(res)); };
        e.submit(std::move(r), std::move(sink));
    }
    bool ok = true;
    for (auto & d : done) {
        Result<CompletionResult> res = d.get_future().get();
        if (!res) {
            std::fprintf(stderr, "[concurrent] request failed: %s\n", res.status().to_string().c_str());
            ok = false;
            continue;
        }
        const CompletionResult & c = res.value();
        t.tokens += c.tokens_predicted;
        t.draft_n += c.spec.draft_n;
        t.accepted += c.spec.draft_n_accepted;
        t.steps += c.spec.draft_n_steps;
    }
    t.wall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return ok;
}

struct Case {
    std::string target;
    float       temp;
};

}  // namespace

int main(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick") { o.tokens = 64; o.reps = 1; }
        else if (a == "--models" && i + 1 < argc) o.models_dir = argv[++i];
        else if (a == "--threads" && i + 1 < argc) o.threads = std::max(1, std::atoi(argv[++i]));
        else if (a == "--tokens" && i + 1 < argc) o.tokens = std::max(1, std::atoi(argv[++i]));
        else if (a == "--reps" && i + 1 < argc) o.reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--only" && i + 1 < argc) o.only = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--quick] [--models DIR] [--threads N] [--tokens N] [--reps N] [--only TEXT]\n", argv[0]);
            return 2;
        }
    }
    const std::vector<Case> cases = {{"stories260K-x100M-near-Q8_0.gguf", 0.0f}, {"stories260K-x100M-near-Q8_0.gguf", 0.8f},
                                     {"stories260K-x100M-Q8_0.gguf", 0.0f},      {"stories260K-x25M-Q8_0.gguf", 0.0f}};
    const std::vector<int> widths = {1, 2, 4};
    const int n_slots = widths.back();

    std::printf("## Concurrent sequences (concurrent_bench)\n\n");
    std::printf("N requests of %d tokens submitted at once to one engine with %d slots (%d threads, draft "
                "stories260K-F32); total tokens/s over %d repetitions with different prompts, plain and "
                "speculative alternating; each slot chooses its γ from the single-sequence cost curve.\n\n",
                o.tokens, n_slots, o.threads, o.reps);
    std::printf("| target | T | N | plain t/s | spec t/s | ratio | accept | mean acc len |\n|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    std::unique_ptr<Engine> eng;
    std::string loaded;
    for (const Case & c : cases) {
        if (c.target.find(o.only) == std::string::npos) continue;
        if (loaded != c.target) {
            eng.reset();
            EngineParams p;
            p.target.path = o.models_dir + "/" + c.target;
            p.draft.path  = o.models_dir + "/stories260K-F32.gguf";
            p.n_ctx       = 512;
            p.n_threads   = o.threads;
            p.n_parallel  = n_slots;
            std::fprintf(stderr, "[concurrent] loading %s\n", c.target.c_str());
            auto e = Engine::create(p);
            if (!e) {
                std::fprintf(stderr, "[concurrent] cannot create the engine: %s\n", e.status().to_string().c_str());
                return 1;
            }
            eng    = std::move(e.value());
            loaded = c.target;
            std::vector<std::vector<token_id>> warm;  // the cost probe and the first-use priors
            for (int i = 0; i < n_slots; ++i) warm.push_back(eng->tokenize(kPrompts[i], true, false).value());
            Tally ignored;
            if (!run_batch(*eng, {warm[0]}, o, 0.0f, true, 1, ignored) || !run_batch(*eng, warm, o, 0.0f, true, 1, ignored))
                return 1;
        }
        for (int n : widths) {
            Tally plain, spec;
            for (int rep = 0; rep < o.reps; ++rep) {
                std::vector<std::vector<token_id>> prompts;
                for (int i = 0; i < n; ++i)
                    prompts.push_back(eng->tokenize(kPrompts[(rep * n + i + 3) % kPrompts.size()], true, false).value());
                const uint32_t seed = 100u * static_cast<uint32_t>(rep + 1);
                const bool spec_first = rep % 2 == 1;
                bool ok = true;
                for (int k = 0; k < 2; ++k) {
                    const bool s = (k == 0) == spec_first;
                    ok = ok && run_batch(*eng, prompts, o, c.temp, s, seed, s ? spec : plain);
                }
                if (!ok) rc = 1;
            }
            std::fprintf(stderr, "[concurrent] %s T=%.1f N=%d: plain %.1f t/s, spec %.1f t/s\n", c.target.c_str(),
                         c.temp, n, plain.tps(), spec.tps());
            std::printf("| %s | %.1f | %d | %.1f | %.1f | **%.2fx** | %.1f%% | %.2f |\n", short_name(c.target).c_str(), c.temp, n,
                        plain.tps(), spec.tps(), plain.tps() > 0 ? spec.tps() / plain.tps() : 0,
                        spec.draft_n ? 100.0 * spec.accepted / spec.draft_n : 0.0,
                        spec.steps ? 1.0 + double(spec.accepted) / spec.steps : 0.0);
            std::fflush(stdout);
        }
    }
    return rc;
}
