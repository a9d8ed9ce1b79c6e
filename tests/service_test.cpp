// The service layer on the real stories260K model, through a Dispatcher like the transports use:
// the validation table (hard limits name their param, soft limits clamp with a warning), the
// logit_bias forms, mixed prompts, n_probs shapes, stop strings, streaming, cancellation, the
// context check, chat templates, per-request speculation, and init's argument parsing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "server/server_options.h"
#include "server/service.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::server;
using nlohmann::json;

namespace {

constexpr int kCtx = 256;

class ServiceTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        svc_ = new Service();
        d_   = new rpc::Dispatcher();
        svc_->register_methods(*d_);
        LoadConfig cfg;
        cfg.engine.target.path = test::model_path("stories260K-F32.gguf");
        cfg.engine.n_ctx       = 2 * kCtx;  // the total: kCtx per slot
        cfg.engine.n_parallel  = 2;
        cfg.engine.n_threads   = 1;
        ASSERT_TRUE(finalize_load_config(cfg));
        Status st = svc_->load(cfg);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    static void TearDownTestSuite() {
        delete d_;
        delete svc_;
    }

    static rpc::MethodResult call(const std::string & method, const json & params, rpc::CallContext * c = nullptr) {
        rpc::CallContext local;
        local.transport = rpc::Transport::NONE;
        return d_->call(method, params, c ? *c : local);
    }
    static json ok(const rpc::MethodResult & r) {
        if (auto * e = std::get_if<rpc::RpcError>(&r)) {
            ADD_FAILURE() << "unexpected error " << e->code << ": " << e->message;
            return json();
        }
        return std::get<json>(r);
    }
    static rpc::RpcError err(const rpc::MethodResult & r) {
        if (!std::holds_alternative<rpc::RpcError>(r)) {
            ADD_FAILURE() << "expected an error, got " << std::get<json>(r).dump().substr(0, 200);
            return {};
        }
        return std::get<rpc::RpcError>(r);
    }
    static json greedy(json extra = json::object()) {
        json p = {{"prompt", "Once upon a time"}, {"n_predict", 16}, {"temperature", 0}};
        p.update(extra);
        return p;
    }
    static std::string param_of(const rpc::RpcError & e) {
        return e.data.is_object() && e.data.contains("param") ? e.data["param"].get<std::string>() : "";
    }

    static Service *         svc_;
    static rpc::Dispatcher * d_;
};
Service *         ServiceTest::svc_ = nullptr;
rpc::Dispatcher * ServiceTest::d_   = nullptr;

}  // namespace

// ---- the validation table ------------------------------------------------------------------

TEST_F(ServiceTest, EveryFiniteHardLimitRejectsAndNamesItsParam) {
    const json schema = completion_params_schema();
    int checked = 0;
    for (const json & f : schema) {
        if (!f.contains("hard") || !f["hard"].is_array() || f["type"] == "boolean") continue;
        const std::string name = f["name"];
        if (name.find("speculative.") != 0 && f["type"] != "integer" && f["type"] != "number") continue;
        for (int side = 0; side < 2; ++side) {
            const json & lim = f["hard"][side];
            if (!lim.is_number()) continue;
            const double bad = side == 0 ? lim.get<double>() - 1 : lim.get<double>() + 1;
            json p = greedy();
            if (name.rfind("speculative.", 0) == 0) p["speculative"] = {{name.substr(12), bad}};
            else p[name] = bad;
            rpc::RpcError e = err(call("completion", p));
            EXPECT_EQ(e.code, rpc::ERR_INVALID_PARAMS) << name << " = " << bad;
            EXPECT_EQ(param_of(e), name) << e.message;
            checked++;
        }
    }
    EXPECT_GE(checked, 15);  // the table has that many finite hard limits
}

