// Inputs that used to take the process down (issue 13), on the real engine and models: a deep
// grammar (stack overflow in llama.cpp's parser), drafts larger than the batch or the free KV
// (llama.cpp's n_batch assert), a grammar that ends inside an accepted run (500, output lost),
// a model path that blocks on open (a FIFO). Each must give a clear error or the plain output.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "speculative/ngram_cache.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

std::unique_ptr<Engine> engine_with(EngineParams p) {
    auto e = Engine::create(p);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e ? std::move(e.value()) : nullptr;
}

CompletionRequest spec_request(const Engine & e, const std::string & prompt, int32_t n_predict, int32_t n_max,
                               int32_t n_parallel = 1) {
    CompletionRequest r = greedy_request(e, prompt, n_predict);
    r.sampling.ignore_eos = true;
    r.spec.types          = {SpecType::DRAFT};
    r.spec.n_max          = n_max;
    r.spec.n_min          = 0;
    r.spec.n_parallel     = n_parallel;
    r.spec.p_split        = 0.0f;
    r.spec.adaptive       = false;
    return r;
}

std::vector<token_id> plain_ids(Engine & e, CompletionRequest r) {
    r.spec.types.clear();
    auto res = e.complete(r);
    EXPECT_TRUE(res.is_ok()) << res.status().to_string();
    return res ? output_ids(res.value()) : std::vector<token_id>{};
}

}  // namespace

