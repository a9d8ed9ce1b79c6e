// `specrpc generate`: one completion, text streamed to stdout; load progress, statistics and
// speeds to stderr. --color paints accepted draft tokens by the branch they came from.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "common/log.h"
#include "tools.h"

namespace specrpc::cli {

static const char * kBranchColors[] = {"\033[32m", "\033[36m", "\033[33m", "\033[35m", "\033[34m", "\033[31m"};

int cmd_generate(int argc, char ** argv) {
    CLI::App app{"specrpc generate: complete a prompt, optionally with speculative decoding"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as llama.cpp: the last one wins
    CommonArgs a;
    std::string prompt, prompt_file;
    int32_t n_predict = 128;
    bool color = false, display_prompt = true, no_bos = false;
    std::vector<std::string> stops;
    add_options(app, a, server::IN_TOOLS);
    app.add_option("-p,--prompt", prompt, "prompt text");
    app.add_option("-f,--file", prompt_file, "read the prompt from a file");
    app.add_option("-n,--n-predict", n_predict, "tokens to generate, -1 = until EOS")->capture_default_str();
    app.add_option("--stop", stops, "stop string (repeatable)")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_flag("--color", color, "colour accepted draft tokens by branch");
    app.add_flag("--no-display-prompt{false}", display_prompt, "do not echo the prompt");
    app.add_flag("--no-bos", no_bos, "do not add BOS");
    try {
        app.parse(translate_args(argc, argv));
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    if (Status st = finalize(a); !st) { std::fprintf(stderr, "error: %s\n", st.message().c_str()); return 1; }
    if (!prompt_file.empty()) {
        std::ifstream f(prompt_file);
        if (!f) { std::fprintf(stderr, "error: cannot read %s\n", prompt_file.c_str()); return 1; }
        std::stringstream ss;
        ss << f.rdbuf();
        prompt = ss.str();
    }
    // One request per process: the suffix drafter's store of finished responses serves later
    // requests, and there are none (recording this one cost 1-3 ms before the process could end).
    a.engine.suffix_cache_max_mb = 0;
    auto eng = load_engine(a);
    if (!eng) { std::fprintf(stderr, "error: %s\n", eng.status().message().c_str()); return 1; }
    Engine & e = *eng.value();

    auto toks = e.tokenize(prompt, e.info().add_bos && !no_bos, false);
    if (!toks) { std::fprintf(stderr, "error: %s\n", toks.status().message().c_str()); return 1; }
    CompletionRequest req;
    req.prompt    = toks.value();
    req.n_predict = n_predict;
    req.stop      = stops;
    req.stream    = true;
    req.sampling  = a.sampling;
    req.spec      = a.spec;
    if (display_prompt) { std::fputs(prompt.c_str(), stdout); std::fflush(stdout); }
    auto res = e.complete(req, [&](const CompletionChunk & c) {
        if (color) {
            // colour by the source of the chunk's (single) token: target = plain
            int32_t src = c.tokens.empty() ? 0 : c.tokens.front().source;
            if (src > 0) std::fputs(kBranchColors[(src - 1) % 6], stdout);
            std::fputs(c.content.c_str(), stdout);
            if (src > 0) std::fputs("\033[0m", stdout);
        } else {
            std::fputs(c.content.c_str(), stdout);
        }
        std::fflush(stdout);
    });
    std::fputs("\n", stdout);
    if (!res) { std::fprintf(stderr, "error: %s\n", res.status().message().c_str()); return 1; }
    const auto & r = res.value();
    const auto & t = r.timings;
    std::fprintf(stderr, "\nencoded %4d tokens in %8.2f ms, %8.2f t/s (%d cached)\n", t.prompt_n, t.prompt_ms,
                 t.prompt_per_second(), r.tokens_cached);
    std::fprintf(stderr, "decoded %4d tokens in %8.2f ms, %8.2f t/s (stop: %s)\n", t.predicted_n, t.predicted_ms,
                 t.predicted_per_second(), stop_type_name(r.stop_type));
    if (r.spec.draft_n_steps > 0 || !req.spec.types.empty()) {
        const auto & s = r.spec;
        std::fprintf(stderr, "n_draft   = %lld (steps %lld, target passes %lld, off rounds %lld)\n",
                     (long long)s.draft_n, (long long)s.draft_n_steps, (long long)s.n_steps, (long long)s.n_off_rounds);
        std::fprintf(stderr, "n_accept  = %lld\naccept    = %.3f%%\nmean accepted length = %.3f\n",
                     (long long)s.draft_n_accepted, 100.0 * s.accept_rate(), s.mean_accept_len());
        std::fprintf(stderr, "time: draft %.1f ms, verify %.1f ms, sample %.1f ms\n", s.t_draft_ms, s.t_verify_ms, s.t_sample_ms);
        std::string pos;
        for (size_t i = 0; i < s.drafted_at_pos.size(); ++i)
            pos += " " + std::to_string(s.accepted_at_pos[i]) + "/" + std::to_string(s.drafted_at_pos[i]);
        if (!pos.empty()) std::fprintf(stderr, "accepted/drafted per position:%s\n", pos.c_str());
        std::string g;
        for (size_t i = 0; i < s.gamma_hist.size(); ++i)
            if (s.gamma_hist[i]) g += " " + std::to_string(i) + ":" + std::to_string(s.gamma_hist[i]);
        if (!g.empty()) std::fprintf(stderr, "draft length chosen (gamma:rounds):%s\n", g.c_str());
        // the cost model the policy ends with: the start-up probe, refined by this run's passes
        const CostCurve cc = e.cost_curve();
        if (!cc.v.empty()) {
            std::string vs;
            for (size_t n : {2, 4, 8, 16})
                if (n < cc.v.size()) vs += " v(" + std::to_string(n) + ")=" + std::to_string(cc.v[n]).substr(0, 4);
            std::fprintf(stderr, "cost model: t(1)=%.2f ms%s c=%.3f o=%.3f\n", cc.t1_ms, vs.c_str(), cc.c, cc.o);
        }
    }
    if (!a.lookup_dynamic.empty()) {
        if (Status st = e.save_ngram_cache(a.lookup_dynamic); !st)
            std::fprintf(stderr, "warning: %s\n", st.message().c_str());
    }
    // The process ends here, so the engine is not torn down: freeing the KV cache and the compute
    // buffers, unmapping the model and joining the threads is work the kernel does at exit anyway.
    // Everything worth keeping is written by now: the output, the n-gram cache above, the cost
    // cache as it was measured. ASan builds tear down, so their leak check sees the engine freed;
    // so does a run at debug level, whose engine thread logs each round after handing its tokens
    // on (the last round's line would be lost to the exit).
#if !defined(__SANITIZE_ADDRESS__)
    if (log_get_level() != LogLevel::DEBUG) {
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(0);
    }
#endif
    return 0;
}

}  // namespace specrpc::cli
