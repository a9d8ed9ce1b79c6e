// Suffix drafting against prompt lookup and the n-gram caches on the copy target, in one run:
// every drafter gets its own engine (its own cross-request store and caches, all fresh), and each
// request of a workload runs on every engine in turn (rotating order) before the next, so the
// machine's noise falls on all of them alike. Greedy (T = 0): every engine emits the same tokens.
//
//   copy      passages followed by the start of their repetition (one request each)
//   multiturn conversations: each turn's prompt is the whole history plus the opening words of an
//             earlier answer, which the target then quotes
//   repeat-1  ordinary story prompts, first time (nothing to copy)
//   repeat-2  the same prompts again: only drafters that keep earlier responses can draft
//
// "suffix, no store" is the suffix drafter with its store of earlier responses off: what the
// request's own trie (prompt and output) gives, next to what reuse across requests adds.
//
// Per workload: tokens/s over all its requests (decode time), the median over requests of the
// per-request speed-up against plain decoding, and the drafts' acceptance.
//
// --fixed N turns the adaptive draft length off: every drafter drafts up to N tokens every round
// (suffix: every continuation seen, not sized by the cost model), which compares the drafters
// without the cost curve a busy machine measures (it may then price every pass at its length,
// and the policy rightly drafts nothing).
//
// --probs asks every request for the top-2 raw probabilities of each emitted token, prints the
// largest |log p - plain's| over the tokens both runs emitted, and where an output differs from
// plain's, both runs' top 2 at the first differing token: a gap within that noise is a near-tie
// flipped by float rounding (docs/benchmarks.md, "Suffix drafting"), a clear gap is a bug.
//
//   suffix_bench [--model FILE] [--threads N] [--tokens N] [--fixed N] [--kv-f32] [--quick] [--probs]
//                [--drafters NAME,...]   (the variants' names as in the table; plain always runs)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "specrpc/engine.hpp"

using namespace specrpc;
using bench::median;

namespace {

const std::vector<std::string> kPassages = {
    "Anna found a little kitten under a bush. It was cold and wet. She took it home and gave it warm "
    "milk. The kitten purred and slept on her bed. In the morning, Anna named the kitten Snow because it "
    "was white like snow. Snow followed Anna everywhere and they played all day.\n\n"
    "Anna found a little kitten under a bush. It was",
    "Jack wanted to build a tall tower with his blocks. He put one block on top of another. The tower "
    "grew and grew. Then his sister Lucy ran by and the tower fell down. Jack was sad, but Lucy helped "
    "him build it again. This time the tower was even taller.\n\nJack wanted to build a tall tower with",
    "The big brown bear woke up from his long sleep. He was very hungry. He walked to the river and "
    "caught a fish. Then he found some sweet berries on a bush. The bear ate and ate until he was full. "
    "He lay down in the sun and smiled.\n\nThe big brown bear woke up from his long sleep. He",
    "Emma and her grandpa planted a small seed in the garden. Every day they gave it water. Soon a "
    "green plant came up. It grew big leaves and a yellow flower. Emma was so happy. She showed the "
    "flower to all her friends at school.\n\nEmma and her grandpa planted a small seed",
};

struct Variant {
    std::string           name;
    std::vector<SpecType> types;
    int32_t               branches = 1;  // tree branches (suffix trees)
    int32_t               store_mb = 64; // the suffix store of earlier responses (0: the request's own trie only)
};

struct Stat {
    double               ms = 0;
    int64_t              tokens = 0, drafted = 0, accepted = 0, passes = 0;
    std::vector<double>  ratio;  // per request: plain ms / this ms
};

}  // namespace

