// The learned cache (engine/learned_cache.h): what requests taught the draft-length policy,
// kept on disk so a fresh process starts where the last one with the same models left off. Round
// trip, corrupt and stale files ignored, and a second engine starting from the first one's prior.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/cost_cache.h"
#include "engine/cost_tracker.h"
#include "engine/learned_cache.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;
namespace fs = std::filesystem;

namespace {

// Every field set, values that are not round in decimal (the file keeps them bit-exact).
LearnedPriors sample_priors() {
    LearnedPriors p;
    LearnedPrior & a = p[{{SpecType::LOOKUP, SpecType::DRAFT}, 5}];
    a.alpha  = 0.7312345678901234;
    a.depth  = {0.0, 0.93, 0.9, 0.81, 1.0 / 3.0};
    a.long_run.s = {0.0, 30.5, 12.25};
    a.long_run.n = {0.0, 40.0, 20.125};
    a.ledger = {412.25, 7.125, 3.0625, 64, 17};
    a.classes.resize(kDraftClasses);
    a.classes[3].s = {0.0, 1.5, 0.25};
    a.classes[3].n = {0.0, 2.0, 0.5};
    a.confidence.s.assign(kConfBins, 0.0);
    a.confidence.n.assign(kConfBins, 0.0);
    a.confidence.s[9] = 4.2;
    a.confidence.n[9] = 5.1;
    a.confidence.empty_share  = 0.17;
    a.confidence.empty_excess = 0.23;
    LearnedPrior & b = p[{{SpecType::SUFFIX}, 0}];  // a block with nothing but its ledger
    b.ledger.work = 3;
    // a ledger in credit: its probes emitted more than their work (the engine writes these)
    p[{{SpecType::DRAFT}, 4}].ledger = {75.70181519660146, -1.5041136173154284, 0.4856424769232484, 16, 1};
    return p;
}

std::string read_file(const std::string & path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Saves sample_priors() under key in dir; returns the file's text.
std::string save_sample(const std::string & dir, const std::string & key) {
    EXPECT_TRUE(learned_cache_save(dir, key, sample_priors()).is_ok());
    return read_file(learned_cache_path(dir, key));
}

}  // namespace

TEST(LearnedCache, RoundTrip) {
    const std::string dir = fresh_dir("learned-rt");
    const LearnedPriors p = sample_priors();
    ASSERT_TRUE(learned_cache_save(dir, "target a\ndraft b", p).is_ok());
    auto got = learned_cache_load(dir, "target a\ndraft b");
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->size(), 3u);
    const LearnedPrior & a = got->at({{SpecType::LOOKUP, SpecType::DRAFT}, 5});
    const LearnedPrior & e = p.at({{SpecType::LOOKUP, SpecType::DRAFT}, 5});
    EXPECT_EQ(a.alpha, e.alpha);  // bit-exact (%.17g)
    EXPECT_EQ(a.depth, e.depth);
    EXPECT_EQ(a.long_run.s, e.long_run.s);
    EXPECT_EQ(a.long_run.n, e.long_run.n);
    EXPECT_EQ(a.ledger.work, e.ledger.work);
    EXPECT_EQ(a.ledger.spent, e.ledger.spent);
    EXPECT_EQ(a.ledger.catch_up, e.ledger.catch_up);
    EXPECT_EQ(a.ledger.interval, 64);
    EXPECT_EQ(a.ledger.since_probe, 17);
    ASSERT_EQ(a.classes.size(), 4u) << "up to the last class with evidence";
    EXPECT_TRUE(a.classes[1].n.empty()) << "a class never drafted is not written";
    EXPECT_EQ(a.classes[3].s, e.classes[3].s);
    EXPECT_EQ(a.classes[3].n, e.classes[3].n);
    EXPECT_EQ(a.confidence.s, e.confidence.s);
    EXPECT_EQ(a.confidence.n, e.confidence.n);
    EXPECT_EQ(a.confidence.empty_share, 0.17);
    EXPECT_EQ(a.confidence.empty_excess, 0.23);
    const LearnedPrior & b = got->at({{SpecType::SUFFIX}, 0});
    EXPECT_FALSE(b.alpha.has_value());
    EXPECT_TRUE(b.depth.empty());
    EXPECT_TRUE(b.long_run.n.empty());
    EXPECT_EQ(b.ledger.work, 3.0);
    EXPECT_EQ(got->at({{SpecType::DRAFT}, 4}).ledger.spent, -1.5041136173154284) << "a ledger in credit loads";
    EXPECT_FALSE(learned_cache_load(dir, "target a\ndraft c").has_value()) << "another key";
    EXPECT_FALSE(learned_cache_load("", "target a\ndraft b").has_value()) << "no cache";
    EXPECT_TRUE(learned_cache_save("", "k", p).is_ok()) << "no cache: nothing written";
    fs::remove_all(dir);
}

