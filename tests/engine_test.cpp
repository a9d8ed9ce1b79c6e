// The engine on real models: loading errors, vocabulary check, tokenizer guard, plain generation
// with the sampling options, grammar (also with speculation), n_probs, seeds, context limits,
// prompt cache, cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "engine/context.h"
#include "engine/cost_tracker.h"
#include "engine/model.h"
#include "llama.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

class EngineTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { engine_ = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf").release(); }
    static void TearDownTestSuite() { delete engine_; }
    static Engine * engine_;
    Engine & e() { return *engine_; }
};
Engine * EngineTest::engine_ = nullptr;

Result<std::unique_ptr<Engine>> create(const std::string & target, const std::string & draft = "") {
    EngineParams p;
    p.target.path = target;
    p.draft.path  = draft;
    p.n_threads   = 1;
    return Engine::create(p);
}

}  // namespace

TEST(EngineLoad, MissingFileIsLoadFailed) {
    auto r = create("/nonexistent/model.gguf");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED);
    EXPECT_NE(r.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

TEST(EngineLoad, TruncatedAndNonGgufFilesAreErrors) {
    std::ifstream in(model_path("stories260K-F32.gguf"), std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    const std::string trunc = ::testing::TempDir() + "/truncated.gguf";
    std::ofstream(trunc, std::ios::binary).write(head.data(), static_cast<std::streamsize>(head.size()));
    auto r = create(trunc);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED);

    const std::string junk = ::testing::TempDir() + "/junk.gguf";
    std::ofstream(junk) << "this is not a model";
    auto r2 = create(junk);
    ASSERT_FALSE(r2.is_ok());
    EXPECT_NE(r2.status().message().find("not a GGUF"), std::string::npos);
}

TEST(EngineLoad, MismatchedDraftVocabNamesTheFirstDifference) {
    auto r = create(model_path("stories260K-F32.gguf"), model_path("BabyLlama-tok105-F32.gguf"));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::VOCAB_MISMATCH);
    // 512 vs 105 tokens: more than 128 apart
    EXPECT_NE(r.status().message().find("512"), std::string::npos) << r.status().message();
}

TEST(EngineLoad, VocabCheckComparesTokenTexts) {
    ModelParams a, b;
    a.path = model_path("stories260K-F32.gguf");
    b.path = model_path("stories260K-Q4_0.gguf");
    auto ma = Model::load(a), mb = Model::load(b);
    ASSERT_TRUE(ma.is_ok() && mb.is_ok());
    EXPECT_TRUE(vocab_check_compatible(*ma.value(), *mb.value()).is_ok());
}

TEST(EngineTokenizer, NoByteFallbackVocabRejectsUnknownCharacters) {
    auto r = create(model_path("BabyLlama-tok105-F32.gguf"));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto & eng = *r.value();
    auto bad = eng.tokenize("Z\xC3\xBCrich", true, false);  // llama.cpp itself aborts on this
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_NE(bad.status().message().find("\xC3\xBC"), std::string::npos);
    auto ok = eng.tokenize("Once upon a time", true, false);
    ASSERT_TRUE(ok.is_ok());
    EXPECT_GT(ok.value().size(), 5u);
    // and the process still serves
    auto res = eng.complete(greedy_request(eng, "Once upon a time", 20));
    ASSERT_TRUE(res.is_ok());
    EXPECT_EQ(res.value().tokens_predicted, 20);
}

TEST_F(EngineTest, GreedyStoriesIsStableEnglish) {
    auto r1 = e().complete(greedy_request(e(), "Once upon a time", 40));
    ASSERT_TRUE(r1.is_ok());
    // llama.cpp's own greedy output of this model (MANIFEST.md)
    EXPECT_NE(r1.value().content.find("there was a little girl named Lily"), std::string::npos) << r1.value().content;
    auto r2 = e().complete(greedy_request(e(), "Once upon a time", 40));
    EXPECT_EQ(r1.value().content, r2.value().content);
    EXPECT_EQ(r1.value().stop_type, StopType::LIMIT);
    EXPECT_EQ(r1.value().tokens_predicted, 40);
    EXPECT_GT(r2.value().tokens_cached, 0);  // the second request reuses the prompt's KV
}