TEST_F(ServiceTest, TypeAndStructureErrorsNameTheirParam) {
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"n_predict", -2}}, "n_predict"},
        {{{"n_predict", nullptr}, {"max_tokens", -2}}, "max_tokens"},
        {{{"top_k", "forty"}}, "top_k"},
        {{{"temperature", "hot"}}, "temperature"},
        {{{"seed", 1.5}}, "seed"},
        {{{"ignore_eos", 1}}, "ignore_eos"},
        {{{"n_probs", -1}}, "n_probs"},
        {{{"mirostat", 3}}, "mirostat"},
        {{{"stop", json::array({"a", 5})}}, "stop"},
        {{{"stop", json(std::vector<std::string>(17, "x"))}}, "stop"},
        {{{"stop", 7}}, "stop"},
        {{{"logit_bias", json::array({json::array({9999, 1.0})})}}, "logit_bias"},
        {{{"logit_bias", json::array({json::array({5, true})})}}, "logit_bias"},
        {{{"logit_bias", json::array({5})}}, "logit_bias"},
        {{{"logit_bias", "x"}}, "logit_bias"},
        {{{"grammar", 12}}, "grammar"},
        {{{"speculative", {{"type", "bogus"}}}}, "speculative.type"},
        {{{"speculative", {{"type", "draft"}}}}, "speculative.type"},  // no draft model loaded
        {{{"speculative", {{"n_max", 2}, {"n_min", 3}}}}, "speculative.n_min"},
        {{{"speculative", 3}}, "speculative"},
        {{{"speculative.n_max", 99}}, "speculative.n_max"},
        {{{"prompt", nullptr}}, "prompt"},
        {{{"prompt", json::array({1, 512})}}, "prompt"},
        {{{"prompt", json::array({1, -3})}}, "prompt"},
        {{{"prompt", json::array({json::array({1, 512})})}}, "prompt"},  // one prompt, wrapped
        {{{"prompt", json::array({"Once", {{"x", 1}}})}}, "prompt"},      // several: a bad prompt object
        {{{"prompt", json::array()}}, "prompt"},
        {{{"prompt", 5}}, "prompt"},
        {{{"tfs_z", "x"}}, "tfs_z"},
    };
    for (const auto & [patch, param] : cases) {
        json p = greedy(patch);
        rpc::RpcError e = err(call("completion", p));
        EXPECT_EQ(e.code, rpc::ERR_INVALID_PARAMS) << patch.dump();
        EXPECT_EQ(param_of(e), param) << patch.dump() << " -> " << e.message;
    }
    // a long logit_bias list is refused as a whole
    json many = json::array();
    for (int i = 0; i < 1025; ++i) many.push_back(json::array({i % 512, 0.5}));
    EXPECT_EQ(param_of(err(call("completion", greedy({{"logit_bias", many}})))), "logit_bias");
    // the grammar is checked by the engine: a bad one is still -32602 naming grammar
    rpc::RpcError g = err(call("completion", greedy({{"grammar", "root ::= ("}})));
    EXPECT_EQ(g.code, rpc::ERR_INVALID_PARAMS);
    EXPECT_EQ(param_of(g), "grammar");
}

TEST_F(ServiceTest, SoftLimitsClampWithAWarning) {
    json r = ok(call("completion", greedy({{"top_p", 1.5},
                                           {"n_probs", 500},
                                           {"presence_penalty", 7},
                                           {"logit_bias", json::array({json::array({5, 1000})})},
                                           {"tfs_z", 0.9},
                                           {"n_predict", 2}})));
    const json & gs = r["generation_settings"];
    EXPECT_DOUBLE_EQ(gs["top_p"].get<double>(), 1.0);
    EXPECT_EQ(gs["n_probs"], 100);
    EXPECT_DOUBLE_EQ(gs["presence_penalty"].get<double>(), 2.0);
    EXPECT_DOUBLE_EQ(gs["logit_bias"][0]["bias"].get<double>(), 100.0);
    ASSERT_TRUE(r.contains("warnings"));
    const std::string w = r["warnings"].dump();
    for (const char * s : {"top_p", "n_probs", "presence_penalty", "logit_bias", "tfs_z"})
        EXPECT_NE(w.find(s), std::string::npos) << s << " not in " << w;
    EXPECT_EQ(r["completion_probabilities"][0]["top_logprobs"].size(), 100u);
    // in range: no warnings at all
    json clean = ok(call("completion", greedy({{"n_predict", 2}})));
    EXPECT_FALSE(clean.contains("warnings"));
}

TEST_F(ServiceTest, NullMeansDefaultAndMaxTokensIsAnAlias) {
    json r = ok(call("completion", greedy({{"temperature", nullptr}, {"top_k", nullptr}, {"n_predict", nullptr},
                                           {"max_tokens", 3}, {"stop", nullptr}, {"seed", 42}})));
    EXPECT_NEAR(r["generation_settings"]["temperature"].get<double>(), 0.8, 1e-6);
    EXPECT_EQ(r["generation_settings"]["top_k"], 40);
    EXPECT_EQ(r["tokens_predicted"], 3);
    EXPECT_EQ(r["stop_type"], "limit");
    EXPECT_TRUE(r["stopped_limit"].get<bool>());
}

