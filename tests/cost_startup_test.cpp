// Start-up cost measurement: the on-disk cost cache (round trip; corrupt, truncated and stale
// files ignored), the online estimate recovering from a probe poisoned by a burst of load, the
// first-use guess, and a fresh engine timing nothing (its first token decoded plain).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/context.h"
#include "engine/cost_tracker.h"
#include "engine/cost_cache.h"
#include "engine/test_hooks.h"
#include "speculative/cost_estimator.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;
namespace fs = std::filesystem;

namespace {

CostRecord sample_record() {
    CostRecord r;
    r.cost.v        = {0.0, 1.0, 1.61, 2.24, 2.31, 2.70, 2.95, 3.2, 3.56};
    r.cost.c        = 0.043;
    r.t1_ms         = 2.9;
    r.draft_threads = 1;
    return r;
}

// Runs one request and returns its result with what the engine logged meanwhile.
std::pair<Result<CompletionResult>, std::string> complete_logged(Engine & e, const CompletionRequest & req) {
    testing::internal::CaptureStderr();
    auto r = e.complete(req);
    return {std::move(r), testing::internal::GetCapturedStderr()};
}

// Cost files (costs-*) in dir; 0 when dir does not exist.
int count_cost_files(const std::string & dir) {
    int n_files = 0;
    if (fs::exists(dir))
        for (const auto & f : fs::directory_iterator(dir)) n_files += f.path().filename().string().rfind("costs-", 0) == 0;
    return n_files;
}

// Rewrites the lines of every cost file in dir that start with `prefix` as edit(line) makes them, as
// an earlier process would have written them; returns how many lines it rewrote.
template <class Edit>
int rewrite_cached_lines(const std::string & dir, const std::string & prefix, Edit edit) {
    int n_lines = 0;
    for (const auto & f : fs::directory_iterator(dir)) {
        std::ifstream in(f.path());
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), out, line;
        std::istringstream lines(text);
        while (std::getline(lines, line)) {
            if (line.rfind(prefix, 0) == 0) {
                line = edit(line);
                ++n_lines;
            }
            out += line + "\n";
        }
        std::ofstream(f.path(), std::ios::trunc) << out;
    }
    return n_lines;
}

// The v line as v(n) = curve(n) for n >= 1 (v[0] kept).
template <class Curve>
int rewrite_cached_curves(const std::string & dir, Curve curve) {
    return rewrite_cached_lines(dir, "v ", [&](const std::string & line) {
        std::istringstream fields(line.substr(2));
        size_t n = 0;
        double v0 = 0;
        fields >> n >> v0;
        std::ostringstream v;
        v.precision(17);
        v << "v " << n << ' ' << v0;
        for (size_t k = 1; k < n; ++k) v << ' ' << curve(k);
        return v.str();
    });
}

// The draft cost (the c line).
int rewrite_cached_c(const std::string & dir, double c) {
    return rewrite_cached_lines(dir, "c ", [&](const std::string &) { return "c " + std::to_string(c); });
}

// A first process: runs `type` of speculation on a stories260K engine (with `draft` as its
// draft model, if any) with its costs cached in dir; returns the request.
CompletionRequest measure_into(const std::string & dir, SpecType type, const std::string & draft, const std::string & prompt) {
    ::setenv("SPECRPC_CACHE_DIR", dir.c_str(), 1);
    CostMemo::process().clear();
    auto e = make_engine("stories260K-F32.gguf", draft, 1, 256);
    EXPECT_NE(e, nullptr);
    CompletionRequest req = greedy_request(*e, prompt, 96);
    req.spec.types = {type};
    EXPECT_TRUE(e->complete(req).is_ok());
    return req;
}

TEST(CostCache, RoundTrip) {
    const std::string dir = fresh_dir("cost-rt");
    const CostRecord  r   = sample_record();
    ASSERT_TRUE(cost_cache_save(dir, "key one\nline two", r).is_ok());
    auto got = cost_cache_load(dir, "key one\nline two");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->cost.v, r.cost.v);  // bit-exact (%.17g)
    EXPECT_EQ(got->cost.c, r.cost.c);
    EXPECT_EQ(got->t1_ms, r.t1_ms);
    EXPECT_EQ(got->draft_threads, 1);
    EXPECT_FALSE(cost_cache_load(dir, "another key").has_value());
    fs::remove_all(dir);
}

TEST(CostCache, DisabledAndMissingAreMisses) {
    EXPECT_FALSE(cost_cache_load("", "k").has_value());
    EXPECT_TRUE(cost_cache_save("", "k", sample_record()).is_ok());  // disabled: nothing written
    EXPECT_FALSE(cost_cache_load(fresh_dir("cost-missing"), "k").has_value());
    ::setenv("SPECRPC_CACHE_DIR", "off", 1);
    EXPECT_EQ(cost_cache_dir(), "");
    ::setenv("SPECRPC_CACHE_DIR", "/x/y", 1);
    EXPECT_EQ(cost_cache_dir(), "/x/y");
    ::unsetenv("SPECRPC_CACHE_DIR");
}

// A file of the same name but written for another key (another model file, mtime, thread
// count, CPU or llama.cpp build) is stale and ignored.
TEST(CostCache, StaleKeyIgnored) {
    const std::string dir = fresh_dir("cost-stale");
    ASSERT_TRUE(cost_cache_save(dir, "old key", sample_record()).is_ok());
    fs::rename(cost_cache_path(dir, "old key"), cost_cache_path(dir, "new key"));
    EXPECT_FALSE(cost_cache_load(dir, "new key").has_value());
    fs::remove_all(dir);
}

