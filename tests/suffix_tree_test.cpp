// Suffix drafting (speculative/suffix_tree.h, the SUFFIX drafter): the trie's counts and matches, removal
// and the store's eviction under its byte budget, the proposal's tree (frequency order, branch
// limit, size from the cost model); then through the engine on real models: greedy output with
// `suffix` (chains and trees, cross-request store) token-identical to plain decoding on
// stories260K-F32 and the copy target stories260K-copy-F32, and at T = 1 the emitted tokens
// distributed as plain decoding's (chi-square), with the power shown by a drafter that passes its
// frequencies off as a sampling distribution (test_hooks::suffix_claims_q).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <utility>

#include "engine/test_hooks.h"
#include "speculative/suffix_tree.h"
#include "speculative/tree_layout.h"
#include "stats_util.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

using Toks = std::vector<token_id>;

// Every path of the trie with its count (DFS over children()).
std::map<Toks, uint32_t> dump(const SuffixTrie & t) {
    std::map<Toks, uint32_t> out;
    std::vector<std::pair<uint32_t, Toks>> stack{{0, {}}};
    std::vector<SuffixTrie::Child> kids;
    while (!stack.empty()) {
        auto [u, path] = stack.back();
        stack.pop_back();
        t.children(u, kids);
        for (const auto & k : kids) {
            Toks p = path;
            p.push_back(k.token);
            out[p] = k.count;
            stack.push_back({k.node, p});
        }
    }
    return out;
}

// Occurrences of every substring of up to `depth` tokens of each stream (the definition).
std::map<Toks, uint32_t> brute(const std::vector<Toks> & streams, int depth) {
    std::map<Toks, uint32_t> out;
    for (const auto & s : streams)
        for (size_t i = 0; i < s.size(); ++i)
            for (size_t n = 1; n <= size_t(depth) && i + n <= s.size(); ++n) out[Toks(s.begin() + i, s.begin() + i + n)]++;
    return out;
}

std::map<token_id, uint32_t> kids_of(const SuffixTrie & t, uint32_t node) {
    std::vector<SuffixTrie::Child> kids;
    t.children(node, kids);
    std::map<token_id, uint32_t> m;
    for (const auto & k : kids) m[k.token] = k.count;
    return m;
}

CostModel flat_cost() { return CostModel{{0.0, 1.0, 1.0, 1.0, 1.0}, 0.0, 0.0}; }  // v(n) = 1: nodes are free