// ---- prompts, bias, probabilities, stop strings ------------------------------------------------

TEST_F(ServiceTest, MixedPromptsConcatenateTokens) {
    auto eng = svc_->engine();
    ASSERT_TRUE(eng);
    const auto head = eng->tokenize("Once upon", true, true).value();
    const auto tail = eng->tokenize(" time", false, true).value();
    json mixed = json::array({"Once upon", 261, " time"});
    json r = ok(call("completion", greedy({{"prompt", mixed}, {"n_predict", 4}, {"cache_prompt", false}})));
    EXPECT_EQ(r["tokens_evaluated"].get<size_t>(), head.size() + 1 + tail.size());
    // token arrays are used as they are (no BOS added), nested once is accepted too
    std::vector<int> ids(head.begin(), head.end());
    json r2 = ok(call("completion", greedy({{"prompt", json::array({ids})}, {"n_predict", 4}})));
    EXPECT_EQ(r2["tokens_evaluated"].get<size_t>(), head.size());
    json r3 = ok(call("completion", greedy({{"prompt", "Once upon"}, {"n_predict", 4}})));
    EXPECT_EQ(r3["content"], r2["content"]);  // same tokens, same greedy continuation
}

TEST_F(ServiceTest, LogitBiasForms) {
    json base = ok(call("completion", greedy({{"n_predict", 4}})));
    const int first = base["tokens"][0];
    auto eng = svc_->engine();
    // [[id, false]] bans the greedy choice
    json banned = ok(call("completion", greedy({{"n_predict", 4}, {"logit_bias", json::array({json::array({first, false})})}})));
    EXPECT_NE(banned["tokens"][0].get<int>(), first);
    EXPECT_EQ(banned["generation_settings"]["logit_bias"][0], json({{"token", first}, {"bias", nullptr}}));  // llama-server's form
    // [["text", bias]] biases every token of the text
    const auto lily = eng->tokenize(" Lily was happy", false, false).value();
    json text = ok(call("completion", greedy({{"n_predict", 1}, {"logit_bias", json::array({json::array({" Lily was happy", -3})})}})));
    EXPECT_EQ(text["generation_settings"]["logit_bias"].size(), lily.size());
    // the object form: ids as keys, and text keys
    json obj = ok(call("completion", greedy({{"n_predict", 4}, {"logit_bias", {{std::to_string(first), false}, {" Lily", 2}}}})));
    EXPECT_NE(obj["tokens"][0].get<int>(), first);
    EXPECT_GE(obj["generation_settings"]["logit_bias"].size(), 2u);
    // a strong positive bias forces a token
    json forced = ok(call("completion", greedy({{"n_predict", 3}, {"logit_bias", json::array({json::array({100, 100})})}})));
    EXPECT_EQ(forced["tokens"], json::array({100, 100, 100}));
}

TEST_F(ServiceTest, NProbsShapes) {
    json r = ok(call("completion", greedy({{"n_probs", 3}, {"n_predict", 5}})));
    const json & cp = r["completion_probabilities"];
    ASSERT_EQ(cp.size(), 5u);
    for (size_t i = 0; i < cp.size(); ++i) {
        EXPECT_EQ(cp[i]["id"], r["tokens"][i]);
        EXPECT_TRUE(cp[i]["token"].is_string());
        EXPECT_TRUE(cp[i]["bytes"].is_array());
        EXPECT_LE(cp[i]["logprob"].get<double>(), 0.0);
        ASSERT_EQ(cp[i]["top_logprobs"].size(), 3u);
        EXPECT_GE(cp[i]["top_logprobs"][0]["logprob"].get<double>(), cp[i]["top_logprobs"][1]["logprob"].get<double>());
        EXPECT_EQ(cp[i]["top_logprobs"][0]["id"], cp[i]["id"]);  // greedy: the emitted token is the top one
    }
    json post = ok(call("completion", greedy({{"n_probs", 2}, {"n_predict", 3}, {"post_sampling_probs", true}})));
    const json & pp = post["completion_probabilities"];
    ASSERT_EQ(pp.size(), 3u);
    for (const json & t : pp) {
        EXPECT_FALSE(t.contains("logprob"));
        EXPECT_GE(t["prob"].get<double>(), 0.0);
        EXPECT_LE(t["prob"].get<double>(), 1.0);
        EXPECT_LE(t["top_probs"].size(), 2u);
        EXPECT_GE(t["top_probs"].size(), 1u);
    }
    json none = ok(call("completion", greedy({{"n_predict", 2}})));
    EXPECT_FALSE(none.contains("completion_probabilities"));
}

