// `specrpc lookup create|merge|stats`: n-gram caches for lookup decoding, like llama.cpp's
// lookup-create / lookup-merge / lookup-stats. Only the model's vocabulary is needed.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "speculative/ngram_cache.h"
#include "speculative/prompt_lookup.h"
#include "tools.h"

namespace specrpc::cli {

static Result<std::vector<token_id>> tokenize_file(const std::string & model_path, const std::string & file) {
    std::ifstream f(file, std::ios::binary);
    if (!f) return Status(ErrorCode::NOT_FOUND, "cannot read '" + file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    ModelParams mp;
    mp.path = model_path;
    auto m = Model::load(mp);
    if (!m) return m.status();
    return tokenize_text(*m.value(), ss.str(), true, false);
}

int cmd_lookup(int argc, char ** argv) {
    CLI::App app{"specrpc lookup: build, merge and evaluate n-gram caches"};
    app.require_subcommand(1);
    std::string model, file, out, dyn, stat;
    std::vector<std::string> inputs;
    int ngram_min = 1, ngram_max = 4, n_draft = 8;
    auto * create = app.add_subcommand("create", "build an n-gram cache from a text corpus");
    create->add_option("-m,--model", model, "model whose vocabulary tokenizes the corpus")->required();
    create->add_option("-f,--file", file, "corpus text file")->required();
    create->add_option("-o,--output,--lookup-cache-static", out, "cache file to write")->required();
    create->add_option("--ngram-min", ngram_min)->capture_default_str();
    create->add_option("--ngram-max", ngram_max)->capture_default_str();
    auto * merge = app.add_subcommand("merge", "merge caches: OUT IN1 IN2 ...");
    merge->add_option("output", out, "merged cache file")->required();
    merge->add_option("inputs", inputs, "caches to merge")->required();
    auto * stats = app.add_subcommand("stats", "replay a corpus: how much would n-gram lookup draft and accept");
    stats->add_option("-m,--model", model, "model whose vocabulary tokenizes the corpus")->required();
    stats->add_option("-f,--file", file, "corpus text file")->required();
    stats->add_option("--lookup-cache-static", stat, "static cache (alias -lcs)");
    stats->add_option("--lookup-cache-dynamic", dyn, "dynamic cache (alias -lcd)");
    stats->add_option("--draft-max", n_draft, "max draft length")->capture_default_str();
    stats->add_option("--ngram-min", ngram_min)->capture_default_str();
    stats->add_option("--ngram-max", ngram_max)->capture_default_str();
    try {
        app.parse(translate_args(argc, argv));
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    auto die = [](const Status & st) { std::fprintf(stderr, "error: %s\n", st.message().c_str()); return 1; };

    if (*create) {
        auto toks = tokenize_file(model, file);
        if (!toks) return die(toks.status());
        NgramCache c(ngram_min, ngram_max);
        c.update(toks.value(), toks.value().size());
        if (Status st = c.save(out); !st) return die(st);
        std::fprintf(stderr, "%zu tokens -> %zu n-grams, %zu pairs -> %s\n", toks.value().size(), c.size(), c.n_pairs(), out.c_str());
        return 0;
    }
    if (*merge) {
        NgramCache acc;
        bool first = true;
        for (const auto & in : inputs) {
            auto c = NgramCache::load(in);
            if (!c) return die(c.status());
            if (first) { acc = std::move(c.value()); first = false; }
            else acc.merge(c.value());
        }
        if (Status st = acc.save(out); !st) return die(st);
        std::fprintf(stderr, "merged %zu caches: %zu n-grams -> %s\n", inputs.size(), acc.size(), out.c_str());
        return 0;
    }
    auto toks = tokenize_file(model, file);
    if (!toks) return die(toks.status());
    NgramCache dc, sc;
    if (!dyn.empty()) { auto c = NgramCache::load(dyn); if (!c) return die(c.status()); dc = std::move(c.value()); }
    if (!stat.empty()) { auto c = NgramCache::load(stat); if (!c) return die(c.status()); sc = std::move(c.value()); }
    NgramDraftParams p;
    p.ngram_min = ngram_min;
    p.ngram_max = ngram_max;
    const size_t n_prompt = std::min<size_t>(toks.value().size(), 1);
    LookupReplayStats s = ngram_replay(toks.value(), dyn.empty() ? nullptr : &dc, stat.empty() ? nullptr : &sc, p, n_draft, n_prompt);
    std::printf("tokens     %zu\nn_draft    %llu\nn_accept   %llu\naccept     %.3f%%\nsteps      %llu\ntokens/step %.3f\ndraft time %.3f ms\n",
                toks.value().size(), (unsigned long long)s.n_drafted, (unsigned long long)s.n_accepted,
                100.0 * s.acceptance_rate(), (unsigned long long)s.n_steps, s.tokens_per_step(), s.draft_us / 1e3);
    return 0;
}

}  // namespace specrpc::cli