TEST_F(EngineTest, TokenIdsOutOfRangeAreRejected) {
    CompletionRequest r;
    r.prompt = {1, 600};
    auto res = e().complete(r);
    ASSERT_FALSE(res.is_ok());
    EXPECT_EQ(res.status().code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_EQ(res.status().param(), "prompt");
    r.prompt = {1, -3};
    EXPECT_FALSE(e().complete(r).is_ok());
    EXPECT_TRUE(e().complete(greedy_request(e(), "Lily", 4)).is_ok());
}

TEST_F(EngineTest, SeedDeterminism) {
    auto req = greedy_request(e(), "Once upon a time", 32);
    req.sampling.temperature = 1.0f;
    req.sampling.seed = 42;
    auto a = e().complete(req), b = e().complete(req);
    EXPECT_EQ(a.value().content, b.value().content);
    int differ = 0;
    for (uint32_t s = 1; s <= 4; ++s) {
        req.sampling.seed = s;
        differ += e().complete(req).value().content != a.value().content;
    }
    EXPECT_GE(differ, 3);
}

TEST_F(EngineTest, NProbsAreSortedProbabilities) {
    auto req = greedy_request(e(), "Once upon a time", 8);
    req.sampling.n_probs = 5;
    auto r = e().complete(req);
    ASSERT_TRUE(r.is_ok());
    for (const auto & t : r.value().tokens) {
        ASSERT_EQ(t.top.size(), 5u);
        double sum = 0;
        for (size_t i = 0; i < t.top.size(); ++i) {
            EXPECT_GE(t.top[i].prob, 0.0f);
            EXPECT_LE(t.top[i].prob, 1.0f);
            if (i) {
                EXPECT_LE(t.top[i].prob, t.top[i - 1].prob);
            }
            sum += t.top[i].prob;
        }
        EXPECT_LE(sum, 1.0 + 1e-5);
        EXPECT_EQ(t.top[0].id, t.id);  // greedy picks the most probable token
        EXPECT_NEAR(t.prob, t.top[0].prob, 1e-6);
    }
}

TEST_F(EngineTest, LogitBiasBansAToken) {
    auto ref = e().complete(greedy_request(e(), "Once upon a time", 6)).value();
    token_id first = ref.tokens.at(0).id;
    auto req = greedy_request(e(), "Once upon a time", 6);
    req.sampling.logit_bias = {{first, -INFINITY}};
    auto r = e().complete(req).value();
    for (const auto & t : r.tokens) EXPECT_NE(t.id, first);
    req.sampling.logit_bias = {{600, 1.0f}};
    EXPECT_EQ(e().complete(req).status().param(), "logit_bias");
}

TEST_F(EngineTest, StopStringsAreCut) {
    auto req = greedy_request(e(), "Once upon a time", 60);
    req.stop = {"Lily"};
    auto r = e().complete(req).value();
    EXPECT_EQ(r.stop_type, StopType::WORD);
    EXPECT_EQ(r.stopping_word, "Lily");
    EXPECT_EQ(r.content.find("Lily"), std::string::npos);
    EXPECT_NE(r.content.find("named"), std::string::npos);
}

TEST_F(EngineTest, GrammarConstrainsOutputAlsoWithSpeculation) {
    const std::string g = "root ::= (\" yes\" | \" no\") \" it is \" [a-z]+ \".\"";
    for (bool spec : {false, true}) {
        auto req = greedy_request(e(), "Once upon a time", 24);
        req.sampling.grammar = g;
        if (spec) { req.spec.types = {SpecType::DRAFT}; req.spec.n_max = 4; req.spec.adaptive = false; }
        auto r = e().complete(req);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        const std::string & c = r.value().content;
        EXPECT_TRUE(c.rfind(" yes it is ", 0) == 0 || c.rfind(" no it is ", 0) == 0) << c;
        for (char ch : c.substr(c.find(" it is ") + 7))
            EXPECT_TRUE((ch >= 'a' && ch <= 'z') || ch == '.') << c;
    }
    // speculation under a grammar is token-identical to plain greedy
    auto a = greedy_request(e(), "Lily", 16), b = a;
    a.sampling.grammar = b.sampling.grammar = "root ::= [a-z ]+";
    b.spec.types = {SpecType::DRAFT};
    b.spec.n_max = 3;
    EXPECT_EQ(output_ids(e().complete(a).value()), output_ids(e().complete(b).value()));
    auto bad = greedy_request(e(), "Lily", 4);
    bad.sampling.grammar = "root ::= (";
    auto r = e().complete(bad);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().param(), "grammar");
}

