// What requests taught the draft-length policy, kept across processes (prior_cache.h): the file
// round trip (bit-exact; corrupt, truncated, implausible and stale files ignored), and engines:
// a new engine of the same models starts from what the last one left, one of other models or
// with the cache off starts untaught, and a corrupt file changes nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "engine/cost_cache.h"
#include "engine/cost_tracker.h"
#include "engine/prior_cache.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string & name) {
    const fs::path d = fs::temp_directory_path() / ("specrpc-priors-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(d);
    return d.string();
}

PriorBook sample_book() {
    PriorBook    b;
    LearnedPrior l;
    l.alpha  = 0.9137;
    l.depth  = {0.0, 0.97, 0.95, 0.9, 1.0 / 3.0};
    l.ledger = ProbeLedger{812.25, 3.5, 0.75, 64, 7};
    l.classes.resize(3);
    l.classes[2].s = {0.0, 4.5, 4.0};
    l.classes[2].n = {0.0, 5.0, 4.0};
    b[{{SpecType::LOOKUP, SpecType::DRAFT}, 0}] = l;
    LearnedPrior m;  // measured nothing yet: no alpha, books only
    m.ledger = ProbeLedger{10, -1.5, 0, 0, 0};
    b[{{SpecType::SUFFIX}, 3}] = m;
    return b;
}