// 30,000 nested groups overflowed the engine thread's stack inside llama.cpp's parser (SIGSEGV).
TEST(RobustGrammar, DeepNestingIsRejectedAndTheEngineServesOn) {
    auto e = make_engine();
    ASSERT_TRUE(e);
    CompletionRequest r = greedy_request(*e, "x", 2);
    r.sampling.grammar  = "root ::= " + std::string(30000, '(') + "\"a\"" + std::string(30000, ')');
    auto res = e->complete(r);
    ASSERT_FALSE(res.is_ok());
    EXPECT_EQ(res.status().code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_EQ(res.status().param(), "grammar");
    EXPECT_NE(res.status().message().find("nests"), std::string::npos) << res.status().message();

    // a chain of rules each starting with the next (llama.cpp's left-recursion check recurses along it)
    std::string chain;
    for (int i = 0; i < 5000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    chain += "r5000 ::= \"a\"\nroot ::= r0\n";
    r.sampling.grammar = chain;
    res = e->complete(r);
    ASSERT_FALSE(res.is_ok());
    EXPECT_EQ(res.status().param(), "grammar");

    // at the limits: 256 nested groups, and a chain of 4,000 rules, reach llama.cpp and work
    r.sampling.grammar = "root ::= " + std::string(256, '(') + "\"a\"" + std::string(256, ')');
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    chain.clear();
    for (int i = 0; i < 4000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    chain += "r4000 ::= \"a\"\nroot ::= r0\n";
    r.sampling.grammar = chain;
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(res.value().content, "a");

    // repetitions expand in llama.cpp (S{0,2000}: 2,000 rules): 200 of them (2.4 KB) took 8.7 s
    // and +89 MB for 2 tokens; 100-character literals x {2000} x 20 grew the process by 63 MB
    std::string reps = "root ::=";
    for (int i = 0; i < 200; ++i) reps += " \"a\"{0,2000}";
    r.sampling.grammar = reps;
    res = e->complete(r);
    ASSERT_FALSE(res.is_ok());
    EXPECT_EQ(res.status().param(), "grammar");
    EXPECT_NE(res.status().message().find("expands"), std::string::npos) << res.status().message();
    r.sampling.grammar = "root ::= \"" + std::string(200000, 'a') + "\"";  // big, but plain: accepted
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(res.value().content, "aa");

    // parentheses inside literals, classes and comments do not count; moderate nesting works
    r.sampling.grammar = "root ::= " + std::string(200, '(') + "\"a(((\" [(]? # ((((\n" + std::string(200, ')');
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(res.value().content.substr(0, 1), "a");
}

// Nullable items in sequence, or alternatives matching the same text, multiply llama.cpp's parse
// stacks: 250 x "a"? stalled the engine thread for 31 s (every other request waited, SIGTERM
// too), 20,000 for minutes. They are refused at admission; ordinary grammars still work.
TEST(RobustGrammar, AmbiguousGrammarsAreRefusedAndTheEngineServesOn) {
    auto e = make_engine();
    ASSERT_TRUE(e);
    CompletionRequest r = greedy_request(*e, "x", 4);
    auto refused = [&](const std::string & g) {
        r.sampling.grammar = g;
        const auto t0  = std::chrono::steady_clock::now();
        auto       res = e->complete(r);
        // a liveness bound (the stall was 31 s and more), not a speed target
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
        ASSERT_FALSE(res.is_ok()) << g.substr(0, 80);
        EXPECT_EQ(res.status().code(), ErrorCode::INVALID_ARGUMENT);
        EXPECT_EQ(res.status().param(), "grammar");
        EXPECT_NE(res.status().message().find("grammar too ambiguous"), std::string::npos) << res.status().message();
    };
    auto optional_as = [](int n, const std::string & item) {
        std::string g = "root ::=";
        for (int i = 0; i < n; ++i) g += " " + item;
        return g;
    };
    refused(optional_as(250, "\"a\"?"));
    refused(optional_as(20000, "\"a\"?"));
    refused(optional_as(64, "x") + "\nx ::= [a-z ]*");          // through a nullable rule
    refused("root ::= \"x\" " + optional_as(100, "[a-z]?").substr(9));  // after a prefix
    refused("root ::= \"" + std::string(100, 'x') + "\" " + optional_as(64, "\"a\"?").substr(9));  // a long one
    // alternatives sharing a prefix under non-tail recursion: the stacks grow 4x per character
    refused("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | \"a\" s \"d\" | \"a\" s \"e\" | \"x\"");

    // served right after, and grammars of ordinary shape work
    r.sampling.grammar.clear();
    auto res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    r.sampling.grammar = optional_as(16, "\"a\"?") + " \"b\"";
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    r.sampling.grammar = "root ::= \"a\" | " + std::string("\"a\" | ") + "\"b\"";
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();

    // JSON, written as llama.cpp's grammars/json.gbnf is
    r.sampling.grammar = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";
    r.n_predict = 24;
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(res.value().content.substr(0, 1), "{") << res.value().content;
}

// A tree of 16 branches x 16 deep (257 nodes) in a context of 208 cells and batch 208 aborted
// (GGML_ASSERT n_tokens_all <= n_batch). The draft is cut to fit; the output stays plain's.
TEST(RobustBatch, WideTreeFitsTheBatchAndTheKv) {
    EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
    p.n_ctx      = 128;
    p.n_tree_max = 16;
    auto e = engine_with(p);
    ASSERT_TRUE(e);
    CompletionRequest r = spec_request(*e, "Once upon a time", 60, 16, 16);
    auto res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_GT(res.value().spec.draft_n, 0);
    EXPECT_EQ(output_ids(res.value()), plain_ids(*e, r));
}

// Two slots drafting 10 each need 22 tokens in one pass of a 20-token batch.
TEST(RobustBatch, ConcurrentDraftsShareTheBatch) {
    EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
    p.n_parallel = 2;
    p.n_batch    = 20;
    p.n_ctx      = 256;
    auto e = engine_with(p);
    ASSERT_TRUE(e);
    CompletionRequest a = spec_request(*e, "Once upon a time", 80, 10);
    CompletionRequest b = spec_request(*e, "The little dog", 80, 10);
    auto fa = std::async(std::launch::async, [&] { return e->complete(a); });
    auto fb = std::async(std::launch::async, [&] { return e->complete(b); });
    auto ra = fa.get(), rb = fb.get();
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
    EXPECT_GT(ra.value().spec.draft_n + rb.value().spec.draft_n, 0);
    EXPECT_EQ(output_ids(ra.value()), plain_ids(*e, a));
    EXPECT_EQ(output_ids(rb.value()), plain_ids(*e, b));
}

// The start-up probes time 16- and 17-token passes and a verification pass holds up to 17: a
// batch below that once aborted inside llama.cpp. Now the prompt goes in n_batch-token passes
// while the contexts keep room for 17; a batch of 0 is a clear error.
TEST(RobustBatch, TooSmallBatchIsAClearError) {
    for (int32_t n_batch : {1, 8, 16}) {
        EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
        p.n_batch = n_batch;
        auto e = Engine::create(p);
        ASSERT_TRUE(e.is_ok()) << e.status().to_string();
        CompletionRequest r = greedy_request(*e.value(), "Once upon a time, there was a little girl", 24);
        r.spec.types    = {SpecType::DRAFT};
        r.spec.n_max    = 16;
        r.spec.adaptive = false;
        auto out = e.value()->complete(r);
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        EXPECT_EQ(output_ids(out.value()), plain_ids(*e.value(), r)) << "n_batch " << n_batch;
    }
    {
        EngineParams p = engine_params("stories260K-F32.gguf");
        p.n_batch = 0;
        auto e = Engine::create(p);
        ASSERT_FALSE(e.is_ok());
        EXPECT_EQ(e.status().code(), ErrorCode::INVALID_ARGUMENT);
        EXPECT_EQ(e.status().param(), "n_batch");
    }
    EngineParams p = engine_params("stories260K-F32.gguf");
    p.n_parallel = 32;
    p.n_batch    = 17;  // one token per slot per pass does not fit
    auto e = Engine::create(p);
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().param(), "n_batch");
    // 8 slots x 16 tree branches = 128 sequences: llama.cpp reserves an output for
    // each and aborted on the first pass (GGML_ASSERT n_outputs_max <= cparams.n_outputs_max)
    p.n_parallel = 8;
    p.n_tree_max = 16;
    p.n_ctx      = 32;
    e = Engine::create(p);
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().param(), "n_batch");
    EXPECT_NE(e.status().message().find("128"), std::string::npos) << e.status().message();
}

// SpecParams::kMaxDraft is one constant for the request check, the cost curve's length and the
// learned cache's credit bound. At the cap a draft of kMaxDraft tokens (the target drafting for
// itself, so every token is accepted) is verified in one pass and the output is plain's; one more
// is refused naming spec.n_max, and the engine serves on.
TEST(RobustBatch, LongestDraftWorksAndOneMoreIsRefused) {
    auto e = make_engine("stories260K-F32.gguf", "stories260K-F32.gguf");
    ASSERT_TRUE(e);
    const int32_t kMax = SpecParams::kMaxDraft;
    CompletionRequest r = spec_request(*e, "Once upon a time", 2 * kMax + 8, kMax);
    r.spec.p_min = 0.0f;  // never cut a draft short
    auto res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const SpecRequestStats & st = res.value().spec;
    ASSERT_GE(st.drafted_at_pos.size(), size_t(kMax));
    ASSERT_GE(st.accepted_at_pos.size(), size_t(kMax));
    EXPECT_GT(st.drafted_at_pos[kMax - 1], 0);
    EXPECT_GT(st.accepted_at_pos[kMax - 1], 0);
    EXPECT_EQ(output_ids(res.value()), plain_ids(*e, r));

    r.spec.n_max = kMax + 1;
    auto bad = e->complete(r);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_EQ(bad.status().param(), "spec.n_max");
    EXPECT_NE(bad.status().message().find(std::to_string(kMax)), std::string::npos) << bad.status().message();
    r.spec.n_max = 4;
    EXPECT_TRUE(e->complete(r).is_ok());
}

// A context of 1 token per slot was accepted: no prompt fits it (BOS alone is one token), and a
// request with truncate: true emptied its prompt and took the process down. Refused below
// kMinCtxSlot; at the minimum, plain, speculative and truncated requests work.
TEST(RobustContext, TooSmallContextIsRefusedAndTheMinimumWorks) {
    for (int32_t n : {1, 2, kMinCtxSlot - 1}) {
        EngineParams p = engine_params("stories260K-F32.gguf");
        p.n_ctx = n;
        auto e = Engine::create(p);
        ASSERT_FALSE(e.is_ok()) << n;
        EXPECT_EQ(e.status().code(), ErrorCode::INVALID_ARGUMENT);
        EXPECT_EQ(e.status().param(), "n_ctx");
    }
    EngineParams p = engine_params("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
    p.n_ctx = kMinCtxSlot;
    auto e  = engine_with(p);
    ASSERT_TRUE(e);
    CompletionRequest r = spec_request(*e, "Once upon a time there was a girl", 20, 4);
    r.truncate_prompt   = true;
    auto res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_TRUE(res.value().truncated);
    r = spec_request(*e, "x", 20, 16);
    res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(output_ids(res.value()), plain_ids(*e, r));
}

// The grammar completes (12 characters) inside a run of accepted draft tokens: verification had
// no distribution after it ("verify: no target distribution for draft node 5", a 500).
TEST(RobustGrammar, GrammarEndingInsideAnAcceptedRunGivesPlainOutput) {
    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
    ASSERT_TRUE(e);
    CompletionRequest r =
        spec_request(*e, "Once upon a time, there was a little girl. Once upon a time, there was a little", 64, 8);
    r.sampling.grammar = "root ::= [a-z ]{1,12}";
    auto res = e->complete(r);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    EXPECT_EQ(output_ids(res.value()), plain_ids(*e, r));
    EXPECT_EQ(res.value().content, " girl named ");
    EXPECT_GT(res.value().spec.draft_n_accepted, 0);
}

// The same grammar end at T > 0, through every stochastic verifier: each round that reaches the
// grammar's end must end the request there (next = -1), never fail it. Coupled rounds must also
// give plain coupled decoding's text (the drafter cannot change it).
TEST(RobustGrammar, GrammarEndingInsideADraftAtTemperatureEndsTheRequestWithEveryVerifier) {
    auto e = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf");
    ASSERT_TRUE(e);
    const SpecVerifier verifiers[] = {SpecVerifier::TOKENWISE, SpecVerifier::BLOCK, SpecVerifier::COUPLED};
    for (SpecVerifier v : verifiers)
        for (uint32_t seed = 1; seed <= 6; ++seed) {
            CompletionRequest r = spec_request(
                *e, "Once upon a time, there was a little girl. Once upon a time, there was a little", 64, 8);
            r.sampling.grammar     = "root ::= [a-z ]{1,12}";
            r.sampling.temperature = 0.5f;
            r.sampling.seed        = seed;
            r.spec.verifier        = v;
            auto res = e->complete(r);
            ASSERT_TRUE(res.is_ok()) << int(v) << " seed " << seed << ": " << res.status().to_string();
            const std::string & text = res.value().content;
            EXPECT_GE(text.size(), 1u);
            EXPECT_LE(text.size(), 12u) << text;
            EXPECT_EQ(text.find_first_not_of("abcdefghijklmnopqrstuvwxyz "), std::string::npos) << text;
            if (v == SpecVerifier::COUPLED) {
                EXPECT_EQ(output_ids(res.value()), plain_ids(*e, r)) << seed;
            }
        }
}

// Opening a FIFO blocks until a writer comes: loading hung, and SIGTERM could not end it.
TEST(RobustLoad, FifoModelPathIsRefused) {
    const std::string fifo = ::testing::TempDir() + "/model-fifo-" + std::to_string(::getpid()) + ".gguf";
    ::unlink(fifo.c_str());
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    EngineParams p;
    p.target.path = fifo;
    p.n_threads   = 1;
    auto fut = std::async(std::launch::async, [p] { return Engine::create(p); });
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
        ADD_FAILURE() << "loading a FIFO blocks";
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblock the reader
        if (fd >= 0) ::close(fd);
    }
    auto r = fut.get();
    ::unlink(fifo.c_str());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED);
    EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
}