// Flash attention is chosen per context: forced settings are kept, auto measures once per model
// and process, and a draft running other attention kernels than its target stays lossless.
TEST(EngineContext, FlashAttentionPerContext) {
    EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
    p.n_ctx       = 256;
    p.flash_attn  = 2;
    auto bad = Engine::create(p);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().param(), "flash_attn");

    p.flash_attn = 1, p.draft_flash_attn = 0;
    auto e = Engine::create(p);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    EXPECT_TRUE(e.value()->info().flash_attn);
    EXPECT_FALSE(e.value()->info().draft_flash_attn);
    auto req   = greedy_request(*e.value(), "Once upon a time", 48);
    auto plain = e.value()->complete(req);
    req.spec.types = {SpecType::DRAFT};
    req.spec.adaptive = false;  // draft every round
    req.spec.n_max = 4;
    auto spec = e.value()->complete(req);
    ASSERT_TRUE(plain.is_ok() && spec.is_ok());
    EXPECT_GT(spec.value().spec.draft_n, 0);
    EXPECT_EQ(output_ids(spec.value()), output_ids(plain.value()));

    p.flash_attn = p.draft_flash_attn = -1;
    auto a1 = Engine::create(p), a2 = Engine::create(p);
    ASSERT_TRUE(a1.is_ok() && a2.is_ok());
    EXPECT_EQ(a1.value()->info().flash_attn, a2.value()->info().flash_attn);  // cached per model
}

// The cost probe's timers: a drafted chain of n 1-token passes after a prefix is timed as one
// (mean per pass) and leaves the sequence as it found it (the prefix only), so the probe can time
// chain after chain, interleaved with target passes, on one scratch sequence.
TEST(EngineContext, ScratchChainTimerLeavesThePrefix) {
    ModelParams mp;
    mp.path = model_path("stories260K-F32.gguf");
    auto m = Model::load(mp);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EngineParams p = engine_params("stories260K-F32.gguf");
    llama_context * ctx = context_new(*m.value(), p, 256, 1, false, false, nullptr);
    ASSERT_NE(ctx, nullptr);
    const int32_t n_vocab = m.value()->n_vocab();
    ASSERT_TRUE(scratch_prefill(ctx, 0, 32, n_vocab));
    llama_batch b = llama_batch_init(1, 0, 1);
    for (int rep = 0; rep < 3; ++rep) {
        const double ms = scratch_time_chain(ctx, b, 0, 32, 8, n_vocab);
        EXPECT_GT(ms, 0.0);
        EXPECT_LT(ms, 1e29);  // every pass decoded
        EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(ctx), 0), 31);  // the chain is gone
    }
    EXPECT_GE(scratch_time_chain(ctx, b, 0, 32, 0, n_vocab), 1e29);  // nothing timed: not a measurement
    llama_batch_free(b);
    llama_free(ctx);
}

TEST(EngineContext, OverflowErrorTruncationAndShift) {
    auto e = make_engine("stories260K-F32.gguf", "", 1, 64);
    ASSERT_NE(e, nullptr);
    std::string long_prompt;
    for (int i = 0; i < 30; ++i) long_prompt += "Lily saw a cat. ";
    auto req = greedy_request(*e, long_prompt, 8);
    ASSERT_GT(req.prompt.size(), 64u);
    auto r = e->complete(req);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::CONTEXT_EXCEEDED);

    req.truncate_prompt = true;
    auto t = e->complete(req);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_TRUE(t.value().truncated);
    EXPECT_EQ(t.value().tokens_predicted, 8);

    auto s = greedy_request(*e, "Once upon a time", 150);
    s.sampling.ignore_eos = true;
    s.context_shift = true;
    s.n_keep = 2;
    auto sr = e->complete(s);
    ASSERT_TRUE(sr.is_ok());
    EXPECT_EQ(sr.value().tokens_predicted, 150);  // more than the 64-token context holds
    EXPECT_TRUE(sr.value().truncated);

    s.context_shift = false;
    auto stop = e->complete(s).value();
    EXPECT_EQ(stop.stop_type, StopType::CONTEXT);
    EXPECT_LT(stop.tokens_predicted, 64);
}

TEST_F(EngineTest, CancelStopsWithinAFewTokens) {
    auto req = greedy_request(e(), "Once upon a time", 100000);
    req.sampling.ignore_eos = true;
    req.stream = true;
    std::atomic<int> chunks{0};
    std::promise<Result<CompletionResult>> done;
    CompletionSink sink;
    sink.on_chunk = [&](const CompletionChunk &) { chunks++; };
    sink.on_done  = [&](Result<CompletionResult> r) { done.set_value(std::move(r)); };
    int64_t id = e().submit(req, sink);
    while (chunks < 5) std::this_thread::sleep_for(std::chrono::microseconds(100));
    int at_cancel = chunks.load();
    e().cancel(id);
    auto r = done.get_future().get();
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r.value().stop_type, StopType::CANCELLED);
    EXPECT_LT(r.value().tokens_predicted, at_cancel + 20);
    // the slot is free again
    EXPECT_TRUE(e().complete(greedy_request(e(), "Lily", 4)).is_ok());
}