TEST_F(ServiceTest, StopStrings) {
    json full = ok(call("completion", greedy({{"n_predict", 24}})));
    const std::string text = full["content"];
    const size_t at = text.find("Lily");
    ASSERT_NE(at, std::string::npos) << text;
    json r = ok(call("completion", greedy({{"n_predict", 24}, {"stop", json::array({"Lily", "zebra"})}})));
    EXPECT_EQ(r["content"], text.substr(0, at));
    EXPECT_EQ(r["stop_type"], "word");
    EXPECT_EQ(r["stopping_word"], "Lily");
    EXPECT_TRUE(r["stopped_word"].get<bool>());
    EXPECT_FALSE(r["stopped_limit"].get<bool>());
    json one = ok(call("completion", greedy({{"n_predict", 24}, {"stop", "Lily"}})));  // a single string
    EXPECT_EQ(one["content"], r["content"]);
}

// ---- streaming and cancellation ----------------------------------------------------------------

TEST_F(ServiceTest, StreamingChunksConcatenateToTheResult) {
    std::vector<json> chunks;
    rpc::CallContext ctx;
    ctx.transport = rpc::Transport::NONE;
    ctx.id        = 7;
    ctx.notify    = [&](const std::string & m, const json & p) {
        EXPECT_EQ(m, "completion.chunk");
        EXPECT_EQ(p["id"], 7);
        chunks.push_back(p["data"]);
    };
    json r = ok(call("completion", greedy({{"stream", true}, {"n_predict", 20}, {"n_probs", 1}}), &ctx));
    ASSERT_GE(chunks.size(), 2u);
    std::string content;
    json toks = json::array();
    int last = 0;
    for (const json & c : chunks) {
        content += c["content"].get<std::string>();
        for (const json & t : c["tokens"]) toks.push_back(t);
        EXPECT_FALSE(c["stop"].get<bool>());
        EXPECT_GE(c["tokens_predicted"].get<int>(), last);
        last = c["tokens_predicted"];
        EXPECT_EQ(c["completion_probabilities"].size(), c["tokens"].size());
    }
    EXPECT_EQ(content, r["content"].get<std::string>());
    EXPECT_EQ(toks, r["tokens"]);
    EXPECT_EQ(last, r["tokens_predicted"].get<int>());
    // without a notify channel a streamed request is answered normally
    json plain = ok(call("completion", greedy({{"stream", true}, {"n_predict", 20}})));
    EXPECT_EQ(plain["content"], r["content"]);
}

TEST_F(ServiceTest, CancelAnswersWithThePartialResult) {
    rpc::CallContext ctx;
    ctx.transport = rpc::Transport::NONE;
    ctx.cancelled = std::make_shared<std::atomic<bool>>(false);  // the "connection" flag
    std::atomic<int> n_chunks{0};
    ctx.notify = [&](const std::string &, const json &) {
        if (++n_chunks == 3) ctx.cancelled->store(true);  // the client goes away mid-stream
    };
    const auto t0 = std::chrono::steady_clock::now();
    rpc::RpcError e = err(call("completion", greedy({{"stream", true}, {"n_predict", 200}, {"ignore_eos", true}}), &ctx));
    EXPECT_EQ(e.code, rpc::ERR_CANCELLED);
    ASSERT_TRUE(e.data.is_object());
    EXPECT_TRUE(e.data["cancelled"].get<bool>());
    EXPECT_GE(e.data["tokens_predicted"].get<int>(), 3);
    EXPECT_LT(e.data["tokens_predicted"].get<int>(), 200);
    EXPECT_FALSE(e.data["content"].get<std::string>().empty());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
    // the slot is free again at once
    json next = ok(call("completion", greedy({{"n_predict", 4}})));
    EXPECT_EQ(next["tokens_predicted"], 4);
    // a call cancelled before it starts is answered -32800 too
    rpc::CallContext pre;
    pre.cancelled = std::make_shared<std::atomic<bool>>(true);
    EXPECT_EQ(err(call("completion", greedy({{"n_predict", 50}}), &pre)).code, rpc::ERR_CANCELLED);
}