int main(int argc, char ** argv) {
    std::string model   = "stories260K-copy-x100M-Q8_0.gguf";
    int32_t     threads = 2, n_tokens = 128;
    bool        quick   = false;
    int32_t     fixed   = 0;
    bool        kv_f32  = false;
    bool        probs   = false;
    std::string only;  // --drafters a,b: these variants only (and plain)
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--model" && i + 1 < argc) model = argv[++i];
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a == "--tokens" && i + 1 < argc) n_tokens = std::atoi(argv[++i]);
        else if (a == "--fixed" && i + 1 < argc) fixed = std::atoi(argv[++i]);
        else if (a == "--quick") quick = true;
        else if (a == "--kv-f32") kv_f32 = true;
        else if (a == "--probs") probs = true;
        else if (a == "--drafters" && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
        else {
            std::fprintf(stderr, "usage: suffix_bench [--model FILE] [--threads N] [--tokens N] [--fixed N] [--kv-f32] [--quick] [--probs] [--drafters NAME,...]\n");
            return 2;
        }
    }
    std::vector<Variant> variants = {
        {"plain", {}, 1},
        {"lookup", {SpecType::LOOKUP}, 1},
        {"ngram", {SpecType::NGRAM}, 1},
        {"suffix", {SpecType::SUFFIX}, 1},
        {"suffix, no store", {SpecType::SUFFIX}, 1, 0},
        {"suffix tree 3", {SpecType::SUFFIX}, 3},
        // control: plain decoding on the trees' engine layout (a unified KV cache, 3 sequences)
        {"plain tree-max 3", {}, 3},
    };
    if (!only.empty())  // plain stays: every ratio is against it
        variants.erase(std::remove_if(variants.begin() + 1, variants.end(),
                                      [&](const Variant & v) { return only.find("," + v.name + ",") == std::string::npos; }),
                       variants.end());
    std::vector<std::unique_ptr<Engine>> engines;
    for (const Variant & v : variants) {
        EngineParams p;
        p.target.path = std::string(SPECRPC_MODELS_DIR) + "/" + model;
        p.n_threads   = threads;
        p.n_ctx       = 512;
        p.kv_f32      = kv_f32;
        p.n_tree_max  = v.branches;  // trees need their KV sequences (a unified cache); chains do not
        p.suffix_cache_max_mb = v.store_mb;
        auto e = Engine::create(p);
        if (!e) {
            std::fprintf(stderr, "engine: %s\n", e.status().to_string().c_str());
            return 1;
        }
        engines.push_back(std::move(e.value()));
    }
    Engine & e0 = *engines[0];
    auto tok = [&](const std::string & s, bool bos) { return e0.tokenize(s, bos, false).value(); };

    // workload -> variant -> stats
    std::map<std::string, std::vector<Stat>> stats;
    std::vector<std::string> order;
    int rot = 0;
    std::vector<double> max_dlogp(variants.size(), 0.0);  // --probs
    std::vector<int> differ(variants.size(), 0);  // requests whose output is not plain's (lossless: 0
                                                  // up to float noise of another KV layout)
    // Runs one request on every engine (rotating who goes first); returns plain's output.
    auto run = [&](const std::string & workload, const std::vector<token_id> & prompt, int32_t n) {
        if (!stats.count(workload)) { stats[workload].resize(variants.size()); order.push_back(workload); }
        std::vector<double> ms(variants.size(), 0);
        std::vector<token_id> plain_out;
        std::vector<std::vector<token_id>> outs(variants.size());
        std::vector<std::vector<TokenOutput>> touts(variants.size());
        for (size_t k = 0; k < variants.size(); ++k) {
            const size_t i = (k + size_t(rot)) % variants.size();
            CompletionRequest r;
            r.prompt               = prompt;
            r.n_predict            = n;
            r.sampling.temperature = 0.0f;
            if (probs) r.sampling.n_probs = 2;
            r.spec.types           = variants[i].types;
            r.spec.n_parallel      = std::max<int32_t>(1, variants[i].types.empty() ? 1 : variants[i].branches);
            if (fixed > 0) {
                r.spec.adaptive = false;
                r.spec.n_max    = fixed;
            }
            auto res = engines[i]->complete(r);
            if (!res) {
                std::fprintf(stderr, "%s: %s\n", variants[i].name.c_str(), res.status().to_string().c_str());
                std::exit(1);
            }
            const CompletionResult & c = res.value();
            Stat & s = stats[workload][i];
            ms[i] = c.timings.predicted_ms;
            s.ms += c.timings.predicted_ms;
            s.tokens += c.tokens_predicted;
            s.drafted += c.spec.draft_n;
            s.accepted += c.spec.draft_n_accepted;
            s.passes += c.spec.n_steps;
            for (const auto & t : c.tokens) outs[i].push_back(t.id);
            touts[i] = c.tokens;
        }
        plain_out = outs[0];
        if (probs)  // the largest |Δ log p| of an emitted token over the prefix every run agrees on
            for (size_t i = 1; i < variants.size(); ++i) {
                double worst = 0;
                size_t at    = 0;
                for (size_t k = 0; k < touts[i].size() && k < touts[0].size() && touts[i][k].id == touts[0][k].id; ++k) {
                    const double d = std::fabs(std::log(double(touts[i][k].prob)) - std::log(double(touts[0][k].prob)));
                    if (d > worst) { worst = d; at = k; }
                }
                max_dlogp[i] = std::max(max_dlogp[i], worst);
                if (worst > 1e-3)
                    std::fprintf(stderr, "[suffix_bench] %s request %zu: %s's log p differs from plain's by %.3g at token %zu (source %d)\n",
                                 workload.c_str(), stats[workload][0].ratio.size() + 1, variants[i].name.c_str(), worst, at,
                                 touts[i][at].source);
            }
        for (size_t i = 1; i < variants.size(); ++i)
            if (outs[i] != plain_out) {
                ++differ[i];
                size_t k = 0;
                while (k < outs[i].size() && k < plain_out.size() && outs[i][k] == plain_out[k]) ++k;
                std::fprintf(stderr, "[suffix_bench] %s request %zu: %s's output differs from plain's at token %zu\n",
                             workload.c_str(), stats[workload][0].ratio.size() + 1, variants[i].name.c_str(), k);
                if (probs && k < touts[i].size() && k < touts[0].size()) {
                    auto show = [](const TokenOutput & t) {
                        std::string r = "token " + std::to_string(t.id) + " (source " + std::to_string(t.source) + "), top 2:";
                        char buf[96];
                        for (const auto & tp : t.top) {
                            std::snprintf(buf, sizeof buf, " %d p=%.9g", tp.id, double(tp.prob));
                            r += buf;
                        }
                        if (t.top.size() >= 2 && t.top[1].prob > 0) {
                            std::snprintf(buf, sizeof buf, "; logit gap %.3g", std::log(double(t.top[0].prob) / double(t.top[1].prob)));
                            r += buf;
                        }
                        return r;
                    };
                    std::fprintf(stderr, "[suffix_bench]   plain: %s\n[suffix_bench]   %s: %s\n", show(touts[0][k]).c_str(),
                                 variants[i].name.c_str(), show(touts[i][k]).c_str());
                }
            }
        for (size_t i = 0; i < variants.size(); ++i)
            if (ms[i] > 0) stats[workload][i].ratio.push_back(ms[0] / ms[i]);
        ++rot;
        std::fprintf(stderr, "[suffix_bench] %s request %zu: plain %.0f ms, %s\n", workload.c_str(),
                     stats[workload][0].ratio.size(), ms[0], [&] {
                         std::string r;
                         for (size_t i = 1; i < variants.size(); ++i)
                             r += variants[i].name + " " + std::to_string(ms[0] / std::max(ms[i], 1e-9)).substr(0, 4) + "x  ";
                         return r;
                     }().c_str());
        return plain_out;
    };

    // Warm-up: every engine's first speculative request holds its first round and may probe costs.
    for (int i = 0; i < 2; ++i) run("warm-up", tok("The wind blew hard", true), 16);
    stats.erase("warm-up");
    order.clear();

    const size_t n_pass = quick ? 2 : kPassages.size();
    for (size_t i = 0; i < n_pass; ++i) run("copy", tok(kPassages[i], true), n_tokens);

    // Conversations: turn 1 a story opening; every later turn = history + "\n\n" + the first 6
    // tokens of an earlier answer (the first, then the one before the last), quoted on by the target.
    // (not among the repeat prompts: those must be new to every store in repeat-1)
    const std::vector<std::string> openings = {"Sara had a little red hen", "A small frog lived in a pond",
                                               "Grandma made soup for the kids"};
    const int n_conv = quick ? 1 : int(openings.size()), n_turns = 4, n_turn_tokens = 64;
    const std::vector<token_id> sep = tok("\n\n", false);
    for (int c = 0; c < n_conv; ++c) {
        std::vector<token_id> history = tok(openings[size_t(c)], true);
        std::vector<std::vector<token_id>> answers;
        for (int t = 0; t < n_turns; ++t) {
            std::vector<token_id> prompt = history;
            if (t > 0) {
                const auto & quoted = answers[t == 1 ? 0 : size_t(t) - 2];
                prompt.insert(prompt.end(), sep.begin(), sep.end());
                prompt.insert(prompt.end(), quoted.begin(), quoted.begin() + std::min<ptrdiff_t>(6, ptrdiff_t(quoted.size())));
            }
            if (prompt.size() + size_t(n_turn_tokens) + 8 > 512) break;
            std::vector<token_id> ans = run("multiturn", prompt, n_turn_tokens);
            history = prompt;
            history.insert(history.end(), ans.begin(), ans.end());
            answers.push_back(ans);
        }
    }

    const size_t n_rep = quick ? 3 : bench::kPrompts.size();
    for (const char * w : {"repeat-1", "repeat-2"})
        for (size_t i = 0; i < n_rep; ++i) run(w, tok(bench::kPrompts[i], true), 96);

    std::printf("| workload | drafter | tokens | tokens / target pass | t/s | median speed-up vs plain (per request) | accepted / drafted |\n");
    std::printf("|---|---|---:|---:|---:|---:|---|\n");
    for (const std::string & w : order) {
        const auto & sv = stats[w];
        for (size_t i = 0; i < variants.size(); ++i) {
            const Stat & s = sv[i];
            std::printf("| %s | %s | %lld | %.2f | %.0f | %s | %s |\n", w.c_str(), variants[i].name.c_str(),
                        (long long)s.tokens, s.passes ? double(s.tokens) / double(s.passes) : 0.0, s.ms > 0 ? 1e3 * double(s.tokens) / s.ms : 0.0,
                        i == 0 ? "1.00x" : (std::to_string(median(s.ratio)).substr(0, 4) + "x").c_str(),
                        i == 0 ? "-"
                               : (std::to_string(s.accepted) + " / " + std::to_string(s.drafted) + " (" +
                                  std::to_string(int(s.drafted ? 100.0 * double(s.accepted) / double(s.drafted) : 0.0)) + "%)")
                                     .c_str());
        }
    }
    std::fprintf(stderr, "[suffix_bench] %s, %d threads, copy %d tokens, %s\n", bench::short_name(model).c_str(), threads,
                 n_tokens, fixed > 0 ? ("fixed draft length " + std::to_string(fixed)).c_str() : "adaptive draft length");
    for (size_t i = 1; i < variants.size(); ++i)
        std::fprintf(stderr, "[suffix_bench] %s: %d request(s) with an output other than plain's\n", variants[i].name.c_str(),
                     differ[i]);
    if (probs)
        for (size_t i = 1; i < variants.size(); ++i)
            std::fprintf(stderr, "[suffix_bench] %s: largest |log p - plain's log p| of an emitted token: %.3g\n",
                         variants[i].name.c_str(), max_dlogp[i]);
    for (size_t i = 0; i < variants.size(); ++i) {
        const CostCurve c = engines[i]->cost_curve();
        if (c.v.size() > 8)
            std::fprintf(stderr, "[suffix_bench] %s: cost curve t(1) %.2f ms v(2) %.2f v(4) %.2f v(8) %.2f\n",
                         variants[i].name.c_str(), c.t1_ms, c.v[2], c.v[4], c.v[8]);
    }
    return 0;
}