TEST(EngineNgram, DynamicCacheSurvivesSaveAndLoad) {
    const std::string path = ::testing::TempDir() + "/dyn.ngram";
    std::remove(path.c_str());
    auto story = [](Engine & e) {
        auto r = greedy_request(e, "Once upon a time", 120);
        return e.complete(r).value();
    };
    auto probe = [](Engine & e) {
        // a different prompt whose continuation the first request's text predicts
        auto r = greedy_request(e, "One day, she saw a big", 60);
        r.spec.types = {SpecType::NGRAM};
        r.spec.n_max = 4;
        r.spec.adaptive = false;
        return e.complete(r).value();
    };
    int64_t drafted_cold = 0, drafted_warm = 0;
    {
        auto e = make_engine();
        ASSERT_NE(e, nullptr);
        drafted_cold = probe(*e).spec.draft_n;  // nothing learned yet: only the request's own text
    }
    std::vector<token_id> warm_out, cold_out;
    {
        auto e = make_engine();
        for (int i = 0; i < 3; ++i) story(*e);  // feeds the dynamic cache (its thresholds want repeats)
        ASSERT_TRUE(e->save_ngram_cache(path).is_ok());
    }
    {
        auto e = make_engine();
        ASSERT_TRUE(e->load_ngram_cache(path, true).is_ok());
        auto r = probe(*e);
        drafted_warm = r.spec.draft_n;
        warm_out = output_ids(r);
        auto plain = greedy_request(*e, "One day, she saw a big", 60);
        cold_out = output_ids(e->complete(plain).value());
    }
    EXPECT_GT(drafted_warm, drafted_cold);
    EXPECT_EQ(warm_out, cold_out);  // still lossless
    EXPECT_EQ(make_engine()->load_ngram_cache(path + ".missing", true).code(), ErrorCode::NOT_FOUND);
}

// What a request teaches the next one's draft-length policy is kept per chain of drafters: the
// chain "lookup, then draft" and "lookup" alone share their first drafter, and requests of the
// chain used to set the prior of lookup alone (its model drafts' acceptance, its probe books).
TEST(EngineLearned, AChainAndItsFirstDrafterLearnApart) {
    const char * prompt = "Once upon a time, there was a little girl named Lily.";
    auto request = [&](Engine & e, std::vector<SpecType> types) {
        auto r       = greedy_request(e, prompt, 48);
        r.spec.types = std::move(types);
        return e.complete(r).value();
    };
    const std::vector<SpecType> chain{SpecType::LOOKUP, SpecType::DRAFT}, lookup{SpecType::LOOKUP};
    auto fresh = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
    ASSERT_NE(fresh, nullptr);
    const double untaught = request(*fresh, lookup).spec.alpha_prior;

    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q8_0.gguf");
    ASSERT_NE(e, nullptr);
    const auto first = request(*e, chain);
    ASSERT_GT(first.spec.draft_n, 0);
    EXPECT_NE(request(*e, chain).spec.alpha_prior, untaught);  // the chain taught itself
    EXPECT_EQ(request(*e, lookup).spec.alpha_prior, untaught);  // and not lookup alone
}

TEST(EngineQueue, ZeroQueueStillServesFreeSlots) {
    EngineParams p = engine_params("stories260K-F32.gguf");
    p.n_parallel   = 2;
    p.n_queue_max  = 0;
    auto e = Engine::create(p);
    ASSERT_TRUE(e.is_ok());
    auto r = e.value()->complete(greedy_request(*e.value(), "Lily", 4));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r.value().tokens_predicted, 4);
    p.n_queue_max = -1;
    EXPECT_EQ(Engine::create(p).status().param(), "n_queue_max");
}

// metrics() from one thread while another submits: the two take the engine's two locks, and an
// ABBA order between them deadlocked a server (a soak run's metrics call hung). Each call must
// come back; a deadlock shows as the watchdog's failure instead of a hung test.
TEST(EngineQueue, MetricsWhileSubmittingDoesNotDeadlock) {
    auto e = make_engine("stories260K-F32.gguf", "", 2);
    ASSERT_NE(e, nullptr);
    std::atomic<bool> stop{false};
    std::atomic<int64_t> n_metrics{0};
    std::thread reader([&] {
        while (!stop) { (void)e->metrics(); ++n_metrics; }
    });
    auto work = std::async(std::launch::async, [&] {
        for (int i = 0; i < 300; ++i) {
            auto r = e->complete(greedy_request(*e, "Lily", 1));
            if (!r.is_ok()) return false;
        }
        return true;
    });
    const bool finished = work.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    stop = true;
    if (!finished) {  // deadlocked: nothing can be joined, fail loudly
        ADD_FAILURE() << "submit/metrics deadlock";
        std::_Exit(1);
    }
    reader.join();
    EXPECT_TRUE(work.get());
    EXPECT_GT(n_metrics.load(), 0);
}