// What another process wrote is input: anything implausible makes the whole file a miss (the
// engine then starts from the prior, as with no file), never a rate outside [0, 1] in a policy.
TEST(LearnedCache, CorruptFilesIgnored) {
    const std::string dir = fresh_dir("learned-corrupt");
    const std::string key  = "k";
    const std::string good = save_sample(dir, key);
    ASSERT_FALSE(good.empty()) << "the sample was saved";
    const std::string path = learned_cache_path(dir, key);
    auto replace = [&](const std::string & from, const std::string & to) {
        std::string s = good;
        const size_t at = s.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        return at == std::string::npos ? s : s.replace(at, from.size(), to);
    };
    const std::vector<std::pair<const char *, std::string>> bad = {
        {"empty", ""},
        {"truncated", good.substr(0, good.size() / 2)},
        {"no end", replace("end\n", "")},
        {"binary", std::string("\x00\xff\x13garbage", 10)},
        {"bad magic", replace("specrpc-learned 1", "specrpc-learned 2")},
        {"stale key", replace("key k\n", "key other\n")},
        {"alpha above 1", replace("alpha 0.73", "alpha 1.73")},
        {"alpha nan", replace("alpha 0.73", "alpha nan 0.73")},
        {"depth above 1", replace("depth 5 0 0.93", "depth 5 0 1.93")},
        {"short depth", replace("depth 5 ", "depth 9 ")},
        {"long run: more successes than positions", replace("long 3 0 30.5", "long 3 0 50.5")},
        {"long run: short", replace("long 3 ", "long 4 ")},
        {"negative work", replace("ledger 412", "ledger -412")},
        {"more credit than probes can earn", replace("ledger 412.25 7.125", "ledger 412.25 -30000")},
        {"probe interval past any cap", replace(" 64 17\n", " 99999999 17\n")},
        {"class 0", replace("class 3 ", "class 0 ")},
        {"class out of range", replace("class 3 ", "class 99 ")},
        {"more successes than trials", replace("class 3 3 0 1.5", "class 3 3 0 7.5")},
        {"confidence of another size", replace("confidence 10 ", "confidence 11 ")},
        {"unknown drafter", replace("prior 5 2 3 1", "prior 5 2 3 77")},
        {"item before a block", replace("key k\n", "key k\nalpha 0.5\n")},
        {"unknown field", replace("end\n", "bogus 1\nend\n")},
        {"trailing garbage", replace("alpha 0.73", "alpha 0.5 0.73")},
    };
    for (const auto & [what, text] : bad) {
        std::ofstream(path, std::ios::trunc) << text;
        EXPECT_FALSE(learned_cache_load(dir, key).has_value()) << what << "\n" << text;
    }
    std::ofstream(path, std::ios::trunc) << good;
    EXPECT_TRUE(learned_cache_load(dir, key).has_value());
    fs::remove_all(dir);
}