std::string read_all(const std::string & path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// Sets environment variables for a test's scope and restores them after.
class EnvScope {
  public:
    void set(const char * name, const char * value) {
        if (!saved_.count(name)) {
            const char * old = std::getenv(name);
            saved_[name]     = old ? std::optional<std::string>(old) : std::nullopt;
        }
        if (value) ::setenv(name, value, 1);
        else ::unsetenv(name);
    }
    ~EnvScope() {
        for (const auto & [k, v] : saved_) {
            if (v) ::setenv(k.c_str(), v->c_str(), 1);
            else ::unsetenv(k.c_str());
        }
    }

  private:
    std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST(PriorCache, RoundTripIsExact) {
    const std::string dir  = fresh_dir("rt");
    const PriorBook   book = sample_book();
    ASSERT_TRUE(prior_cache_save(dir, "target a\ndraft b", book).is_ok());
    auto got = prior_cache_load(dir, "target a\ndraft b");
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->size(), book.size());
    for (const auto & [k, l] : book) {
        ASSERT_TRUE(got->count(k));
        const LearnedPrior & g = got->at(k);
        EXPECT_EQ(g.alpha, l.alpha);  // bit-exact (%.17g)
        EXPECT_EQ(g.depth, l.depth);
        EXPECT_EQ(g.ledger.work, l.ledger.work);
        EXPECT_EQ(g.ledger.spent, l.ledger.spent);
        EXPECT_EQ(g.ledger.catch_up, l.ledger.catch_up);
        EXPECT_EQ(g.ledger.interval, l.ledger.interval);
        EXPECT_EQ(g.ledger.since_probe, l.ledger.since_probe);
        ASSERT_EQ(g.classes.size(), l.classes.size());
        for (size_t c = 0; c < l.classes.size(); ++c) {
            EXPECT_EQ(g.classes[c].s, l.classes[c].s);
            EXPECT_EQ(g.classes[c].n, l.classes[c].n);
        }
    }
    // another key (other model files) misses, even in a file of the same name
    EXPECT_FALSE(prior_cache_load(dir, "target a\ndraft c").has_value());
    fs::rename(prior_cache_path(dir, "target a\ndraft b"), prior_cache_path(dir, "other"));
    EXPECT_FALSE(prior_cache_load(dir, "other").has_value());
    // disabled: nothing written, nothing read
    EXPECT_TRUE(prior_cache_save("", "k", book).is_ok());
    EXPECT_FALSE(prior_cache_load("", "k").has_value());
    fs::remove_all(dir);
}

TEST(PriorCache, CorruptOrImplausibleFilesAreIgnored) {
    const std::string dir = fresh_dir("corrupt");
    ASSERT_TRUE(prior_cache_save(dir, "k", sample_book()).is_ok());
    const std::string path = prior_cache_path(dir, "k");
    const std::string good = read_all(path);
    ASSERT_TRUE(prior_cache_load(dir, "k").has_value());
    auto with = [&](const std::string & from, const std::string & to) {
        std::string s = good;
        const size_t at = s.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        if (at != std::string::npos) s.replace(at, from.size(), to);
        std::ofstream(path, std::ios::trunc) << s;
        return prior_cache_load(dir, "k").has_value();
    };
    EXPECT_FALSE(with("end\n", "")) << "truncated";
    EXPECT_FALSE(with("end\n", "end\nx\n")) << "garbage after the end";
    EXPECT_FALSE(with("specrpc-priors 1", "specrpc-priors 2")) << "another format";
    EXPECT_FALSE(with("alpha 0.91369999999999996", "alpha 1.5")) << "a rate above 1";
    EXPECT_FALSE(with("alpha 0.91369999999999996", "alpha nan")) << "not a number";
    EXPECT_FALSE(with("alpha 0.91369999999999996", "alpha 0.91369999999999996 7")) << "trailing field";
    EXPECT_FALSE(with("depth 5 0", "depth 6 0")) << "a profile shorter than its count";
    EXPECT_FALSE(with("depth 5 0 0.96999999999999997", "depth 5 0 -0.1")) << "a negative rate";
    EXPECT_FALSE(with("prior 0 2 3 1", "prior 0 2 3 9")) << "an unknown drafter";
    EXPECT_FALSE(with("prior 0 2 3 1", "prior 7 2 3 1")) << "an unknown regime";
    EXPECT_FALSE(with("prior 0 2 3 1", "prior 0 0")) << "an empty chain";
    EXPECT_FALSE(with("class 3 0 4.5 4 0 5 4", "class 3 0 6 4 0 5 4")) << "more successes than trials";
    EXPECT_FALSE(with("classes 3", "classes 99")) << "more classes than there are";
    EXPECT_FALSE(with("ledger 812.25", "ledger -812.25")) << "negative work";
    EXPECT_TRUE(with("alpha 0.91369999999999996", "alpha 0.5")) << "the well-formed variant loads";
    // random damage never crashes and never loads a mangled number as if it were right
    for (size_t cut = 0; cut + 1 < good.size(); cut += 7) {  // (all but "end" without its newline)
        std::ofstream(path, std::ios::trunc) << good.substr(0, cut);
        EXPECT_FALSE(prior_cache_load(dir, "k").has_value()) << "cut at " << cut;
    }
    fs::remove_all(dir);
}

// Engines: the first process of a pair of models learns, the next starts from it.
TEST(PriorCache, ANewEngineStartsWhereTheLastOneOfItsModelsLeftOff) {
    const std::string dir = fresh_dir("engine");
    EnvScope env;
    env.set("SPECRPC_CACHE_DIR", dir.c_str());
    env.set("SPECRPC_PRIORS", nullptr);
    CostMemo::process().clear();
    const char * prompt = "Once upon a time, there was a little girl named Lily. She liked to play. "
                          "Once upon a time, there was a little girl named";
    auto request = [&](Engine & e) {
        auto r       = greedy_request(e, prompt, 48);
        r.spec.types = {SpecType::LOOKUP};
        auto res     = e.complete(r);
        EXPECT_TRUE(res.is_ok()) << res.status().to_string();
        return res.is_ok() ? res.value().spec.alpha_prior : -1.0;
    };
    auto priors_file = [&] {
        std::string file;
        if (fs::exists(dir))
            for (const auto & f : fs::directory_iterator(dir))
                if (f.path().filename().string().rfind("priors-", 0) == 0) file = f.path().string();
        return file;
    };
    double      untaught = 0;
    std::string after_first;
    {
        auto a = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
        ASSERT_NE(a, nullptr);
        untaught = request(*a);  // nothing on disk yet
        ASSERT_FALSE(priors_file().empty()) << "the first request that taught something is written at once";
        after_first = read_all(priors_file());
        request(*a);  // within the second: written when the engine stops
    }
    const std::string file = priors_file();
    EXPECT_NE(read_all(file), after_first) << "the second request's lesson was not written when the engine stopped";
    // the key is the file's second line ("key ..."): read the book as the next engine will
    std::string key;
    {
        std::ifstream f(file);
        std::getline(f, key);
        std::getline(f, key);
        key = key.substr(4);
    }
    auto book = prior_cache_load(dir, key);
    ASSERT_TRUE(book.has_value());
    const PriorKey lookup_greedy{{SpecType::LOOKUP}, 0};
    ASSERT_TRUE(book->count(lookup_greedy) && book->at(lookup_greedy).alpha.has_value());
    const double taught = *book->at(lookup_greedy).alpha;
    ASSERT_NE(taught, untaught);

    {  // the same models: starts from what a taught
        auto b = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
        ASSERT_NE(b, nullptr);
        EXPECT_DOUBLE_EQ(request(*b), taught);
    }
    {  // another draft model: another key, untaught
        auto c = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
        ASSERT_NE(c, nullptr);
        EXPECT_DOUBLE_EQ(request(*c), untaught);
    }
    {  // the cache off: untaught, and nothing written
        env.set("SPECRPC_PRIORS", "off");
        const std::string before = read_all(file);
        auto d = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
        ASSERT_NE(d, nullptr);
        EXPECT_DOUBLE_EQ(request(*d), untaught);
        d.reset();
        EXPECT_EQ(read_all(file), before);
        env.set("SPECRPC_PRIORS", nullptr);
    }
    {  // a damaged file: ignored, the engine serves as a fresh one
        const std::string text = read_all(file);
        std::ofstream(file, std::ios::trunc) << text.substr(0, text.size() / 2);
        auto e = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
        ASSERT_NE(e, nullptr);
        EXPECT_DOUBLE_EQ(request(*e), untaught);
    }
    CostMemo::process().clear();
    fs::remove_all(dir);
}
