// Greedy suffix-tree speculation against plain decoding over a sequence of requests: copy-heavy
// passages, a conversation whose turns quote earlier answers, ordinary prompts and prompts asked
// again, so drafts come from the request's own trie and from the store of earlier responses, as
// trees of 3 branches whose side branches are accepted too. Each request runs on a plain engine
// and on a tree engine (its own store, fed only by its own requests); the outputs must be
// token-identical up to the near-tie rule below.
//
// The near-tie rule. A tree pass leaves its rejected nodes' KV cells free, llama.cpp puts later
// tokens into those holes, and a sequence's cells stop being in position order. The kernels sum
// attention in cell order (flash attention with an F16 accumulator, or the KQ·V product), so the
// same attention rounds differently, and on a Q8_0 model, whose matmuls quantize their inputs to 8
// bits, those roundings grow to logit shifts of tenths. A replay of tree passes through llama.h
// gave bit-identical logits to plain decoding whenever the accepted path's cells followed the
// root in order, side branches included (docs/benchmarks.md, "Suffix drafting"): the shifts
// come from the cell order, not from the tree's masks, positions or KV clean-up. So an output may
// leave plain's only at a position where plain's own top-2 logit gap is below the model's
// near-tie bound (twice the largest shift measured where both runs agree); before it, every
// token must match, and a divergence at a clear gap fails.
//
// Power: test_hooks::draft_bug = TREE_KEEPS_REJECTED leaves the main branch's rejected cells in the
// main sequence when an accepted side branch is moved there (a KV clean-up bug that llama.cpp's
// position checks do not see); the same workload then fails the rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/test_hooks.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

using Toks = std::vector<token_id>;

const char * kPassages[] = {
    "Anna found a little kitten under a bush. It was cold and wet. She took it home and gave it warm "
    "milk. The kitten purred and slept on her bed. In the morning, Anna named the kitten Snow because it "
    "was white like snow. Snow followed Anna everywhere and they played all day.\n\n"
    "Anna found a little kitten under a bush. It was",
    "Jack wanted to build a tall tower with his blocks. He put one block on top of another. The tower "
    "grew and grew. Then his sister Lucy ran by and the tower fell down. Jack was sad, but Lucy helped "
    "him build it again. This time the tower was even taller.\n\nJack wanted to build a tall tower with",
};
const char * kOpenings[] = {"Sara had a little red hen", "A small frog lived in a pond"};
const char * kOrdinary[] = {"Once upon a time", "The little dog"};

constexpr int kTokens = 64;
constexpr int kTurns  = 4;

struct Request {
    Toks                     prompt;
    std::vector<TokenOutput> plain;  // with the top-2 raw probabilities
};

CompletionRequest request(const Toks & prompt) {
    CompletionRequest r;
    r.prompt               = prompt;
    r.n_predict            = kTokens;
    r.sampling.temperature = 0.0f;
    r.sampling.n_probs     = 2;
    return r;
}

// The workload's prompts with plain's outputs, in order; a conversation's next prompt is its
// history (plain's answers) plus "\n\n" and the first 6 tokens of an earlier answer.
std::vector<Request> plain_runs(Engine & e) {
    std::vector<Request> runs;
    auto run = [&](const Toks & prompt) -> const std::vector<TokenOutput> & {
        auto r = e.complete(request(prompt));
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        runs.push_back(Request{prompt, r ? r.value().tokens : std::vector<TokenOutput>{}});
        return runs.back().plain;
    };
    auto tok = [&](const std::string & s, bool bos) { return e.tokenize(s, bos, false).value(); };
    for (const char * p : kPassages) run(tok(p, true));
    const Toks sep = tok("\n\n", false);
    for (const char * o : kOpenings) {
        Toks history = tok(o, true);
        std::vector<Toks> answers;
        for (int t = 0; t < kTurns; ++t) {
            Toks prompt = history;
            if (t > 0) {
                const Toks & q = answers[t == 1 ? 0 : size_t(t) - 2];
                prompt.insert(prompt.end(), sep.begin(), sep.end());
                prompt.insert(prompt.end(), q.begin(), q.begin() + std::min<ptrdiff_t>(6, ptrdiff_t(q.size())));
            }
            Toks ans;
            for (const auto & t : run(prompt)) ans.push_back(t.id);
            history = prompt;
            history.insert(history.end(), ans.begin(), ans.end());
            answers.push_back(ans);
        }
    }
    for (int rep = 0; rep < 2; ++rep)
        for (const char * o : kOrdinary) run(tok(o, true));
    return runs;
}

struct Outcome {
    int                      identical = 0, near_ties = 0;
    std::vector<std::string> violations;  // divergences at a clear gap
    std::vector<double>      tie_gaps;    // plain's top-2 gap where a near-tie flipped
    int64_t                  accepted = 0, side_accepted = 0;  // draft tokens kept; from branches > 0
    double                   max_shift = 0;  // largest |top-2 gap - plain's| where both runs agree
};

// Plain's top-2 logit gap at an emitted token (log of the raw probabilities' ratio).
double top2_gap(const TokenOutput & t) {
    if (t.top.size() < 2 || t.top[1].prob <= 0) return INFINITY;
    return std::log(double(t.top[0].prob) / double(t.top[1].prob));
}