TEST(CostCache, CorruptFilesIgnored) {
    const std::string dir = fresh_dir("cost-corrupt");
    const std::string key = "k";
    ASSERT_TRUE(cost_cache_save(dir, key, sample_record()).is_ok());
    const std::string path = cost_cache_path(dir, key);
    std::string good;
    {
        std::ifstream f(path);
        good.assign(std::istreambuf_iterator<char>(f), {});
    }
    auto write = [&](const std::string & s) { std::ofstream(path, std::ios::trunc) << s; };
    auto replace = [&](const std::string & from, const std::string & to) {
        std::string s = good;
        s.replace(s.find(from), from.size(), to);
        return s;
    };
    ASSERT_TRUE(cost_cache_load(dir, key).has_value());
    const std::vector<std::pair<const char *, std::string>> bad = {
        {"empty", ""},
        {"truncated", good.substr(0, good.size() / 2)},
        {"no end", replace("end\n", "")},
        {"binary", std::string("\x00\xff\x13garbage", 10)},
        {"bad magic", replace("specrpc-costs 1", "specrpc-costs 9")},
        {"v(1) != 1", replace("v 9 0 1 ", "v 9 0 2 ")},
        {"v(n) > n", replace(" 1.61", " 7")},
        {"nan", replace(" 1.61", " nan")},
        {"negative t1", replace("t1 2.", "t1 -2.")},
        {"short v", replace("v 9 ", "v 12 ")},
        {"unknown field", replace("end\n", "bogus 1\nend\n")},
    };
    for (const auto & [what, text] : bad) {
        write(text);
        EXPECT_FALSE(cost_cache_load(dir, key).has_value()) << what;
    }
    write(good);
    EXPECT_TRUE(cost_cache_load(dir, key).has_value());
    fs::remove_all(dir);
}

// A curve read under a burst of load is made physically plausible: v(n) ≤ n, v(1) = 1, v
// non-decreasing, gaps interpolated.
TEST(CostEstimator, PlausibleCurve) {
    CostModel cm{{0.0, 3.0, 206.0, 0.0, 2.5, 207.0, 4.0}, 0.0, 0.0};
    cost_make_plausible(cm);
    EXPECT_EQ(cm.v[1], 1.0);
    for (size_t n = 2; n < cm.v.size(); ++n) {
        EXPECT_LE(cm.v[n], double(n)) << n;
        EXPECT_GE(cm.v[n], cm.v[n - 1]) << n;
    }
    EXPECT_LE(cm.v[2], 2.5);  // capped by the longer v(4) (noise only adds time)
    EXPECT_EQ(cm.v[6], 4.0);
}

// The poisoned probe of issue 17 (t(1) = 7.59 ms, v(8) = 206, v(16) = 207, read while another
// process was busy): the estimate converges to what steady passes show instead of staying within
// a band around the probe for the engine's lifetime. Plain passes refresh t(1); probes after plain
// rounds (not steady) show that drafting is cheap; then speculative rounds run steady passes.
TEST(CostEstimator, PoisonedProbeRecovers) {
    const std::vector<double> truth = {0, 1.0, 1.6, 2.0, 2.3, 2.6, 2.9, 3.1, 3.3, 3.5, 3.7, 3.9, 4.1, 4.3, 4.5, 4.7, 4.9, 5.1};
    const double              t1    = 2.9;
    CostModel poisoned{std::vector<double>(18, 0.0), 0.02, 0.0};
    poisoned.v[1] = 1;
    for (size_t n = 2; n < 18; ++n) poisoned.v[n] = n < 8 ? 150.0 + n : 206.0 + n / 16.0;
    CostEstimator est;
    est.seed(poisoned, 7.59);
    std::mt19937_64 rng(3);
    std::lognormal_distribution<double> noise(0.0, 0.05);
    // off: plain passes, a probe of 9 every 16 of them (the first pass of its size: +10%)
    for (int r = 0; r < 6 * 17; ++r) {
        if (r % 17 == 16) est.observe_pass(9, truth[9] * t1 * 1.1 * noise(rng), false);
        else est.observe_pass(1, t1 * noise(rng), true);
    }
    EXPECT_NEAR(est.t1(), t1, 0.15);
    EXPECT_NEAR(est.model().v[9], truth[9] * 1.1, 0.4);  // the probes' evidence, a little slow
    // on: steady passes of 9 and now and then of 17, for a while
    for (int r = 0; r < 200; ++r) {
        const int n = r % 8 == 7 ? 17 : 9;
        est.observe_pass(n, truth[n] * t1 * noise(rng), true);
    }
    EXPECT_NEAR(est.model().v[9], truth[9], 0.1 * truth[9]);
    EXPECT_NEAR(est.model().v[17], truth[17], 0.1 * truth[17]);
    for (size_t n = 2; n < 18; ++n) EXPECT_LE(est.model().v[n], double(n));
    EXPECT_LT(est.model().v[8], 8.0);  // interpolated below 9, not left at the probe's cap
}

// The reverse: a probe that read t(1) slow (a burst during its 1-token passes) makes every pass
// look cheap; steady multi-token passes bound t(1) from above (t(n) ≥ t(1)) while no plain pass runs.
TEST(CostEstimator, SlowT1BoundedBySteadyPasses) {
    CostModel prior{{0.0, 1.0, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9}, 0.01, 0.0};
    CostEstimator est;
    est.seed(prior, 20.0);  // true t(1) = 2.9 ms
    for (int r = 0; r < 30; ++r) est.observe_pass(9, 3.5 * 2.9, true);
    EXPECT_LE(est.t1(), 3.5 * 2.9);
    EXPECT_NEAR(est.model().v[9], 1.0, 1e-9);  // 9 tokens for one t(1): at the physical bound
}

// No bound from below: a pass over 2 tokens may cost more than two 1-token passes (on this
// machine x100M Q8_0 takes 2.4-2.5x: llama.cpp runs a gemv for one token and llamafile's tinyBLAS
// gemm from two). Taken as t(1) ≥ t(2)/2, it raised t(1) by a quarter, every v(n) fell by a fifth,
// and a mismatched draft model was predicted to pay 1.05-1.3x in rounds that ran at ~0.7x.
TEST(CostEstimator, DearTwoTokenPassDoesNotRaiseT1) {
    CostModel prior = cost_guess_curve(17, 0.0);
    CostEstimator est;
    est.seed(prior, 4.6, true);
    for (int r = 0; r < 20; ++r) est.observe_pass(1, 4.6, true);
    for (int r = 0; r < 10; ++r) {
        est.observe_pass(2, 11.3, true);
        est.observe_pass(2, 11.3, true);
        est.observe_pass(4, 13.5, false);
        est.observe_pass(4, 13.5, true);
    }
    EXPECT_NEAR(est.t1(), 4.6, 1e-9);
    EXPECT_NEAR(est.model().v[4], 13.5 / 4.6, 0.01);
    EXPECT_EQ(est.model().v[2], 2.0);  // clamped to n: from v(2) = 2 on, one drafted token never pays either way
}