// Every finished request feeds the dynamic n-gram cache, with or without --lookup-cache-dynamic:
// random prompts grew it (and the server) without bound. It stays under ngram_cache_max_mb.
TEST(RobustNgram, DynamicCacheStaysUnderItsCap) {
    EngineParams p = engine_params("stories260K-F32.gguf");
    p.ngram_cache_max_mb = 1;
    auto e = engine_with(p);
    ASSERT_TRUE(e);
    std::mt19937 rng(7);
    for (int i = 0; i < 25; ++i) {
        CompletionRequest r = greedy_request(*e, "x", 1);
        r.prompt.clear();
        for (int k = 0; k < 500; ++k) r.prompt.push_back(static_cast<token_id>(rng() % 512));
        ASSERT_TRUE(e->complete(r).is_ok());
    }
    const std::string path = ::testing::TempDir() + "/robust-dyn-" + std::to_string(::getpid()) + ".ngram";
    ASSERT_TRUE(e->save_ngram_cache(path).is_ok());
    auto c = NgramCache::load(path);
    ::unlink(path.c_str());
    ASSERT_TRUE(c.is_ok());
    EXPECT_LE(c.value().bytes(), size_t(1) << 20);
    EXPECT_GT(c.value().bytes(), size_t(1) << 18);  // 50,000 n-grams came in: it was filled, not emptied
}