// Random damage (bytes changed, dropped or repeated): a file loads or is a miss, and whatever
// loads is in range, so no policy is ever handed a rate outside [0, 1] or a negative count.
TEST(LearnedCache, RandomDamageLoadsInRangeOrMisses) {
    const std::string dir = fresh_dir("learned-fuzz");
    const std::string key  = "k";
    const std::string good = save_sample(dir, key);
    ASSERT_FALSE(good.empty()) << "the sample was saved";
    const std::string path = learned_cache_path(dir, key);
    std::mt19937 rng(20261129);
    const std::string alphabet = "0123456789.-+e \nnaif";
    int loaded = 0;
    for (int i = 0; i < 2000; ++i) {
        std::string s = good;
        for (int k = 1 + int(rng() % 3); k > 0 && !s.empty(); --k) {
            const size_t at = rng() % s.size();
            switch (rng() % 3) {
                case 0: s[at] = alphabet[rng() % alphabet.size()]; break;
                case 1: s.erase(at, 1 + rng() % 4); break;
                default: s.insert(at, s.substr(at, 1 + rng() % 8)); break;
            }
        }
        std::ofstream(path, std::ios::trunc) << s;
        const auto got = learned_cache_load(dir, key);
        if (!got) continue;
        ++loaded;
        for (const auto & [k, p] : *got) {
            if (p.alpha) {
                EXPECT_TRUE(*p.alpha >= 0 && *p.alpha <= 1) << s;
            }
            for (double a : p.depth) EXPECT_TRUE(a >= 0 && a <= 1) << s;
            EXPECT_GE(p.ledger.work, 0) << s;
            EXPECT_GE(p.ledger.spent, -SpecParams::kMaxDraft * p.ledger.work) << s;  // a net cost: < 0 when probes paid
            EXPECT_GE(p.ledger.interval, 0) << s;
            for (const DraftClassEvidence & ev : p.classes) {
                ASSERT_EQ(ev.s.size(), ev.n.size()) << s;
                for (size_t j = 0; j < ev.s.size(); ++j) EXPECT_TRUE(ev.n[j] >= 0 && ev.s[j] >= 0) << s;
            }
            EXPECT_TRUE(p.confidence.s.empty() || p.confidence.s.size() == size_t(kConfBins)) << s;
            ASSERT_EQ(p.long_run.s.size(), p.long_run.n.size()) << s;
            for (size_t j = 0; j < p.long_run.s.size(); ++j)
                EXPECT_TRUE(p.long_run.s[j] >= 0 && p.long_run.s[j] <= p.long_run.n[j] + 1e-9) << s;
        }
    }
    EXPECT_GT(loaded, 0) << "some damage leaves a plausible file (a digit changed): the check is not all-or-nothing by accident";
    fs::remove_all(dir);
}

// A fresh engine (a new process) starts from what the last one with the same models learned, and
// with SPECRPC_LEARNED_CACHE=off from the optimistic prior. Without the file, a process that
// serves one request judged every draft model from the prior and a few verified rounds.
TEST(LearnedCache, AFreshEngineStartsWhereTheLastLeftOff) {
    const std::string dir = fresh_dir("learned-engine");
    ::setenv("SPECRPC_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("SPECRPC_LEARNED_CACHE");
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
    double first_prior = 0;
    {
        CostMemo::process().clear();
        auto e = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf", 1, 256);
        ASSERT_NE(e, nullptr);
        CompletionRequest req = greedy_request(*e, prompt, 64);
        req.spec.types = {SpecType::DRAFT};
        auto r = e->complete(req);
        ASSERT_TRUE(r.is_ok());
        ASSERT_GT(r.value().spec.draft_n, 0);
        first_prior = r.value().spec.alpha_prior;
    }
    int n_files = 0;
    std::string learned_text;
    for (const auto & f : fs::directory_iterator(dir))
        if (f.path().filename().string().rfind("learned-", 0) == 0) {
            ++n_files;
            learned_text = read_file(f.path().string());
        }
    ASSERT_EQ(n_files, 1) << "the first engine keeps what it learned";
    EXPECT_NE(learned_text.find("\nlong "), std::string::npos) << "the positions by depth, pooled (long_prior)\n"
                                                                << learned_text;
    auto run_fresh = [&] {
        CostMemo::process().clear();
        auto e = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf", 1, 256);
        if (!e) {
            ADD_FAILURE() << "no engine";
            return std::make_pair(-1.0, std::string());
        }
        CompletionRequest req = greedy_request(*e, prompt, 64);
        req.spec.types = {SpecType::DRAFT};
        testing::internal::CaptureStderr();
        auto r = e->complete(req);
        const std::string log = testing::internal::GetCapturedStderr();
        EXPECT_TRUE(r.is_ok());
        return std::make_pair(r.is_ok() ? r.value().spec.alpha_prior : -1.0, log);
    };
    auto [second_prior, log] = run_fresh();
    EXPECT_NE(log.find("learned acceptance from"), std::string::npos) << log;
    EXPECT_NE(second_prior, first_prior) << "the second engine's prior is what the first measured";
    EXPECT_GT(second_prior, 0.0);
    ::setenv("SPECRPC_LEARNED_CACHE", "off", 1);
    auto [off_prior, off_log] = run_fresh();
    EXPECT_EQ(off_prior, first_prior) << "off: the optimistic prior, as in a first process";
    EXPECT_EQ(off_log.find("learned acceptance from"), std::string::npos) << off_log;
    ::unsetenv("SPECRPC_CACHE_DIR");
    fs::remove_all(dir);
}