TEST_F(ServiceTest, ContextExceededUnlessTruncate) {
    std::string longp;
    for (int i = 0; i < 80; ++i) longp += "Lily saw a big red ball. ";
    rpc::RpcError e = err(call("completion", greedy({{"prompt", longp}})));
    EXPECT_EQ(e.code, rpc::ERR_CONTEXT_EXCEEDED);
    ASSERT_TRUE(e.data.is_object());
    EXPECT_GT(e.data["n_prompt_tokens"].get<int>(), kCtx);
    EXPECT_EQ(e.data["n_ctx"], kCtx);
    json r = ok(call("completion", greedy({{"prompt", longp}, {"truncate", true}, {"n_predict", 4}})));
    EXPECT_TRUE(r["truncated"].get<bool>());
    EXPECT_LT(r["tokens_evaluated"].get<int>(), kCtx);
    EXPECT_EQ(r["tokens_predicted"], 4);
}

// ---- other methods ---------------------------------------------------------------------------

TEST_F(ServiceTest, ChatWithoutTemplateFallsBackToChatml) {
    json msgs = json::array({{{"role", "user"}, {"content", "Tell me a story"}}});
    json r = ok(call("v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}, {"temperature", 0}}));
    EXPECT_EQ(r["object"], "chat.completion");
    // the prompt is chatml's "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n"
    json plain = ok(call("v1/completions", {{"prompt", "Tell me a story"}, {"max_tokens", 1}, {"temperature", 0}}));
    EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), plain["usage"]["prompt_tokens"].get<int>() + 10);
    EXPECT_EQ(err(call("v1/chat/completions", {{"messages", "hi"}})).code, rpc::ERR_INVALID_PARAMS);
    // no messages: the assistant prefix alone, as llama-server allows
    EXPECT_EQ(ok(call("v1/chat/completions", {{"messages", json::array()}, {"max_tokens", 1}}))["object"], "chat.completion");
    // the rendered prompt, through the apply_template method (POST /apply-template)
    json t = ok(call("apply_template", {{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                                  {{"role", "user"}, {"content", "Hi"}}})}}));
    EXPECT_EQ(t["prompt"], "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_TRUE(svc_->engine()->info().chat_template.empty());  // the stories models carry none
}