// A pass of n tokens costs 1 + 0.25 (n - 1) 1-token passes.
CostModel quarter_cost() { return CostModel{{0.0, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0}, 0.0, 0.0}; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The structure

TEST(SuffixTrie, CountsEverySubstringUpToItsDepth) {
    std::mt19937 rng(7);
    std::vector<Toks> streams;
    for (int s = 0; s < 4; ++s) {
        Toks t;
        for (int i = 0; i < 60; ++i) t.push_back(token_id(rng() % 5));
        streams.push_back(t);
    }
    for (int depth : {2, 5, 32}) {
        SuffixTrie trie(depth);
        for (const auto & s : streams) {
            trie.append(s);
            trie.end_stream();
        }
        EXPECT_EQ(dump(trie), brute(streams, depth)) << "depth " << depth;
        EXPECT_EQ(trie.n_nodes(), brute(streams, depth).size() + 1);
    }
}

TEST(SuffixTrie, IncrementalAppendEqualsOneShot) {
    Toks s = {1, 2, 3, 1, 2, 4, 1, 2, 3, 3, 3, 1, 2};
    SuffixTrie a(6), b(6);
    a.append(s);
    for (token_id t : s) b.append(&t, 1);
    EXPECT_EQ(dump(a), dump(b));
}

TEST(SuffixTrie, StreamsDoNotSpan) {
    SuffixTrie t(8);
    t.append(Toks{1, 2});
    t.end_stream();
    t.append(Toks{3});
    auto d = dump(t);
    EXPECT_EQ(d.count(Toks{2, 3}), 0u);
    EXPECT_EQ(d.count(Toks{1, 2}), 1u);
}

TEST(SuffixTrie, MatchFindsTheLongestSuffixWithAContinuation) {
    SuffixTrie t(16);
    Toks s = {1, 2, 3, 1, 2, 4, 1, 2};
    t.append(s);
    // [4 1 2] occurs only at the end (no continuation yet); [1 2] occurs 3 times, followed by 3 and 4
    auto m = t.match(s.data(), s.size(), 16);
    EXPECT_EQ(m.length, 2);
    EXPECT_EQ(t.count(m.node), 3u);
    EXPECT_EQ(kids_of(t, m.node), (std::map<token_id, uint32_t>{{3, 1}, {4, 1}}));
    // capped at max_match
    Toks ctx = {9, 3, 1, 2};
    EXPECT_EQ(t.match(ctx.data(), ctx.size(), 16).length, 3);  // [3 1 2] → 4
    EXPECT_EQ(t.match(ctx.data(), ctx.size(), 1).length, 1);   // [2] → 3, 4
    Toks none = {7};
    EXPECT_EQ(t.match(none.data(), none.size(), 16).length, 0);
}

TEST(SuffixTrie, RemoveUndoesAppend) {
    std::mt19937 rng(3);
    std::vector<Toks> streams;
    for (int s = 0; s < 5; ++s) {
        Toks t;
        for (int i = 0; i < 40; ++i) t.push_back(token_id(rng() % 4));
        streams.push_back(t);
    }
    SuffixTrie t(6);
    for (const auto & s : streams) {
        t.append(s);
        t.end_stream();
    }
    t.remove(streams[1]);
    t.remove(streams[3]);
    EXPECT_EQ(dump(t), brute({streams[0], streams[2], streams[4]}, 6));
    EXPECT_EQ(t.n_nodes(), brute({streams[0], streams[2], streams[4]}, 6).size() + 1);
    for (int i : {0, 2, 4}) t.remove(streams[size_t(i)]);
    EXPECT_EQ(t.n_nodes(), 1u);  // only the root
    EXPECT_TRUE(dump(t).empty());
    // freed slots are reused: adding the same again does not grow the arrays
    const size_t alloc = t.allocated_bytes();
    t.append(streams[0]);
    EXPECT_LE(t.allocated_bytes(), alloc);
}

TEST(SuffixStore, EvictsOldestResponsesUnderTheBudget) {
    // each response is distinct: 100 tokens of its own ids, ~800 nodes of 16 B
    const size_t budget = 64 * 1024;
    SuffixStore st(budget, 8);
    std::vector<Toks> docs;
    for (int d = 0; d < 40; ++d) {
        Toks t;
        for (int i = 0; i < 100; ++i) t.push_back(token_id(d * 100 + i));
        docs.push_back(t);
        st.add(t);
        EXPECT_LE(st.bytes(), budget) << "after response " << d;
    }
    EXPECT_GT(st.n_evicted(), 0u);
    EXPECT_EQ(st.n_docs() + st.n_evicted(), docs.size());
    // the newest responses are the ones kept, whole
    auto d = dump(st.trie());
    EXPECT_EQ(d.count(Toks{3900, 3901}), 1u);
    EXPECT_EQ(d.count(Toks{0, 1}), 0u);
    const size_t first_kept = docs.size() - st.n_docs();
    EXPECT_EQ(d.count(Toks{token_id(first_kept * 100)}), 1u);
    EXPECT_EQ(d.count(Toks{token_id((first_kept - 1) * 100)}), 0u);
}

TEST(SuffixStore, MemoryStaysBoundedOverManyResponses) {
    const size_t budget = 1 << 20;
    SuffixStore st(budget);  // default depth 32
    std::mt19937 rng(11);
    size_t peak_alloc = 0;
    for (int d = 0; d < 400; ++d) {
        Toks t(size_t(50 + rng() % 400));
        for (auto & x : t) x = token_id(rng() % 32000);
        if (d == 200) t.resize(100000, 5);  // one response far beyond what the budget holds
        st.add(t);
        ASSERT_LE(st.bytes(), budget);
        peak_alloc = std::max(peak_alloc, st.allocated_bytes());
    }
    std::printf("store: %zu responses kept, %zu evicted, %zu bytes live, %zu allocated at most\n", st.n_docs(),
                st.n_evicted(), st.bytes(), peak_alloc);
    EXPECT_LE(peak_alloc, budget * 3);
    EXPECT_GT(st.n_docs(), 0u);
    // budget 0 keeps nothing; shrinking evicts at once
    st.set_max_bytes(budget / 4);
    EXPECT_LE(st.bytes(), budget / 4);
    st.set_max_bytes(0);
    EXPECT_EQ(st.n_docs(), 0u);
    st.add(Toks{1, 2, 3});
    EXPECT_EQ(st.n_docs(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Proposals

TEST(SuffixPropose, ChainContinuesTheMatch) {
    Toks ctx = {5, 6, 7, 8, 9, 5, 6};
    SuffixTrie t;
    t.append(ctx);
    SuffixDraftParams p;
    p.alpha     = 0.9;
    p.max_depth = 16;
    p.max_nodes = 16;
    SuffixProposal pr = suffix_propose(t, ctx, p, flat_cost());
    EXPECT_EQ(pr.match_length, 2);
    // depth ≤ spec_factor * 2 + 1 = 5, and the stream's own continuation ends there
    EXPECT_EQ(suffix_main_path(pr.tree), (Toks{7, 8, 9, 5, 6}));
    EXPECT_EQ(draft_tree_size(pr.tree), 5);
    EXPECT_EQ(pr.tree.nodes[0].token, 6);
    for (size_t i = 1; i < pr.tree.nodes.size(); ++i) EXPECT_TRUE(pr.tree.nodes[i].q.empty());  // deterministic
    p.max_depth = 3;
    EXPECT_EQ(suffix_main_path(suffix_propose(t, ctx, p, flat_cost()).tree), (Toks{7, 8, 9}));
}

TEST(SuffixPropose, TreeBranchesByFrequency) {
    // [1 2] was followed by 3 three times and by 4 once (no longer suffix repeats: 5..8 differ)
    Toks ctx = {1, 2, 3, 0, 5, 1, 2, 3, 0, 6, 1, 2, 4, 0, 7, 1, 2, 3, 0, 8, 1, 2};
    SuffixTrie t;
    t.append(ctx);
    SuffixDraftParams p;
    p.alpha        = 0.9;
    p.max_depth    = 2;
    p.max_nodes    = 8;
    p.max_branches = 2;
    SuffixProposal pr = suffix_propose(t, ctx, p, flat_cost());
    ASSERT_GE(pr.tree.nodes.size(), 3u);
    // the frequent continuation first: root's children in order 3, 4
    std::vector<token_id> root_kids;
    for (size_t i = 1; i < pr.tree.nodes.size(); ++i)
        if (pr.tree.nodes[i].parent == 0) root_kids.push_back(pr.tree.nodes[i].token);
    EXPECT_EQ(root_kids, (Toks{3, 4}));
    EXPECT_LE(tree_n_branches(pr.tree), 2);
    EXPECT_EQ(suffix_main_path(pr.tree), (Toks{3, 0}));
    EXPECT_TRUE(draft_tree_check(pr.tree).is_ok());
    // one branch: a chain along the frequent path
    p.max_branches = 1;
    SuffixProposal chain = suffix_propose(t, ctx, p, flat_cost());
    EXPECT_EQ(tree_n_branches(chain.tree), 1);
    EXPECT_EQ(suffix_main_path(chain.tree), (Toks{3, 0}));
    // deterministic
    EXPECT_EQ(suffix_main_path(suffix_propose(t, ctx, p, flat_cost()).tree), suffix_main_path(chain.tree));
}

TEST(SuffixPropose, CostModelSizesTheTree) {
    Toks ctx = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3};
    SuffixTrie t;
    t.append(ctx);
    SuffixDraftParams p;
    p.alpha     = 0.8;
    p.max_depth = 16;
    p.max_nodes = 16;
    // free nodes: as deep as the match allows (3 * 2 + 1 = 7)
    EXPECT_EQ(draft_tree_size(suffix_propose(t, ctx, p, flat_cost()).tree), 7);
    // every node costs a full pass (v(n) = n): nothing pays
    CostModel linear{{0.0, 1.0}, 0.0, 0.0};
    SuffixProposal none = suffix_propose(t, ctx, p, linear);
    EXPECT_EQ(draft_tree_size(none.tree), 0);
    EXPECT_EQ(none.score, 1.0);
    // a pass of n costs 1 + 0.25 (n - 1): S(k) = (1 + Σ 0.8^i) / (1 + 0.25 k) peaks at k = 3, the
    // chain the cost model predicts best (choose_gamma, draft_length.h)
    const CostModel mid = quarter_cost();
    const GammaChoice best = choose_gamma(mid, std::vector<double>{0.0, 0.8}, 1, 7);
    const int best_k = best.gamma;
    EXPECT_EQ(best_k, 3);
    SuffixProposal pm = suffix_propose(t, ctx, p, mid);
    EXPECT_EQ(draft_tree_size(pm.tree), best_k);
    EXPECT_NEAR(pm.score, best.predicted, 1e-9);
}

TEST(SuffixPropose, DepthProfileReplacesAlpha) {
    // the class profile of a long match: a(1..3) = 0.99, then 0.3 (a copy that holds three tokens
    // and then usually leaves the passage); the scalar α, far lower, must not be used
    Toks ctx = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3};
    SuffixTrie t;
    t.append(ctx);
    SuffixDraftParams p;
    p.alpha       = 0.3;
    p.depth_alpha = {0.0, 0.99, 0.99, 0.99, 0.3};
    p.max_depth   = 16;
    p.max_nodes   = 16;
    const CostModel mid = quarter_cost();
    // past the profile's end its last entry (0.3) holds
    const GammaChoice prof = choose_gamma(mid, p.depth_alpha, 1, 7);
    const int k_prof = prof.gamma;
    const double s_prof = prof.predicted;
    SuffixProposal pp = suffix_propose(t, ctx, p, mid);
    EXPECT_EQ(k_prof, 3);
    EXPECT_EQ(draft_tree_size(pp.tree), k_prof);
    EXPECT_NEAR(pp.score, s_prof, 1e-9);
    // the scalar α alone: shallower (at 0.3 one node pays, S = 1.3 / 1.25)
    p.depth_alpha.clear();
    EXPECT_EQ(choose_gamma(mid, 0.3, 1, 7).gamma, 1);
    EXPECT_EQ(draft_tree_size(suffix_propose(t, ctx, p, mid).tree), 1);
    // a profile that stays high drafts as deep as the match allows
    p.depth_alpha = {0.0, 1.0};
    EXPECT_EQ(draft_tree_size(suffix_propose(t, ctx, p, flat_cost()).tree), 7);
}

TEST(SuffixPropose, StoreAndRequestCompete) {
    SuffixTrie req, store;
    Toks ctx = {40, 41, 42};
    req.append(ctx);  // no earlier occurrence: nothing to propose from the request
    store.append(Toks{41, 42, 43, 44, 45});
    SuffixDraftParams p;
    p.max_depth = 8;
    p.max_nodes = 8;
    SuffixProposal pr = suffix_draft(&req, &store, ctx, p, flat_cost());
    EXPECT_EQ(suffix_main_path(pr.tree), (Toks{43, 44, 45}));
    EXPECT_EQ(draft_tree_size(suffix_draft(&req, nullptr, ctx, p, flat_cost()).tree), 0);

    // both propose: the longer match wins, though the shorter one's bushy tree scores higher
    SuffixTrie req2, store2;
    Toks ctx2 = {1, 2, 3, 7, 1, 2, 4, 7, 1, 2, 5, 7, 1, 2, 6, 7, 9, 9, 8, 1, 2};
    req2.append(ctx2);  // [1 2] → 3, 4, 5, 6 (match 2)
    store2.append(Toks{9, 8, 1, 2, 30, 31});  // [9 8 1 2] → 30 31 (match 4)
    p.max_branches = 4;
    p.max_nodes    = 16;
    SuffixProposal r2 = suffix_propose(req2, ctx2, p, flat_cost());
    SuffixProposal s2 = suffix_propose(store2, ctx2, p, flat_cost());
    ASSERT_EQ(r2.match_length, 2);
    ASSERT_EQ(s2.match_length, 4);
    EXPECT_GT(r2.score, s2.score);
    EXPECT_EQ(suffix_main_path(suffix_draft(&req2, &store2, ctx2, p, flat_cost()).tree), (Toks{30, 31}));
}

// ---------------------------------------------------------------------------------------------
// Through the engine: greedy output is plain decoding's

namespace {

SpecParams suffix_spec(int branches, int n_max = 8, bool adaptive = false) {
    SpecParams sp;
    sp.types      = {SpecType::SUFFIX};
    sp.n_max      = n_max;
    sp.adaptive   = adaptive;
    sp.n_parallel = branches;
    return sp;
}

const char * kPassage =
    "Ben had a blue car. He liked to drive it to the park. One day, the car stopped. Ben was sad. His dad "
    "came and fixed the car. Ben was happy again and drove all day.\n\nBen had a blue car. He liked to";

void greedy_identical(const std::string & model) {
    auto e = make_engine(model, "", 1, 0, 4);
    ASSERT_NE(e, nullptr);
    const char * prompts[] = {kPassage, "Once upon a time", "the cat sat on the mat. the cat sat on the mat. the cat",
                              "Lily and Tom went to the park. Lily and Tom"};
    int64_t accepted = 0;
    for (const char * pr : prompts) {
        auto plain = e->complete(greedy_request(*e, pr, 64));
        ASSERT_TRUE(plain.is_ok());
        for (int branches : {1, 3}) {
            for (bool adaptive : {false, true}) {
                auto req = greedy_request(*e, pr, 64);
                req.spec = suffix_spec(branches, 8, adaptive);
                auto r   = e->complete(req);
                ASSERT_TRUE(r.is_ok()) << r.status().to_string();
                EXPECT_EQ(output_ids(r.value()), output_ids(plain.value()))
                    << model << " '" << pr << "' branches " << branches << " adaptive " << adaptive;
                EXPECT_LE(r.value().spec.draft_n_accepted, r.value().spec.draft_n);
                accepted += r.value().spec.draft_n_accepted;
            }
        }
    }
    EXPECT_GT(accepted, 0) << "suffix drafting never drafted anything the target kept";
}

}  // namespace

TEST(SuffixEngine, GreedyIdenticalStories260K) { greedy_identical("stories260K-F32.gguf"); }
TEST(SuffixEngine, GreedyIdenticalCopyTarget) { greedy_identical("stories260K-copy-F32.gguf"); }

// A repeated request drafts from the store of earlier responses: the second run of a prompt
// whose output does not repeat its prompt is drafted (and accepted) from the first run's output.
TEST(SuffixEngine, CrossRequestStoreDrafts) {
    auto e = make_engine("stories260K-F32.gguf", "", 1, 0, 4);
    ASSERT_NE(e, nullptr);
    auto plain = e->complete(greedy_request(*e, "Once upon a time", 48));
    ASSERT_TRUE(plain.is_ok());
    auto req = greedy_request(*e, "Once upon a time", 48);
    req.spec = suffix_spec(1, 8);
    auto r = e->complete(req);  // the plain run above is in the store already
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(output_ids(r.value()), output_ids(plain.value()));
    EXPECT_GE(r.value().spec.draft_n_accepted, 30) << "the earlier response was not drafted from";

    // without the store, the request's own tokens are all there is
    EngineParams p = engine_params("stories260K-F32.gguf");
    p.suffix_cache_max_mb = 0;
    auto e0 = Engine::create(p);
    ASSERT_TRUE(e0.is_ok());
    ASSERT_TRUE(e0.value()->complete(greedy_request(*e0.value(), "Once upon a time", 48)).is_ok());
    auto r0 = e0.value()->complete(req);
    ASSERT_TRUE(r0.is_ok());
    EXPECT_EQ(output_ids(r0.value()), output_ids(plain.value()));
    EXPECT_LT(r0.value().spec.draft_n_accepted, r.value().spec.draft_n_accepted);
}

TEST(SuffixEngine, NamesAndOptions) {
    SpecType t;
    ASSERT_TRUE(spec_type_from_name("suffix", &t));
    EXPECT_EQ(t, SpecType::SUFFIX);
    EXPECT_STREQ(spec_type_name(SpecType::SUFFIX), "suffix");
    EngineParams p = engine_params("stories260K-F32.gguf");
    p.suffix_cache_max_mb = -1;
    auto e = Engine::create(p);
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().param(), "suffix_cache_max_mb");
}

// ---------------------------------------------------------------------------------------------
// T > 0: lossless. The emitted tokens at positions 1..kPos against plain decoding's (two-sample
// chi-square), token 1 against its exact p; trees of 3 branches drafted from a repetitive prompt,
// verified by recursive rejection over the siblings.

namespace {

#if defined(__SANITIZE_ADDRESS__)
#define SUFFIX_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SUFFIX_TEST_ASAN 1
#endif
#endif
#ifdef SUFFIX_TEST_ASAN
constexpr int  kRuns = 500;
constexpr bool kAsan = true;
#else
constexpr int  kRuns = 2000;
constexpr bool kAsan = false;
#endif
constexpr int    kPos   = 4;
constexpr int    kPred  = 6;
constexpr double kPPass = 1e-4;
constexpr double kPFail = 1e-6;

struct Sample {
    std::vector<Toks> out;
    int64_t draft_n = 0, accepted = 0, steps = 0;
};

Sample run_many(Engine & e, const Toks & prompt, const SamplingParams & sp, const SpecParams & spec, uint32_t seed0) {
    Sample s;
    for (int i = 0; i < kRuns; ++i) {
        CompletionRequest r;
        r.prompt        = prompt;
        r.n_predict     = kPred;
        r.sampling      = sp;
        r.sampling.seed = seed0 + uint32_t(i);
        r.spec          = spec;
        auto res = e.complete(r);
        EXPECT_TRUE(res.is_ok());
        if (!res) continue;
        s.out.push_back(output_ids(res.value()));
        s.draft_n += res.value().spec.draft_n;
        s.accepted += res.value().spec.draft_n_accepted;
        s.steps += res.value().spec.draft_n_steps;
    }
    return s;
}

using Bins = std::map<Toks, int64_t>;
Bins bins(const Sample & s, int pos, int n = 1) {
    Bins b;
    for (const auto & o : s.out) {
        Toks k;
        for (int i = pos; i < pos + n; ++i) k.push_back(i < int(o.size()) ? o[size_t(i)] : -1);
        b[k]++;
    }
    return b;
}

ChiSquare homogeneity(const Bins & a, const Bins & b) {
    std::map<Toks, std::array<int64_t, 2>> m;
    for (auto & [k, c] : a) m[k][0] += c;
    for (auto & [k, c] : b) m[k][1] += c;
    std::vector<std::array<int64_t, 2>> cells;
    for (auto & [k, c] : m) cells.push_back(c);
    return chi_square_two_sample(cells);
}

ChiSquare gof_first(const Sample & s, const std::map<token_id, double> & p) {
    Bins b = bins(s, 0);
    std::vector<int64_t> obs;
    std::vector<double>  pi;
    for (auto [id, pr] : p) {
        auto it = b.find(Toks{id});
        obs.push_back(it == b.end() ? 0 : it->second);
        pi.push_back(pr);
        if (it != b.end()) b.erase(it);
    }
    int64_t outside = 0;
    for (auto & [k, c] : b) outside += c;
    obs.push_back(outside);
    pi.push_back(0.0);
    return chi_square_gof(obs, pi);
}

class SuffixDistribution : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        EngineParams p = engine_params("stories260K-F32.gguf");
        p.n_tree_max          = 4;
        p.suffix_cache_max_mb = 0;  // the request's own tokens only: every run drafts alike
        auto e = Engine::create(p);
        ASSERT_TRUE(e.is_ok());
        engine_ = e.value().release();
        prompt_ = engine_->tokenize("the cat sat on the mat. the cat sat on the mat. the dog sat on the mat. the cat sat on the",
                                    true, false).value();
        sp_.temperature = 1.0f;
        sp_.top_k = 8;
        sp_.top_p = 1.0f;
        sp_.min_p = 0.0f;
        SpecParams plain;
        plain.verifier = SpecVerifier::TOKENWISE;
        plain_ = new Sample(run_many(*engine_, prompt_, sp_, plain, 1000000));
        CompletionRequest r;
        r.prompt = prompt_;
        r.n_predict = 1;
        r.sampling = sp_;
        r.sampling.n_probs = engine_->info().n_vocab;
        r.sampling.post_sampling_probs = true;
        auto res = engine_->complete(r);
        ASSERT_TRUE(res.is_ok());
        for (const auto & tp : res.value().tokens[0].top) p1_[tp.id] = tp.prob;
    }
    static void TearDownTestSuite() {
        delete plain_;
        delete engine_;
    }

    // The smallest p-value of the checks against plain decoding.
    static double min_p(const char * name, const Sample & s) {
        double mp = 1.0;
        auto note = [&](const std::string & what, const ChiSquare & c) {
            std::printf("  %-22s %-20s X2 %8.1f dof %3d p %.3g\n", name, what.c_str(), c.statistic, c.dof, c.p_value);
            mp = std::min(mp, c.p_value);
        };
        note("token1 vs p", gof_first(s, p1_));
        for (int i = 0; i < kPos; ++i) note("token" + std::to_string(i + 1) + " vs plain", homogeneity(bins(s, i), bins(*plain_, i)));
        note("joint(1,2) vs plain", homogeneity(bins(s, 0, 2), bins(*plain_, 0, 2)));
        std::printf("  %-22s drafted %lld accepted %lld in %lld rounds\n", name, (long long)s.draft_n,
                    (long long)s.accepted, (long long)s.steps);
        return mp;
    }
    static SpecParams spec() {
        SpecParams sp = suffix_spec(3, 5);
        sp.verifier   = SpecVerifier::TOKENWISE;
        return sp;
    }

    static Engine *                   engine_;
    static Toks                       prompt_;
    static SamplingParams             sp_;
    static Sample *                   plain_;
    static std::map<token_id, double> p1_;
};
Engine *                   SuffixDistribution::engine_ = nullptr;
Toks                       SuffixDistribution::prompt_;
SamplingParams             SuffixDistribution::sp_;
Sample *                   SuffixDistribution::plain_ = nullptr;
std::map<token_id, double> SuffixDistribution::p1_;

}  // namespace

TEST_F(SuffixDistribution, TreesAreLossless) {
    ASSERT_NE(engine_, nullptr);
    Sample s = run_many(*engine_, prompt_, sp_, spec(), 8000000);
    EXPECT_GT(min_p("suffix tree", s), kPPass);
    EXPECT_GT(s.steps, kRuns / 2) << "suffix drafting did not draft";
    EXPECT_LT(s.accepted, s.draft_n * 8 / 10) << "too few rejections to test the residual path";
}

TEST_F(SuffixDistribution, PowerFrequenciesClaimedAsQAreRejected) {
    if (kAsan) GTEST_SKIP() << "power needs the full sample";
    ASSERT_NE(engine_, nullptr);
    test_hooks::suffix_claims_q.store(true);
    Sample s = run_many(*engine_, prompt_, sp_, spec(), 8000000);
    test_hooks::suffix_claims_q.store(false);
    EXPECT_LT(min_p("suffix claims q (broken)", s), kPFail);
}