// Drafted tokens refine c; a wrong prior c is replaced once kPriorTrust drafts are seen.
TEST(CostEstimator, DraftCostReplacesThePrior) {
    CostModel prior{{0.0, 1.0, 1.5, 2.0}, 0.001, 0.0};
    CostEstimator est;
    est.seed(prior, 3.0);
    for (int i = 0; i < 3; ++i) est.observe_draft(0.12);
    EXPECT_NEAR(est.model().c, 0.04, 1e-9);
}

// A fresh engine with no cache times nothing: its first rounds decode plain (the first token as
// fast as without speculation, and t(1) read from the next few), then the guessed curve is used and
// refined; the refined costs are written to the cache, and a second engine of the same
// configuration starts from them (and still decodes its first round plain).
TEST(CostStartup, FreshEngineTimesNothing) {
    const std::string dir = fresh_dir("cost-engine");
    ::setenv("SPECRPC_CACHE_DIR", dir.c_str(), 1);
    const int64_t before = scratch_pass_count();
    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 1, 256);
    ASSERT_NE(e, nullptr);
    CompletionRequest req = greedy_request(*e, "Once upon a time", 96);
    req.spec.types = {SpecType::DRAFT};
    auto [r, log] = complete_logged(*e, req);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(scratch_pass_count(), before) << "passes timed for the cost curve";
    EXPECT_NE(log.find("cost curve guessed"), std::string::npos) << log;
    ASSERT_FALSE(r.value().tokens.empty());
    EXPECT_EQ(r.value().tokens.front().source, 0) << "the first token of a fresh engine comes from a plain round";
    EXPECT_FALSE(e->cost_curve().v.empty());
    EXPECT_EQ(count_cost_files(dir), 1) << "the refined costs are cached";
    e.reset();

    auto e2 = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 1, 256);
    ASSERT_NE(e2, nullptr);
    auto [r2, log2] = complete_logged(*e2, req);
    ASSERT_TRUE(r2.is_ok());
    EXPECT_EQ(scratch_pass_count(), before);
    EXPECT_NE(log2.find("cost curve (cached"), std::string::npos) << log2;
    EXPECT_EQ(r2.value().tokens.front().source, 0) << "a fresh engine's first token comes from a plain round, cached costs or not";
    auto r3 = e2->complete(req);  // the engine's later requests speculate from their first round
    ASSERT_TRUE(r3.is_ok());
    EXPECT_EQ(output_ids(r3.value()), output_ids(r2.value()));
    EXPECT_EQ(output_ids(r3.value()), output_ids(r.value()));
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

