#include "cli_common.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace specrpc::cli {

std::vector<std::string> translate_args(int argc, char ** argv) {
    static const std::pair<const char *, const char *> table[] = {
        {"-md", "--model-draft"}, {"-ngl", "--n-gpu-layers"}, {"-np", "--parallel"},
        {"-lcs", "--lookup-cache-static"}, {"-lcd", "--lookup-cache-dynamic"}, {"-fa", "--flash-attn"},
        {"-fad", "--flash-attn-draft"}, {"-ub", "--ubatch-size"}, {"-ctk", "--cache-type-k"},
        {"-ctv", "--cache-type-v"}, {"-cb", "--cont-batching"}, {"-cnv", "--conversation"}};
    std::vector<std::string> out;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        bool known = false;
        for (const auto & [from, to] : table)
            if (s == from) { s = to; known = true; }
        // CLI11 reads an unknown "-tb" as "-t b" (--threads = b): name the flag instead.
        const bool multi_letter = s.size() > 2 && s[0] == '-' &&
                                  std::all_of(s.begin() + 1, s.end(), [](char c) { return std::isalpha((unsigned char)c); });
        if (!known && multi_letter) throw CLI::ExtrasError({s});
        out.push_back(s);
    }
    std::reverse(out.begin(), out.end());  // CLI11 parses a reversed vector
    return out;
}

void add_model_flags(CLI::App & app, CommonArgs & a) {
    auto & e = a.engine;
    app.add_option("-m,--model", e.target.path, "target model (GGUF)")->required();
    app.add_option("--model-draft", e.draft.path, "draft model (GGUF), alias -md");
    app.add_option("-c,--ctx-size", e.n_ctx,
                   "context size, 0 = model's training context (serve: the total, split over the slots, as llama-server)")
        ->capture_default_str();
    app.add_option("-b,--batch-size", e.n_batch, "max tokens per decode call")->capture_default_str();
    app.add_option("-t,--threads", e.n_threads, "threads, 0 = all cores")->capture_default_str();
    app.add_option("--n-gpu-layers", e.target.n_gpu_layers, "layers offloaded to the GPU, alias -ngl")->capture_default_str();
    app.add_flag("--no-mmap{false}", e.target.use_mmap, "do not memory-map the model");
    app.add_option("--rpc", e.target.rpc_servers,
                   "llama.cpp rpc-server workers HOST:PORT[,HOST:PORT...] the target's layers are split over "
                   "(-ngl then counts the layers sent, 0 = all); the draft stays local")
        ->delimiter(',');
    app.add_flag("--kv-f32", e.kv_f32, "F32 KV cache (bit-stable logits)");
    app.add_option("--lookup-cache-max-mb", e.ngram_cache_max_mb,
                   "memory cap of the dynamic n-gram cache in MiB (~100 bytes per n-gram; rare ones are "
                   "evicted first; 0 = none kept)")->capture_default_str();
    static const std::map<std::string, int32_t> fa_values{{"auto", -1}, {"off", 0}, {"on", 1}};
    app.add_option("--flash-attn", e.flash_attn,
                   "flash attention on|off|auto, alias -fa (auto: on for attention heads of 32 or more)")
        ->transform(CLI::CheckedTransformer(fa_values))->default_str("auto");
    e.draft_flash_attn = -2;  // as --flash-attn unless given (finalize)
    app.add_option("--flash-attn-draft", e.draft_flash_attn, "flash attention for the draft model, alias -fad (default: as --flash-attn)")
        ->transform(CLI::CheckedTransformer(fa_values));
    app.add_option("--tree-max", e.n_tree_max, "draft-tree branches reserved per slot (KV sequences); 1 = chains and a non-unified KV cache when -np 1")
        ->capture_default_str()->check(CLI::Range(1, 16));
    app.add_option("--log-level", a.log_level, "debug|info|warn|error|none")->capture_default_str();
}

void add_sampling_flags(CLI::App & app, CommonArgs & a) {
    auto & s = a.sampling;
    app.add_option("--temp", s.temperature, "temperature; 0 = greedy")->capture_default_str();
    app.add_option("--top-k", s.top_k, "top-k, <= 0 = off")->capture_default_str();
    app.add_option("--top-p", s.top_p, "top-p, 1 = off")->capture_default_str();
    app.add_option("--min-p", s.min_p, "min-p, 0 = off")->capture_default_str();
    app.add_option("--typical", s.typical_p, "typical-p, 1 = off")->capture_default_str();
    app.add_option("--repeat-penalty", s.repeat_penalty, "repetition penalty, 1 = off")->capture_default_str();
    app.add_option("--repeat-last-n", s.repeat_last_n, "tokens the penalties look at, -1 = context")->capture_default_str();
    app.add_option("--presence-penalty", s.presence_penalty, "presence penalty")->capture_default_str();
    app.add_option("--frequency-penalty", s.frequency_penalty, "frequency penalty")->capture_default_str();
    app.add_option("--mirostat", s.mirostat, "mirostat 0|1|2 (disables speculation)")->capture_default_str();
    app.add_option("--mirostat-ent", s.mirostat_tau, "mirostat target entropy tau")->capture_default_str();
    app.add_option("--mirostat-lr", s.mirostat_eta, "mirostat learning rate eta")->capture_default_str();
    app.add_option("-s,--seed", s.seed, "RNG seed, 4294967295 = random")->capture_default_str();
    app.add_flag("--ignore-eos", s.ignore_eos, "do not stop at end-of-sequence");
    app.add_option("--grammar", s.grammar, "GBNF grammar");
    app.add_option("--grammar-file", a.grammar_file, "file with a GBNF grammar");
    app.add_option("--n-probs", s.n_probs, "top-n probabilities per token")->capture_default_str();
}

