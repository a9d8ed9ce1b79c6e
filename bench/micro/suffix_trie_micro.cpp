// The suffix trie's own CPU time (speculative/suffix_tree.h), without a model: what a request's
// trie pays to index its prompt and output as they grow, what the shared store pays to add a
// finished response (and evict the oldest), and what a round's match and proposal cost, alone,
// so a change to the trie can be judged A/B in one run without a target's noise. They showed
// that a faster child index was not worth building: a whole request's trie work is ~2 ms here,
// and `SuffixTrie` is 0.02-0.05% of a `specrpc generate` process's samples (docs/benchmarks.md,
// "A trial of all threads beside a busy process", its last part).
//
// Token streams are synthetic and deterministic (fixed seeds), over a 512-token vocabulary like
// the stories models': "copy" is a 150-token passage, its repetition with 5% of tokens edited and
// a continuation (what the copy-heavy prompts and their outputs look like); "novel" is text
// with no repeats beyond the word frequencies (Zipf, exponent 1.1).
//
//   suffix_trie_micro [--benchmark_filter=REGEX] [--benchmark_repetitions=N] ...
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "speculative/suffix_tree.h"

using namespace specrpc;

namespace {

constexpr int kVocab = 512;

// Zipf(1.1) over kVocab tokens: a few frequent words and a long tail, as in text.
std::vector<token_id> zipf_text(size_t n, uint32_t seed) {
    std::vector<double> w(kVocab);
    for (int i = 0; i < kVocab; ++i) w[size_t(i)] = 1.0 / std::pow(double(i + 1), 1.1);
    std::discrete_distribution<int> pick(w.begin(), w.end());
    std::mt19937                    rng(seed);
    std::vector<token_id>           out(n);
    for (auto & t : out) t = token_id(pick(rng));
    return out;
}

// A passage, its repetition with 5% of the tokens replaced, and a fresh continuation.
std::vector<token_id> copy_text(size_t passage, size_t tail, uint32_t seed) {
    std::vector<token_id> p = zipf_text(passage, seed);
    std::vector<token_id> out = p;
    std::mt19937          rng(seed + 1);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<token_id> noise = zipf_text(passage, seed + 2);
    for (size_t i = 0; i < passage; ++i) out.push_back(u(rng) < 0.05 ? noise[i] : p[i]);
    const std::vector<token_id> more = zipf_text(tail, seed + 3);
    out.insert(out.end(), more.begin(), more.end());
    return out;
}

CostModel quarter_cost() {
    CostModel cm;
    cm.v.assign(34, 0.0);
    for (size_t n = 1; n < cm.v.size(); ++n) cm.v[n] = 1.0 + 0.25 * double(n - 1);
    return cm;
}

// A request's trie as the engine grows it: the prompt at once, then the output a few tokens a
// round (SuffixContext::sync), with a match and a proposal at every round.
void request_rounds(benchmark::State & state, const std::vector<token_id> & text, size_t prompt) {
    const CostModel   cm = quarter_cost();
    SuffixDraftParams params;
    params.max_depth = 32;
    params.max_nodes = 32;
    size_t proposed  = 0;
    for (auto _ : state) {
        SuffixContext ctx;
        std::vector<token_id> seen(text.begin(), text.begin() + ptrdiff_t(prompt));
        ctx.sync(1, seen);
        size_t i = prompt;
        while (i < text.size()) {
            const SuffixProposal p = suffix_propose(ctx.trie(), seen, params, cm);
            proposed += p.tree.nodes.size();
            const size_t step = 1 + (i % 7);  // rounds emit 1..7 tokens
            for (size_t k = 0; k < step && i < text.size(); ++k) seen.push_back(text[i++]);
            ctx.sync(1, seen);
        }
        benchmark::DoNotOptimize(proposed);
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}

void BM_RequestCopy(benchmark::State & state) {
    static const std::vector<token_id> text = copy_text(150, 128, 7);
    request_rounds(state, text, 300);  // prompt = passage + most of the repetition, output the rest
}
BENCHMARK(BM_RequestCopy)->Unit(benchmark::kMicrosecond);

void BM_RequestNovel(benchmark::State & state) {
    static const std::vector<token_id> text = zipf_text(430, 11);
    request_rounds(state, text, 300);
}
BENCHMARK(BM_RequestNovel)->Unit(benchmark::kMicrosecond);

// The prompt alone, appended at once: a request's first sync (what precedes its first draft).
void BM_AppendPrompt(benchmark::State & state) {
    static const std::vector<token_id> text = copy_text(150, 0, 13);
    for (auto _ : state) {
        SuffixTrie trie;
        trie.append(text);
        benchmark::DoNotOptimize(trie.n_nodes());
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_AppendPrompt)->Unit(benchmark::kMicrosecond);

// The shared store under a 1 MiB budget: 128-token responses added one after another, the oldest
// evicted once the budget is reached (steady state after the first ~100 of them).
void BM_StoreAdd(benchmark::State & state) {
    static const std::vector<std::vector<token_id>> responses = [] {
        std::vector<std::vector<token_id>> r;
        for (uint32_t seed = 100; seed < 612; ++seed) r.push_back(zipf_text(128, seed));
        return r;
    }();
    SuffixStore store(size_t(1) << 20);
    size_t      next = 0;
    for (int i = 0; i < 200; ++i) store.add(responses[next++ % responses.size()]);
    for (auto _ : state) store.add(responses[next++ % responses.size()]);
    state.SetItemsProcessed(int64_t(state.iterations()) * 128);
    state.counters["evicted"] = double(store.n_evicted());
}
BENCHMARK(BM_StoreAdd)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