// A copy drafts long, so a request runs few passes: one `specrpc generate` of 128 tokens by
// prompt lookup ran 16 passes, 6 of them observations of the curve, and a guessed curve was only
// saved after 16 observations. Every such process guessed again, 10 of its 16 rounds plain while
// t(1) was read (after the prompt and again at depth). The guess is now saved once t(1) has been
// read at depth, and the next process starts from it.
TEST(CostStartup, ACopyDraftedLongStillCachesTheGuess) {
    const std::string dir = fresh_dir("cost-copy");
    ::setenv("SPECRPC_CACHE_DIR", dir.c_str(), 1);
    CostMemo::process().clear();
    const char * passage =
        "Ben had a blue car. He liked to drive it to the park. One day, the car stopped. Ben was sad. His dad "
        "came and fixed the car. Ben was happy again and drove all day.\n\nBen had a blue car. He liked to";
    auto run = [&]() -> std::pair<SpecRequestStats, std::string> {
        auto e = make_engine("stories260K-copy-F32.gguf", "", 1, 512);
        if (!e) return {SpecRequestStats{}, "no engine"};
        CompletionRequest req   = greedy_request(*e, passage, 128);
        req.sampling.ignore_eos = true;
        req.spec.types          = {SpecType::LOOKUP};
        auto [r, log] = complete_logged(*e, req);
        CostMemo::process().clear();  // what the next process knows: the files
        if (!r) return {SpecRequestStats{}, r.status().to_string()};
        return {r.value().spec, log};
    };
    const auto [first, log1] = run();
    EXPECT_NE(log1.find("cost curve guessed"), std::string::npos) << log1;
    EXPECT_NE(log1.find("t(1) at depth"), std::string::npos) << log1;
    EXPECT_LT(first.n_steps, 40) << "a copy: few passes";
    EXPECT_EQ(count_cost_files(dir), 1) << "the guess, with t(1) read at depth, is cached";
    const auto [second, log2] = run();
    EXPECT_NE(log2.find("cost curve (cached"), std::string::npos) << log2;
    ASSERT_FALSE(first.gamma_hist.empty()) << log1;
    ASSERT_FALSE(second.gamma_hist.empty()) << log2;
    EXPECT_GE(first.gamma_hist[0], 6) << "plain rounds while t(1) is read";
    EXPECT_LE(second.gamma_hist[0], 2) << "the next process holds only its first round";
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

// The guessed curve is a shape: one size measured rescales the sizes not yet seen (v(n) − 1 =
// k·(n − 1)^a with k through it), so a machine whose passes batch better or worse than the guess
// is found from the lengths the policy tries first. A measured prior (cache, probe) keeps its own
// values instead.
TEST(CostEstimator, GuessIsRescaledByTheSizesMeasured) {
    const CostModel guess = cost_guess_curve(17, 0.01);
    EXPECT_NEAR(guess.v[16], 1.0 + kCostGuessScale * std::pow(15.0, kCostGuessExponent), 1e-9);
    EXPECT_NEAR(guess.v[2], 1.0 + kCostGuessScale, 1e-9);
    EXPECT_NEAR(guess.c, 0.042, 1e-9);
    EXPECT_EQ(cost_guess_curve(17, 0.0).c, 0.0) << "no draft model";
    CostEstimator g, m;
    g.seed(guess, 4.0, true);
    m.seed(guess, 4.0, false);
    for (int i = 0; i < 5; ++i) {  // passes of 9 tokens cost 3 of one: k = 2 / 8^a on this machine
        g.observe_pass(9, 12.0, true);
        m.observe_pass(9, 12.0, true);
    }
    EXPECT_NEAR(g.model().v[9], 3.0, 1e-9);
    EXPECT_NEAR(m.model().v[9], 3.0, 1e-9);
    EXPECT_NEAR(g.model().v[16], 1.0 + 2.0 * std::pow(15.0 / 8.0, kCostGuessExponent), 1e-6) << "rescaled from v(9)";
    EXPECT_NEAR(g.model().v[4], 1.0 + 2.0 * std::pow(3.0 / 8.0, kCostGuessExponent), 1e-6);
    EXPECT_NEAR(m.model().v[16], guess.v[16], 1e-9) << "a measured prior is not rescaled";
    // t(1) read again behind a longer context: the ratios follow from the same samples
    g.set_t1(6.0);
    EXPECT_NEAR(g.model().v[9], 2.0, 1e-9);
    EXPECT_NEAR(g.t1(), 6.0, 1e-9);
}

// What does not rescale a guessed curve: a size read only by first passes after another size
// (lookup's drafts vary in length, so most of its passes are such), a short size (v(2) read 10%
// high moved v(16) by a third), and a size read at its physical cap under load. Extrapolated from
// any of these, 0.4.1 priced every length near n (v(16) 10-16 on a machine measuring 5.6), kept
// speculation off and cached that curve for the next process.
TEST(CostEstimator, GuessKeepsItsShapeAgainstNoisySizes) {
    const CostModel guess = cost_guess_curve(17, 0.0);
    CostEstimator g;
    g.seed(guess, 4.0, true);
    for (int i = 0; i < 5; ++i) g.observe_pass(3, 3 * 4.0, false);  // first passes of size 3, at the cap
    EXPECT_NEAR(g.model().v[3], g.model().v[4], 1e-9) << "a size keeps its own passes' reading (capped by longer ones)";
    EXPECT_NEAR(g.model().v[16], guess.v[16], 1e-6) << "first passes of a size do not reshape the curve";
    for (int i = 0; i < 5; ++i) g.observe_pass(2, 2 * 4.0, true);  // v(2) = 2: short, and at the cap
    EXPECT_NEAR(g.model().v[16], guess.v[16], 1e-6) << "v(2) does not reshape the curve";
    for (int i = 0; i < 5; ++i) g.observe_pass(6, 6 * 4.0, true);  // read under load: at the cap
    EXPECT_NEAR(g.model().v[16], guess.v[16], 1e-6) << "a size at its cap does not reshape the curve";
    EXPECT_TRUE(cost_curve_measured(g.model()));
    for (int i = 0; i < 5; ++i) g.observe_pass(8, 3.6 * 4.0, true);  // steady passes of 8: the shape
    EXPECT_NEAR(g.model().v[16], 1.0 + 2.6 * std::pow(15.0 / 7.0, kCostGuessExponent), 1e-6);
}

// A size read dear in a slow period keeps speculation off, so no pass of it runs again: within a
// process, a size priced above the guess and not sampled for kStaleAfter observations goes back to
// the guess; what is then measured replaces it. A size priced below the guess is kept.
TEST(CostEstimator, StaleDearSizeGoesBackToTheGuess) {
    const double t1 = 5.0;
    CostEstimator e;
    e.seed(cost_guess_curve(17, 0.0), t1, true);
    for (int i = 0; i < 5; ++i) e.observe_pass(8, 7.0 * t1, true);  // read beside a busy process
    ASSERT_GT(e.model().v[8], 6.5);
    // plain rounds: one observation each
    for (int64_t i = 0; i < CostEstimator::kStaleAfter - 1; ++i) e.observe_pass(1, t1, true);
    EXPECT_GT(e.model().v[8], 6.5) << "not stale yet";
    e.observe_pass(1, t1, true);
    EXPECT_LE(e.model().v[8], cost_guess_v(8) + 1e-9) << "stale: back to the guess";
    EXPECT_LE(e.model().v[16], cost_guess_v(16) + 1e-9);
    for (int i = 0; i < 4; ++i) e.observe_pass(8, 5.5 * t1, true);  // measured again
    EXPECT_NEAR(e.model().v[8], 5.5, 1e-9) << "the new reading replaces the guess";

    CostModel cached{{0.0, 1.0, 1.6, 2.0, 2.3, 2.6, 2.9, 3.2, 3.6}, 0.0, 0.0};  // below the guess
    CostEstimator c;
    c.seed(cached, t1);
    for (int64_t i = 0; i < 2 * CostEstimator::kStaleAfter; ++i) c.observe_pass(1, t1, true);
    EXPECT_NEAR(c.model().v[8], 3.6, 1e-9) << "a size cheaper than the guess is kept";
}

// A curve at v(n) = n everywhere is not cached, and such a record (written by 0.4.1) is not used:
// the engine guesses again and speculates, where it used to keep speculation off for good.
TEST(CostStartup, LinearCachedCurveIsGuessedAgain) {
    CostModel linear{{0.0, 1.0, 2.0, 3.0, 4.0}, 0.0, 0.0};
    EXPECT_FALSE(cost_curve_measured(linear));
    EXPECT_TRUE(cost_curve_measured(cost_guess_curve(17, 0.0)));
    const std::string dir = fresh_dir("cost-linear");
    const CompletionRequest req = measure_into(dir, SpecType::DRAFT, "stories260K-Q8_0.gguf", "Once upon a time");
    // every cached curve rewritten as v(n) = n, as a process under load wrote it
    ASSERT_GE(rewrite_cached_curves(dir, [](size_t n) { return double(n); }), 1);
    CostMemo::process().clear();  // a new process
    auto e2 = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 1, 256);
    ASSERT_NE(e2, nullptr);
    auto [r2, log] = complete_logged(*e2, req);
    ASSERT_TRUE(r2.is_ok());
    EXPECT_NE(log.find("guessed again"), std::string::npos) << log;
    EXPECT_NE(log.find("cost curve guessed"), std::string::npos) << log;
    EXPECT_GT(r2.value().spec.draft_n, 0) << "speculation runs";
    const CostCurve now = e2->cost_curve();
    ASSERT_FALSE(now.v.empty());
    EXPECT_TRUE(cost_curve_measured(CostModel{now.v, now.c, 0.0})) << "the guess, refined, prices passes below n";
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

TEST(CostEstimator, ClampToGuessLowersOnlySizesAboveIt) {
    CostModel cm{{0.0, 1.0, 1.5, 2.9, 2.6, 4.5, 3.5}, 0.05, 0.0};  // above the guess at 3 and 5
    const CostModel before = cm;
    EXPECT_EQ(cost_clamp_to_guess(cm), 2);
    EXPECT_DOUBLE_EQ(cm.v[3], cost_guess_v(3));
    EXPECT_DOUBLE_EQ(cm.v[5], cost_guess_v(5));
    for (size_t n : {0, 1, 2, 4, 6}) EXPECT_EQ(cm.v[n], before.v[n]) << n;
    EXPECT_EQ(cm.c, before.c);
    CostModel g = cost_guess_curve(17, 0.0);
    EXPECT_EQ(cost_clamp_to_guess(g), 0) << "the guess is not above itself";
}

TEST(CostEstimator, ClampDraftCostOnlyFarAboveTheGuess) {
    const double ratio = 0.146;  // copy-F32 beside the copy target
    const double g     = cost_guess_c(ratio);
    EXPECT_NEAR(g, 1.2 * ratio + 0.03, 1e-12);
    CostModel cm{{0.0, 1.0, 1.9}, 2.9 * g, 0.0};
    EXPECT_FALSE(cost_clamp_draft_to_guess(cm, ratio)) << "within the spread measured c has";
    EXPECT_DOUBLE_EQ(cm.c, 2.9 * g);
    cm.c = 3.1 * g;
    EXPECT_TRUE(cost_clamp_draft_to_guess(cm, ratio));
    EXPECT_DOUBLE_EQ(cm.c, g);
    cm.c = 0.01;
    EXPECT_FALSE(cost_clamp_draft_to_guess(cm, ratio)) << "a cheap draft is never raised";
    EXPECT_DOUBLE_EQ(cm.c, 0.01);
    cm.c = 5.0;
    EXPECT_FALSE(cost_clamp_draft_to_guess(cm, 0.0)) << "no draft model, no guess to compare with";
    EXPECT_DOUBLE_EQ(cm.c, 5.0);
}

// A draft cost read under load (or a profiler) and cached kept the draft model off in every later
// process: a draft that never drafts never measures c again. A cached c far above the first-use
// guess now starts from the guess; the draft runs, and its tokens measure c again.
TEST(CostStartup, DearCachedDraftCostIsCheckedAgain) {
    const std::string dir = fresh_dir("cost-dear-draft");
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
    const CompletionRequest req = measure_into(dir, SpecType::DRAFT, "stories260K-Q8_0.gguf", prompt);
    ASSERT_GE(rewrite_cached_c(dir, 20.0), 1);  // a draft token priced at 20 target passes
    CostMemo::process().clear();  // a new process
    auto e2 = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 1, 256);
    ASSERT_NE(e2, nullptr);
    auto [r2, log] = complete_logged(*e2, req);
    ASSERT_TRUE(r2.is_ok());
    EXPECT_NE(log.find("cached draft cost"), std::string::npos) << log;
    EXPECT_GT(r2.value().spec.draft_n, 0) << "the draft runs\n" << log;
    // measured again: not the cached 20 (a measured ratio is never exactly that). Not "below
    // some bound": the tiny pair's c is a ratio of sub-millisecond passes, which a busy neighbour
    // (ctest -j2) read at 4.9 once, and timed thresholds belong in bench/
    EXPECT_NE(e2->cost_curve().c, 20.0) << "c measured again, not the cached 20";
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

// A curve read in a slow period and cached kept speculation off in every later process: no
// long pass ran to correct it. Sizes priced above the first-use guess now start from the guess;
// speculation runs, and its passes measure the curve again.
TEST(CostStartup, PessimisticCachedCurveIsCheckedAgain) {
    const std::string dir = fresh_dir("cost-pessimistic");
    // prompt lookup (no draft model: only v decides) on a story that repeats itself
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside. "
                               "Once upon a time, there was a little girl named Lily. She loved to";
    const CompletionRequest req = measure_into(dir, SpecType::LOOKUP, "", prompt);
    // v(n) = 0.97 n: below the physical cap (a measurement), yet even a draft always accepted
    // would be predicted at 1/0.97 = 1.03x, below the 1.05x speculation needs
    ASSERT_GE(rewrite_cached_curves(dir, [](size_t n) { return n == 1 ? 1.0 : 0.97 * double(n); }), 1);
    CostMemo::process().clear();  // a new process
    auto e2 = make_engine("stories260K-F32.gguf", "", 1, 256);
    ASSERT_NE(e2, nullptr);
    auto [r2, log] = complete_logged(*e2, req);
    ASSERT_TRUE(r2.is_ok());
    EXPECT_NE(log.find("above the first-use guess"), std::string::npos) << log;
    EXPECT_GT(r2.value().spec.draft_n, 0) << "speculation runs\n" << log;
    const CostCurve now = e2->cost_curve();
    ASSERT_GT(now.v.size(), 8u);
    EXPECT_LT(now.v[8], 0.97 * 8 - 0.5) << "the curve in use is no longer the cached one";
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

// The probe times its passes behind a context of realistic length (128 cells: the slot's own and
// scratch cells removed again), not right after the prompt, where v(n) reads steeper than in use
// and the policy drafted short; and it stays a small constant number of passes.
TEST(CostStartup, ProbeTimesBehindARealisticContext) {
    const std::string dir = fresh_dir("cost-depth");
    ::setenv("SPECRPC_CACHE_DIR", dir.c_str(), 1);
    test_hooks::force_cost_probe = true;  // the fallback when no single slot's plain passes come
    // one slot, chains only (a key of its own: no earlier test in this process measured it)
    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf", 1, 256, 1);
    ASSERT_NE(e, nullptr);
    CompletionRequest req = greedy_request(*e, "Once upon a time", 48);
    req.spec.types = {SpecType::DRAFT};
    const int64_t before = scratch_pass_count();
    auto [r, log] = complete_logged(*e, req);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NE(log.find(" at depth 128 "), std::string::npos) << log;
    EXPECT_LE(scratch_pass_count() - before, 60) << "target and draft passes of the probe";
    CompletionRequest plain = req;
    plain.spec.types.clear();
    auto p = e->complete(plain);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(output_ids(r.value()), output_ids(p.value())) << "the probe's scratch cells are gone";
    test_hooks::force_cost_probe = false;
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}

// Flash attention "auto" is a rule on the model (it changes the logits, so a timing race changed a
// seeded text across restarts): off for head size 8, on for 64, and nothing is timed to choose.
TEST(CostStartup, FlashAttentionAutoIsARule) {
    const int64_t before = scratch_pass_count();
    auto small = make_engine("stories260K-F32.gguf");
    auto big   = make_engine("stories260K-x100M-near-Q8_0.gguf", "", 1, 256);
    ASSERT_NE(small, nullptr);
    ASSERT_NE(big, nullptr);
    EXPECT_FALSE(small->info().flash_attn);
    EXPECT_TRUE(big->info().flash_attn);
    EXPECT_EQ(scratch_pass_count(), before);
}

}  // namespace

// A size that goes back to the guess and is then measured dear again was no stray reading: where
// passes really cost more than the guess, each return to it priced a mostly-off draft at 1.1x for
// the rounds it took to learn again that it ran at ~0.85x. Its next return waits twice as long;
// one measured at the guess or below restarts the period.
TEST(CostEstimator, DearSizeMeasuredAgainWaitsLongerBeforeTheGuess) {
    const double t1 = 5.0;
    CostEstimator e;
    e.seed(cost_guess_curve(17, 0.0), t1, true);
    for (int i = 0; i < 5; ++i) e.observe_pass(8, 5.5 * t1, true);
    EXPECT_EQ(e.stale_after(8), CostEstimator::kStaleAfter);
    for (int64_t i = 0; i < CostEstimator::kStaleAfter; ++i) e.observe_pass(1, t1, true);
    ASSERT_LE(e.model().v[8], cost_guess_v(8) + 1e-9) << "stale: back to the guess";
    for (int i = 0; i < 4; ++i) e.observe_pass(8, 5.5 * t1, true);  // dear again: confirmed
    EXPECT_NEAR(e.model().v[8], 5.5, 1e-9);
    EXPECT_EQ(e.stale_after(8), 2 * CostEstimator::kStaleAfter);
    for (int64_t i = 0; i < 2 * CostEstimator::kStaleAfter - 1; ++i) e.observe_pass(1, t1, true);
    EXPECT_NEAR(e.model().v[8], 5.5, 1e-9) << "kept for twice as long";
    e.observe_pass(1, t1, true);
    EXPECT_LE(e.model().v[8], cost_guess_v(8) + 1e-9);
    for (int i = 0; i < 4; ++i) e.observe_pass(8, 4.0 * t1, true);  // now at the guess or below
    EXPECT_EQ(e.stale_after(8), CostEstimator::kStaleAfter) << "a stray reading: the period restarts";
    // the back-off is bounded
    CostEstimator b;
    b.seed(cost_guess_curve(17, 0.0), t1, true);
    for (int round = 0; round < 8; ++round) {
        for (int i = 0; i < 4; ++i) b.observe_pass(8, 5.5 * t1, true);
        for (int64_t i = 0; i < b.stale_after(8); ++i) b.observe_pass(1, t1, true);
    }
    EXPECT_EQ(b.stale_after(8), CostEstimator::kStaleBackoffMax * CostEstimator::kStaleAfter);
}

// A drafter that is mostly off runs no two passes of a size in a row, so no steady size shapes
// a guessed curve; its first passes of the sizes it drafts then do, for the sizes below the
// longest of them (x100M with stories260K: v(4) 3.4 and v(6) 4.4 read, left at a guess of 2.7
// and 3.6, kept a losing draft on). Longer sizes keep the guess (extrapolated from first passes,
// the shape priced x100M-near's 16-token drafts off), but
// never below a shorter size measured: the lower envelope would otherwise pull the measurement
// down to the guess.
TEST(CostEstimator, FirstPassesShapeTheShortSizesWhenNoneIsSteady) {
    const double t1 = 5.0;
    const CostModel guess = cost_guess_curve(17, 0.0);
    CostEstimator g;
    g.seed(guess, t1, true);
    for (int i = 0; i < 3; ++i) g.observe_pass(4, 3.4 * t1, false);
    EXPECT_NEAR(g.model().v[4], 3.4, 1e-9) << "not lowered to the guess of a longer size";
    EXPECT_GE(g.model().v[5], 3.4);
    EXPECT_NEAR(g.model().v[3], 1.0 + 2.4 * std::pow(2.0 / 3.0, kCostGuessExponent), 1e-9) << "shaped by v(4)";
    for (int i = 0; i < 3; ++i) g.observe_pass(6, 4.4 * t1, false);
    EXPECT_NEAR(g.model().v[5], 1.0 + 3.4 * std::pow(4.0 / 5.0, kCostGuessExponent), 1e-9) << "the longer on a tie";
    EXPECT_NEAR(g.model().v[16], guess.v[16], 1e-9) << "not extrapolated past the longest size read";
    for (int i = 0; i < 3; ++i) g.observe_pass(8, 4.3 * t1, true);  // a steady size: the shape again
    for (int i = 0; i < 3; ++i) g.observe_pass(8, 4.3 * t1, true);
    EXPECT_NEAR(g.model().v[16], 1.0 + 3.3 * std::pow(15.0 / 7.0, kCostGuessExponent), 1e-9);
}

// A pass is priced against t(1) at its own depth. A 1-token pass of x100M grows from 6.8 ms
// shallow to ~10 ms past 256 cells (llama.cpp attends over 512 cells from 257 on), and the last
// plain passes of a request are its deepest: priced against them, every pass of the rounds before
// read 5-16% cheap and a mismatched draft's speed-up was over-predicted (docs/benchmarks.md,
// "t(1) by depth"). Here passes of 9 tokens cost 3 of one at every depth.
TEST(CostEstimator, PassesArePricedAgainstT1AtTheirDepth) {
    auto t1_of = [](int cells) { return cells > 256 ? 10.0 : 6.8 + 1.2 * cells / 256.0; };
    CostEstimator e;
    e.seed(cost_guess_curve(17, 0.0), 7.0, true);
    // one request: plain rounds from 20 to 300 cells, a run of passes of 9 tokens from 100 to 240
    for (int d = 20; d < 300; ++d) e.observe_pass(1, t1_of(d + 1), true, d);
    for (int d = 100; d < 240; d += 9) e.observe_pass(9, 3.0 * t1_of(d + 9), true, d);
    // within 2%: a bin spans 64 cells (0.3 ms here), and its median is its last plain passes
    EXPECT_NEAR(e.model().v[9], 3.0, 0.06) << "priced against the plain passes of its own depth";
    EXPECT_NEAR(e.t1_at_depth(60), t1_of(32), 0.2);
    EXPECT_NEAR(e.t1_at_depth(300), 10.0, 1e-9);
    EXPECT_NEAR(e.t1(), e.t1_at_depth(240 - 9 + 9), 1e-9) << "t(1) at the last pass's depth";
    e.observe_pass(1, 10.0, true, 280);
    EXPECT_NEAR(e.t1(), 10.0, 1e-9);
    EXPECT_NEAR(e.t1_at_depth(1000), 10.0, 1e-9) << "past the deepest bin read: the deepest";

    // a bin with no plain pass of its own takes the nearest on the same side of the 256-cell step
    CostEstimator h;
    h.seed(cost_guess_curve(17, 0.0), 7.0, true);
    for (int d = 20; d < 120; ++d) h.observe_pass(1, t1_of(d + 1), true, d);
    for (int d = 260; d < 300; ++d) h.observe_pass(1, t1_of(d + 1), true, d);
    EXPECT_NEAR(h.t1_at_depth(250), t1_of(120), 0.05) << "below the step, not the 10 ms just above it";
    EXPECT_NEAR(h.t1_at_depth(200), t1_of(120), 0.05);
    EXPECT_NEAR(h.t1_at_depth(400), 10.0, 1e-9);

    // set_t1 at a depth: that bin's t(1) until its own plain passes come
    CostEstimator f;
    f.seed(cost_guess_curve(17, 0.0), 6.8, true);
    f.set_t1(8.0, 200);
    EXPECT_NEAR(f.t1_at_depth(201), 8.0, 1e-9);
    for (int i = 0; i < CostEstimator::kT1Samples; ++i) f.observe_pass(1, 8.4, true, 200);
    EXPECT_NEAR(f.t1_at_depth(201), 8.4, 1e-9);
    for (int i = 0; i < 5; ++i) f.observe_pass(9, 3.0 * 8.4, true, 192);
    EXPECT_NEAR(f.model().v[9], 3.0, 1e-9);
}

// Which sizes are still the first-use guess's: all of a guessed curve until a size has
// kPriorTrust passes of its own (steady or not); none of a measured one.
TEST(CostEstimator, GuessedUntilASizeHasItsOwnPasses) {
    CostEstimator g, m;
    g.seed(cost_guess_curve(17, 0.01), 7.0, true);
    m.seed(cost_guess_curve(17, 0.01), 7.0, false);
    for (int n = 2; n <= 16; ++n) {
        EXPECT_TRUE(g.guessed(n)) << n;
        EXPECT_FALSE(m.guessed(n)) << n << ": a cached or probed curve is a measurement";
    }
    EXPECT_FALSE(g.guessed(1)) << "t(1) is read, never guessed";
    EXPECT_FALSE(g.guessed(0));
    EXPECT_FALSE(g.guessed(99)) << "past the curve";
    for (int i = 0; i < CostEstimator::kPriorTrust; ++i) {
        EXPECT_TRUE(g.guessed(4)) << i;
        g.observe_pass(4, 2.4 * 7.0, false);  // probes: first passes of their size
    }
    EXPECT_FALSE(g.guessed(4));
    EXPECT_TRUE(g.guessed(5)) << "shaped by v(4), but not measured";
    for (int i = 0; i < CostEstimator::kPriorTrust; ++i) g.observe_pass(8, 3.4 * 7.0, true);
    EXPECT_FALSE(g.guessed(8));

    // a measured curve's size gone back to the guess as stale is guessed again, the others not
    CostModel dear{{0.0, 1.0, 1.6, 2.0, 2.3, 2.6, 2.9, 3.2, 6.0}, 0.0, 0.0};  // v(8) above the guess
    CostEstimator s;
    s.seed(dear, 5.0);
    EXPECT_FALSE(s.guessed(8));
    for (int64_t i = 0; i < CostEstimator::kStaleAfter; ++i) s.observe_pass(1, 5.0, true);
    ASSERT_LE(s.model().v[8], cost_guess_v(8) + 1e-9) << "stale: back to the guess";
    EXPECT_TRUE(s.guessed(8));
    EXPECT_FALSE(s.guessed(4)) << "cached, below the guess: a measurement";
    EXPECT_FALSE(s.guessed(7));
}

// The first-use guess kept a paying drafter off for a whole process (copy_bench, the copy target
// with the mismatched stories260K draft, off 98% in some runs): the guess prices its passes dearer
// than they run (v(4) 2.90 and v(8) 4.32 against ~2.4 and ~3.4), so at its acceptance (~0.85) the
// policy judged it off; off, its probes went in shadow, which runs no pass of their size, and the
// guess was never measured. The engine verifies a probe while the size it would verify is still
// guessed (Engine::Impl::probe_in_shadow): a few passes of it, and the curve is this machine's.
// The policy and the estimator together, 20 seeds of 4 requests of 300 rounds, the books and the
// learned profile carried as the engine does (the first request's prior learned by an earlier
// process: no first look), t(1) 7 ms; a size's first pass after another reads 4% slow.
namespace {
struct Trapped {
    double speedup = 0, off = 0;  // tokens per unit of target work against plain; rounds off
    int    guessed = 0;           // seeds whose v(4) was still the guess's after the 4 requests
};
constexpr double kTrapAlpha = 0.85;
double trap_v(int n) { return 1.0 + 0.696 * std::pow(double(n - 1), 0.636); }  // v(4) 2.40, v(8) 3.40
// whole_run: the longer run a dip fades to starts from the earlier requests (prior_run,
// long_prior), as in the engine; without it, the probes are the only way back, as they were
// when the rule was made.
Trapped off_on_a_guess(bool verify_guessed, bool whole_run) {
    constexpr double t1 = 7.0, c = 0.05, o = 0.1;
    Trapped out;
    double  tokens = 0, work = 0;
    int64_t off = 0, rounds = 0;
    for (int seed = 0; seed < 20; ++seed) {
        std::mt19937_64                        rng{uint64_t(seed)};
        std::uniform_real_distribution<double> u(0, 1);
        CostEstimator est;
        est.seed(cost_guess_curve(17, 0.01), t1, true);
        DraftLengthOptions opts;
        opts.n_max       = 16;
        opts.alpha_prior = kTrapAlpha;
        if (!whole_run) opts.prior_run = 0;
        int last_n = 0, run = 0;
        auto pass = [&](int n) {  // as the CostTracker samples: steady after a run of one size
            run    = n == last_n ? run + 1 : 1;
            last_n = n;
            est.observe_pass(n, t1 * trap_v(n) * (run == 1 ? 1.04 : 1.0), run >= (n == 1 ? CostTracker::kSteadyPlainRun : 2));
        };
        auto priced = [&] { CostModel cm = est.model(); cm.o = o; return cm; };
        for (int req = 0; req < 4; ++req) {
            DraftLengthPolicy p(priced(), opts);
            for (int r = 0; r < 300; ++r, ++rounds) {
                p.set_cost_model(priced());
                const int g = p.next_gamma();
                off += p.last_decision().off;
                if (g == 0) { pass(1); tokens += 1; work += 1; continue; }
                int k = 0;
                while (k < g && u(rng) < kTrapAlpha) ++k;
                est.observe_draft(c * t1);
                // the engine's rule (probe_in_shadow): a probe of a guessed size is verified
                if (p.last_decision().probe && !(verify_guessed && est.guessed(g + 1)) && p.shadow_probe()) {
                    p.observe_shadow_probe(g, k);
                    pass(1);
                    tokens += 1;
                    work += 1 + g * c;
                    continue;
                }
                p.observe(g, k);
                pass(g + 1);
                tokens += k + 1;
                work += trap_v(g + 1) + g * c + o;
            }
            opts.probe_ledger = p.probe_ledger();
            opts.depth_prior  = p.next_depth_prior();
            if (whole_run) opts.long_prior = p.next_long_prior();
            opts.alpha_prior  = p.alpha();
        }
        out.guessed += est.guessed(4);
    }
    out.speedup = tokens / work;
    out.off     = double(off) / double(rounds);
    return out;
}
}  // namespace

// Power: with every probe in shadow (the engine before) the same runs keep the guess in 8 of 20
// seeds.
TEST(CostEstimator, ProbesOfAGuessedSizeAreVerifiedSoAnOffDrafterIsMeasured) {
    // the trap: the guess prices the drafter below the margin, the machine's curve at ~1.27x
    CostModel guess = cost_guess_curve(17, 0.01), truth = guess;
    guess.o = truth.o = 0.1;
    truth.c = 0.05;
    for (int n = 2; n <= 17; ++n) truth.v[size_t(n)] = trap_v(n);
    EXPECT_LT(choose_gamma(guess, kTrapAlpha, 1, 16).predicted, DraftLengthOptions{}.min_speedup);
    EXPECT_GT(choose_gamma(truth, kTrapAlpha, 1, 16).predicted, 1.25);
    const Trapped verified = off_on_a_guess(true, false), shadowed = off_on_a_guess(false, false);
    std::printf("probes of guessed sizes verified: %.3fx, off %.0f%%, v(4) guessed to the end in %d of 20; "
                "in shadow: %.3fx, off %.0f%%, %d of 20\n",
                verified.speedup, 100 * verified.off, verified.guessed, shadowed.speedup, 100 * shadowed.off,
                shadowed.guessed);
    EXPECT_EQ(verified.guessed, 0) << "every run measured the size its probes verify";
    EXPECT_GE(shadowed.guessed, 5);
    EXPECT_GT(verified.speedup, shadowed.speedup + 0.03);
    EXPECT_LT(verified.off, shadowed.off - 0.15);
    // With the longer run carried as the engine carries it, a dip also fades back on without a
    // probe, and the trap is rarer (measured: 3 of 20 seeds keep the guess with every probe in
    // shadow, 1.212x; with the rule 0 of 20, 1.221x); the rule still measures every seed.
    const Trapped both = off_on_a_guess(true, true), both_shadowed = off_on_a_guess(false, true);
    EXPECT_EQ(both.guessed, 0);
    EXPECT_GE(both_shadowed.guessed, 1);
    EXPECT_GT(both.speedup, both_shadowed.speedup - 0.005);
}