void add_spec_flags(CLI::App & app, CommonArgs & a) {
    auto & sp = a.spec;
    app.add_option("--spec-type", a.spec_types, "drafters tried in order: draft,ngram,lookup,synth,none (auto: draft if -md)")
        ->capture_default_str();
    app.add_option("--draft-max,--draft-n,--spec-draft-n-max", sp.n_max, "max draft length")->capture_default_str();
    app.add_option("--draft-min,--spec-draft-n-min", sp.n_min, "min draft length")->capture_default_str();
    app.add_option("--draft-p-min,--spec-draft-p-min", sp.p_min, "stop drafting below this draft probability")->capture_default_str();
    app.add_option("--draft-p-split", sp.p_split, "tree: branch where a further candidate's p exceeds this")->capture_default_str();
    app.add_option("--draft-branches", sp.n_parallel, "tree: max branches per slot (1 = chain)")->capture_default_str();
    app.add_flag("--no-adaptive{false}", sp.adaptive, "fixed draft length (n_max) instead of the cost-model choice");
    app.add_flag("--sample-and-compare", sp.sample_and_compare, "T>0: greedy draft verified one-hot (llama.cpp's way)");
    app.add_option("--spec-verifier", sp.verifier, "T>0: 0 auto (coupled if --seed, else block), 1 token-wise, 2 block, 3 coupled")
        ->check(CLI::Range(0, 3));
    app.add_option("--ngram-min", sp.ngram_min, "shortest n-gram / lookup match")->capture_default_str();
    app.add_option("--ngram-max", sp.ngram_max, "longest n-gram / lookup match")->capture_default_str();
    app.add_option("--spec-synth-rates", sp.synth_rates, "synthetic drafter: per-position acceptance (tests/benchmarks)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',');
    app.add_option("--lookup-cache-static", a.lookup_static, "static n-gram cache file, alias -lcs");
    app.add_option("--lookup-cache-dynamic", a.lookup_dynamic, "dynamic n-gram cache file, alias -lcd");
}

Status finalize(CommonArgs & a) {
    if (a.engine.draft_flash_attn == -2) a.engine.draft_flash_attn = a.engine.flash_attn;
    if (a.log_level == "debug") log_set_level(LogLevel::DEBUG);
    else if (a.log_level == "warn") log_set_level(LogLevel::WARN);
    else if (a.log_level == "error") log_set_level(LogLevel::ERROR);
    else if (a.log_level == "none") log_set_level(LogLevel::NONE);
    if (!a.grammar_file.empty()) {
        std::ifstream f(a.grammar_file);
        if (!f) return invalid_arg("cannot read grammar file '" + a.grammar_file + "'", "grammar-file");
        std::stringstream ss;
        ss << f.rdbuf();
        a.sampling.grammar = ss.str();
    }
    a.spec.types.clear();
    if (a.spec_types == "auto") {
        if (!a.engine.draft.path.empty()) a.spec.types = {SpecType::DRAFT};
    } else {
        std::stringstream ss(a.spec_types);
        std::string t;
        while (std::getline(ss, t, ',')) {
            SpecType st;
            if (!spec_type_from_name(t, &st)) return invalid_arg("unknown --spec-type '" + t + "'", "spec-type");
            if (st != SpecType::NONE) a.spec.types.push_back(st);
        }
    }
    if (a.spec.n_parallel < 1 || a.spec.n_parallel > 16)
        return invalid_arg("--draft-branches must be in [1, 16]", "draft-branches");
    // a default tree shape reserves its branches (--draft-branches 3 works without --tree-max 3)
    a.engine.n_tree_max = std::max(a.engine.n_tree_max, a.spec.n_parallel);
    a.engine.draft.n_gpu_layers = a.engine.target.n_gpu_layers;
    return Status::ok();
}

Result<std::unique_ptr<Engine>> load_engine(CommonArgs & a) {
    int last = -1;
    a.engine.on_progress = [&last](float p, const std::string & what) {
        int pct = static_cast<int>(p * 100);
        if (pct / 5 != last / 5) {
            std::fprintf(stderr, "\rloading %-6s %3d%%", what.c_str(), pct);
            if (pct >= 100) std::fprintf(stderr, "\n");
            last = pct;
        }
        return true;
    };
    auto e = Engine::create(a.engine);
    if (last >= 0 && last < 100) std::fprintf(stderr, "\n");
    if (!e) return e;
    if (!a.lookup_static.empty())
        if (Status st = e.value()->load_ngram_cache(a.lookup_static, false); !st) return st;
    if (!a.lookup_dynamic.empty()) {
        Status st = e.value()->load_ngram_cache(a.lookup_dynamic, true);
        if (!st && st.code() != ErrorCode::NOT_FOUND) return st;
    }
    e.value()->set_default_spec(a.spec);
    return e;
}

}  // namespace specrpc::cli