TEST_F(ServiceTest, OpenAICompletionsShape) {
    json r = ok(call("v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}}));
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r["choices"][0]["index"], 0);
    EXPECT_EQ(r["usage"]["completion_tokens"], 6);
    EXPECT_EQ(r["usage"]["total_tokens"].get<int>(),
              r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());
    EXPECT_TRUE(r["usage"]["completion_tokens_details"].contains("accepted_prediction_tokens"));
    json native = ok(call("completion", greedy({{"n_predict", 6}})));
    EXPECT_EQ(r["choices"][0]["text"], native["content"]);
    EXPECT_EQ(err(call("v1/completions", {{"prompt", "x"}, {"n", 0}})).code, rpc::ERR_INVALID_PARAMS);
    EXPECT_EQ(ok(call("v1/completions", {{"prompt", "x"}, {"n", 2}, {"max_tokens", 1}}))["choices"].size(), 2u);
    // the number of choices comes from `n` through its checks only: a "__n_choices" field is
    // unknown like any other, not a way around n's limit
    EXPECT_EQ(ok(call("v1/completions", {{"prompt", "x"}, {"__n_choices", 20}, {"max_tokens", 1}}))["choices"].size(), 1u);
}

TEST_F(ServiceTest, OpenAICompletionsLogprobs) {
    json r = ok(call("v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 3}}));
    const json & lp = r["choices"][0]["logprobs"];
    ASSERT_TRUE(lp.is_object()) << lp.dump();
    ASSERT_EQ(lp["tokens"].size(), 4u);
    ASSERT_EQ(lp["top_logprobs"].size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
        EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    }
    json none = ok(call("v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 2}}));
    EXPECT_TRUE(none["choices"][0]["logprobs"].is_null());
}

TEST_F(ServiceTest, SpeculativeFieldsReachTheEngine) {
    const std::string rep = "Lily saw a red ball. Lily saw a red ball. Lily saw a red ball. Lily saw a red ball. Lily saw a";
    json r = ok(call("completion", {{"prompt", rep}, {"n_predict", 24}, {"temperature", 0},
                                    {"speculative", {{"type", "lookup"}, {"n_max", 4}, {"adaptive", false}}}}));
    const json & t = r["timings"];
    EXPECT_GT(t["draft_n"].get<int>(), 0) << t.dump();
    EXPECT_GT(t["draft_n_steps"].get<int>(), 0);
    EXPECT_LE(t["draft_n_accepted"].get<int>(), t["draft_n"].get<int>());
    EXPECT_EQ(r["generation_settings"]["speculative"]["type"], json::array({"lookup"}));
    EXPECT_EQ(r["generation_settings"]["speculative"]["n_max"], 4);
    // greedy output is the same with and without speculation
    json plain = ok(call("completion", {{"prompt", rep}, {"n_predict", 24}, {"temperature", 0}}));
    EXPECT_EQ(plain["content"], r["content"]);
    EXPECT_EQ(plain["timings"]["draft_n"], 0);
    // llama-server's flat keys work too
    json flat = ok(call("completion", {{"prompt", rep}, {"n_predict", 8}, {"temperature", 0},
                                       {"speculative", {{"type", json::array({"ngram", "lookup"})}}},
                                       {"speculative.n_max", 3}}));
    EXPECT_EQ(flat["generation_settings"]["speculative.n_max"], 3);
    EXPECT_EQ(flat["generation_settings"]["speculative"]["type"], json::array({"ngram", "lookup"}));
    // p_min left to the engine reads -1 (the learned stop for greedy drafts); a value given is
    // kept (below -1 is refused: EveryFiniteHardLimitRejectsAndNamesItsParam)
    EXPECT_DOUBLE_EQ(flat["generation_settings"]["speculative.p_min"].get<double>(), -1.0);
    EXPECT_DOUBLE_EQ(flat["generation_settings"]["speculative"]["p_min"].get<double>(), -1.0);
    json given = ok(call("completion", {{"prompt", rep}, {"n_predict", 2}, {"temperature", 0}, {"speculative.p_min", 0.3}}));
    EXPECT_NEAR(given["generation_settings"]["speculative.p_min"].get<double>(), 0.3, 1e-6);
}

TEST_F(ServiceTest, TokenizeDetokenizeHealthPropsMetrics) {
    json t = ok(call("tokenize", {{"content", "Once upon a time"}, {"add_special", true}}));
    ASSERT_GE(t["tokens"].size(), 2u);
    EXPECT_EQ(t["tokens"][0], svc_->engine()->info().bos);
    json pieces = ok(call("tokenize", {{"content", "Once upon"}, {"with_pieces", true}}));
    EXPECT_EQ(pieces["tokens"][0]["piece"], " Once");
    json d = ok(call("detokenize", {{"tokens", json::array({403, 407})}}));
    EXPECT_EQ(d["content"], "Once upon");  // SPM drops the leading space, as llama-server does
    rpc::RpcError bad = err(call("detokenize", {{"tokens", json::array({1, 512})}}));
    EXPECT_EQ(param_of(bad), "tokens");
    EXPECT_EQ(param_of(err(call("tokenize", {{"content", 5}}))), "content");
    EXPECT_EQ(ok(call("health", json::object()))["status"], "ok");
    json props = ok(call("props", json::object()));
    EXPECT_EQ(props["n_ctx"], kCtx);
    EXPECT_EQ(props["total_slots"], 2);
    EXPECT_TRUE(props["default_generation_settings"]["params"].contains("temperature"));
    json m = ok(call("metrics", json::object()));
    EXPECT_GT(m["tokens_predicted_total"].get<int>(), 0);
    json prom = ok(call("metrics", {{"format", "prometheus"}}));
    const std::string text = prom["__raw_body"];
    EXPECT_NE(text.find("llamacpp:tokens_predicted_total "), std::string::npos);
    EXPECT_NE(text.find("llamacpp:spec_decode_num_draft_tokens_total "), std::string::npos);
    EXPECT_EQ(ok(call("slots", json::object())).size(), 2u);
    EXPECT_TRUE(d_->has_method("get_completion"));
    EXPECT_EQ(ok(call("get_completion", greedy({{"n_predict", 2}})))["tokens_predicted"], 2);
    EXPECT_EQ(ok(call("poll_system_status", json::object()))["init_success"], true);
}

TEST_F(ServiceTest, InitIsRefusedOverHttpUnlessAllowed) {
    rpc::CallContext http;
    http.transport = rpc::Transport::HTTP;
    EXPECT_EQ(err(call("init", {{"model", "/x.gguf"}}, &http)).code, rpc::ERR_METHOD_NOT_FOUND);
    EXPECT_EQ(err(call("deinit", json::object(), &http)).code, rpc::ERR_METHOD_NOT_FOUND);
    EXPECT_EQ(ok(call("health", json::object()))["status"], "ok");  // still loaded
}

// ---- without an engine, and init's arguments ---------------------------------------------------

TEST(ServiceNoEngine, MethodsAnswerLoadingErrors) {
    Service svc;
    rpc::Dispatcher d;
    svc.register_methods(d);
    rpc::CallContext ctx;
    for (const char * m : {"completion", "tokenize", "health", "props", "metrics", "v1/completions"}) {
        auto r = d.call(m, {{"prompt", "x"}, {"content", "x"}}, ctx);
        ASSERT_TRUE(std::holds_alternative<rpc::RpcError>(r)) << m;
        const auto & e = std::get<rpc::RpcError>(r);
        EXPECT_EQ(e.code, rpc::ERR_LOADING) << m;
        EXPECT_EQ(e.data["status"], "unloaded");
        EXPECT_TRUE(e.data.contains("loading_progress"));
    }
    // a failed load is reported with its reason, and the service stays usable
    auto r = d.call("init", {{"model", "/nonexistent/m.gguf"}}, ctx);
    ASSERT_TRUE(std::holds_alternative<rpc::RpcError>(r));
    json st = svc.status();
    EXPECT_FALSE(st["init_success"].get<bool>());
    EXPECT_NE(st["error"].get<std::string>().find("/nonexistent/m.gguf"), std::string::npos);
    auto h = d.call("health", json::object(), ctx);
    EXPECT_EQ(std::get<rpc::RpcError>(h).data["status"], "error");
    // init over the C ABI / stdio: load, then deinit
    auto r2 = d.call("init", {{"model", test::model_path("stories260K-F32.gguf")}, {"ctx_size", 128}, {"threads", 1}}, ctx);
    ASSERT_TRUE(std::holds_alternative<json>(r2)) << std::get<rpc::RpcError>(r2).message;
    EXPECT_TRUE(std::get<json>(r2)["init_success"].get<bool>());
    EXPECT_EQ(svc.engine()->info().n_ctx_slot, 128);
    d.call("deinit", json::object(), ctx);
    EXPECT_EQ(svc.state(), LoadState::EMPTY);
}

// The options table stays one table: each flag, JSON key and environment variable names one row,
// every settable row takes a value of its type through init's JSON, and its default reads back.
TEST(ServerOptionsTable, SpellingsAreUniqueAndEveryInitRowApplies) {
    std::map<std::string, std::string> seen;  // spelling -> row key
    for (const ServerOption & o : server_options()) {
        std::vector<std::string> names;
        for (const char * f : o.flags) names.push_back(f[0] == '!' ? f + 1 : f);
        if (o.type != OptType::IGNORED) {
            names.push_back(std::string("key:") + o.key);
            for (const char * a : o.aliases) names.push_back(std::string("key:") + a);
        }
        if (o.env) names.push_back(std::string("env:") + o.env);
        for (const std::string & n : names) {
            auto [it, fresh] = seen.emplace(n, o.key);
            EXPECT_TRUE(fresh) << n << " in rows " << it->second << " and " << o.key;
        }
        if (!(o.where & IN_INIT) || o.type == OptType::IGNORED) continue;
        json v;
        switch (o.type) {
            case OptType::STR: v = "x"; break;
            case OptType::INT: case OptType::FLOAT: v = std::max(o.lo, std::min(o.hi, 1.0)); break;
            case OptType::BOOL: v = true; break;
            case OptType::CHOICE: v = o.choices.front(); break;
            default: v = json::array({"ngram"}); break;
        }
        ServerConfig c;
        EXPECT_TRUE(option_apply(o, o.key, v, c).is_ok()) << o.key << " = " << v.dump();
        if (o.get) {
            EXPECT_FALSE(o.get(ServerConfig{}).is_null()) << o.key;
        }
    }
}

TEST(ServiceInitArgs, CommandLineAndJson) {
    auto a = parse_load_config("llama-server -m /m.gguf -md '/d d.gguf' -c 512 -np 2 -t 3 --spec-type draft,lookup "
                               "--draft-max 6 --draft-p-min 0.5 --port 9 --metrics --alias=story");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(a->engine.target.path, "/m.gguf");
    EXPECT_EQ(a->engine.draft.path, "/d d.gguf");
    EXPECT_EQ(a->engine.n_ctx, 256);  // -c is the total, split over the 2 slots as in llama-server
    EXPECT_EQ(a->engine.n_parallel, 2);
    EXPECT_EQ(a->engine.n_threads, 3);
    EXPECT_EQ(a->spec.types, (std::vector<SpecType>{SpecType::DRAFT, SpecType::LOOKUP}));
    EXPECT_EQ(a->spec.n_max, 6);
    EXPECT_FLOAT_EQ(a->spec.p_min, 0.5f);
    auto auto_p = parse_load_config("-m /m.gguf --draft-p-min -1");  // -1 = the engine's default, as unset
    ASSERT_TRUE(auto_p.is_ok()) << auto_p.status().to_string();
    EXPECT_FLOAT_EQ(auto_p->spec.p_min, SpecParams{}.p_min);
    EXPECT_EQ(a->model_alias, "story");
    auto j = parse_load_config(R"({"model": "/m.gguf", "ctx_size": 256, "parallel": 3, "spec_type": ["ngram"]})");
    ASSERT_TRUE(j.is_ok()) << j.status().to_string();
    EXPECT_EQ(j->engine.n_ctx, 85);  // 256 over 3 slots
    EXPECT_EQ(j->engine.n_parallel, 3);
    EXPECT_EQ(j->spec.types, std::vector<SpecType>{SpecType::NGRAM});
    auto md = parse_load_config("-m /m.gguf");  // auto: no draft, no speculation
    ASSERT_TRUE(md.is_ok());
    EXPECT_TRUE(md->spec.types.empty());
    EXPECT_EQ(md->engine.n_tree_max, 1);  // chains: a single-sequence KV cache
    auto tr = parse_load_config("-m /m.gguf -md /d.gguf --draft-branches 3");
    ASSERT_TRUE(tr.is_ok());
    EXPECT_EQ(tr->spec.n_parallel, 3);
    EXPECT_EQ(tr->engine.n_tree_max, 3);  // the default tree shape reserves its branches
    auto tm = parse_load_config("-m /m.gguf -md /d.gguf --draft-branches 2 --tree-max 5");
    ASSERT_TRUE(tm.is_ok());
    EXPECT_EQ(tm->engine.n_tree_max, 5);
    auto fa = parse_load_config("-m /m.gguf -fa off");  // -fa sets both models, as llama-server's
    ASSERT_TRUE(fa.is_ok()) << fa.status().to_string();
    EXPECT_EQ(fa->engine.flash_attn, 0);
    EXPECT_EQ(fa->engine.draft_flash_attn, 0);
    auto fad = parse_load_config(R"({"model": "/m.gguf", "flash_attn": "on", "draft_flash_attn": "off"})");
    ASSERT_TRUE(fad.is_ok()) << fad.status().to_string();
    EXPECT_EQ(fad->engine.flash_attn, 1);
    EXPECT_EQ(fad->engine.draft_flash_attn, 0);
    EXPECT_EQ(md->engine.flash_attn, -1);  // auto: measured when the engine is created
    EXPECT_EQ(md->engine.draft_flash_attn, -1);

    const std::vector<std::pair<std::string, std::string>> bad = {
        {"-m /m.gguf --bogus 3", "--bogus"},
        {"-m /m.gguf -c big", "-c"},
        {"-m /m.gguf -c", "-c"},
        {"-c 512", "model"},
        {"-m /m.gguf --spec-type draft", "spec_type"},  // no draft model
        {"-m /m.gguf --spec-type warp", "spec_type"},
        {"-m '/m.gguf", "cmd"},
        {R"({"model": 5})", "model"},
        {R"({"model": "/m.gguf", "ctx_size": -1})", "ctx_size"},
        {R"({"model": "/m.gguf", "parallel": 1.5})", "parallel"},
        {R"({"model": "/m.gguf", "colour": "red"})", "colour"},
        {"-m /m.gguf -fa maybe", "flash_attn"},
        {R"({"model": "/m.gguf", "draft_flash_attn": true})", "draft_flash_attn"},
        {R"({"model": )", "cmd"},
        {"", "cmd"},
    };
    for (const auto & [text, param] : bad) {
        auto r = parse_load_config(text);
        ASSERT_FALSE(r.is_ok()) << text;
        EXPECT_EQ(r.status().param(), param) << text << ": " << r.status().message();
    }
    // one parser and one message for a drafter list, whether it comes from the command line or a request
    auto warp = parse_load_config("-m /m.gguf --spec-type lookup,warp");
    ASSERT_FALSE(warp.is_ok());
    std::vector<SpecType> types;
    const Status direct = spec_types_parse("lookup,warp", &types);
    EXPECT_EQ(warp.status().message(), direct.message());
    EXPECT_NE(direct.message().find("'warp'"), std::string::npos);
    EXPECT_NE(direct.message().find("suffix"), std::string::npos);
    ASSERT_TRUE(spec_types_parse("ngram-mod, draft,none", &types).is_ok());
    EXPECT_EQ(types, (std::vector<SpecType>{SpecType::LOOKUP, SpecType::DRAFT}));
}