// Runs the workload on `e` with 3-branch suffix trees and compares with plain under the rule.
Outcome tree_runs(Engine & e, const std::vector<Request> & runs, double near_tie) {
    Outcome o;
    for (size_t i = 0; i < runs.size(); ++i) {
        CompletionRequest r = request(runs[i].prompt);
        r.spec.types      = {SpecType::SUFFIX};
        r.spec.n_parallel = 3;
        r.spec.n_max      = 8;
        r.spec.adaptive   = false;  // draft every round: the cost curve of a busy machine may say not to
        auto res = e.complete(r);
        if (!res) {
            o.violations.push_back("request " + std::to_string(i) + " failed: " + res.status().to_string());
            continue;
        }
        const auto & spec  = res.value().tokens;
        const auto & plain = runs[i].plain;
        o.accepted += res.value().spec.draft_n_accepted;
        size_t k = 0;
        while (k < spec.size() && k < plain.size() && spec[k].id == plain[k].id) {
            if (spec[k].source > 1) ++o.side_accepted;
            if (spec[k].top.size() >= 2 && plain[k].top.size() >= 2 && spec[k].top[1].id == plain[k].top[1].id)
                o.max_shift = std::max(o.max_shift, std::fabs(top2_gap(spec[k]) - top2_gap(plain[k])));
            ++k;
        }
        if (k == spec.size() && k == plain.size()) {
            ++o.identical;
            continue;
        }
        const double gap = k < plain.size() ? top2_gap(plain[k]) : INFINITY;
        char buf[200];
        std::snprintf(buf, sizeof buf, "request %zu: token %zu is %d, plain's %d (plain's top-2 gap %.4g)", i, k,
                      k < spec.size() ? spec[k].id : -1, k < plain.size() ? plain[k].id : -1, gap);
        if (gap < near_tie) {
            ++o.near_ties;
            o.tie_gaps.push_back(gap);
            std::fprintf(stderr, "[suffix_greedy] near-tie %s\n", buf);
        } else {
            o.violations.push_back(buf);
        }
    }
    return o;
}

std::unique_ptr<Engine> engine(const std::string & model, int32_t n_tree_max) {
    EngineParams p = engine_params(model);
    p.n_ctx      = 512;
    p.n_tree_max = n_tree_max;
    auto e = Engine::create(p);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e.value()) : nullptr;
}

// Plain's runs of the workload, once per model for all tests.
const std::vector<Request> & plain_cached(const std::string & model) {
    static std::map<std::string, std::vector<Request>> cache;
    auto it = cache.find(model);
    if (it != cache.end()) return it->second;
    auto plain = engine(model, 1);
    std::vector<Request> runs = plain ? plain_runs(*plain) : std::vector<Request>{};
    return cache.emplace(model, std::move(runs)).first->second;
}

struct BugGuard {
    explicit BugGuard(DraftBug b) { test_hooks::draft_bug.store(b); }
    ~BugGuard() { test_hooks::draft_bug.store(DraftBug::NONE); }
};

void check_identical(const std::string & model, double near_tie, int max_near_ties) {
    const std::vector<Request> & runs = plain_cached(model);
    ASSERT_FALSE(runs.empty());
    auto tree = engine(model, 3);
    ASSERT_NE(tree, nullptr);
    const Outcome o = tree_runs(*tree, runs, near_tie);
    std::fprintf(stderr, "[suffix_greedy] %s: %zu requests, %d identical, %d near-ties, %zu violations; %lld draft tokens "
                 "accepted, %lld from side branches; top-2 gaps moved by up to %.3g where the tokens agree\n", model.c_str(),
                 runs.size(), o.identical, o.near_ties, o.violations.size(), (long long)o.accepted, (long long)o.side_accepted,
                 o.max_shift);
    for (const auto & v : o.violations) ADD_FAILURE() << model << " " << v;
    EXPECT_LE(o.near_ties, max_near_ties) << "more near-ties than measured: a bug may be hiding under the rule";
    EXPECT_GT(o.accepted, int64_t(runs.size()) * 8) << "the trees were hardly drafted from";
    EXPECT_GT(o.side_accepted, 0) << "no side branch was ever accepted: the test does not exercise trees";
}

}  // namespace

// copy-x100M-Q8_0: top-2 gaps move by up to 0.49 where the runs agree; 3 of the 14 requests end
// in a near-tie (plain's gaps 0.006, 0.021, 0.34).
TEST(SuffixGreedy, TreesMatchPlainOnTheCopyTarget) { check_identical("stories260K-copy-x100M-Q8_0.gguf", 1.0, 5); }

// stories260K-F32 (F32 weights, F16 KV): gaps move by up to 0.018; 1 near-tie (gap 0.0025).
TEST(SuffixGreedy, TreesMatchPlainOnStories260K) { check_identical("stories260K-F32.gguf", 0.04, 2); }

// The rule has power: a KV clean-up bug in tree book-keeping breaks it.
TEST(SuffixGreedy, PowerRejectedBranchLeftInTheKvFails) {
    const std::string model = "stories260K-copy-x100M-Q8_0.gguf";
    const std::vector<Request> & runs = plain_cached(model);
    ASSERT_FALSE(runs.empty());
    auto tree = engine(model, 3);
    ASSERT_NE(tree, nullptr);
    BugGuard bug(DraftBug::TREE_KEEPS_REJECTED);
    const Outcome o = tree_runs(*tree, runs, 1.0);
    std::fprintf(stderr, "[suffix_greedy] broken variant: %d identical, %d near-ties, %zu violations\n", o.identical,
                 o.near_ties, o.violations.size());
    for (const auto & v : o.violations) std::fprintf(stderr, "[suffix_greedy]   %s\n", v.c_str());
    EXPECT_GT(o.violations.size(), 0u) << "a tree that attends to rejected tokens went unnoticed";
}
