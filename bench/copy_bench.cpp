// The copy-heavy benchmark (issue 18 part 1): warm, in-process tokens/s of plain decoding against
// prompt lookup, the n-gram caches, a draft model (matched and mismatched) and a chain (lookup
// first, then the draft model) on stories260K-copy-x100M-Q8_0, a target that continues passages it
// has seen (../shared/models/MANIFEST.md), next to the speed-up the cost model predicts from the
// engine's measured cost curve and the acceptance by depth.
//
//   copy_bench [--models DIR] [--tokens N] [--reps N] [--threads N] [--temps 0,0.8]
//              [--configs plain,lookup,lookup-n16,lookup-n64,lookup16,lookup32,ngram,draft,draft260K,chain,suffix,suffix-n64,draft-nostop,draft260K-nostop,chain-nostop] [--kinds repeat,middle,edit,list,ordinary]
//              [--dump-prompts DIR] [--lookup-min N] [--replay] [--passages base|target]
//
// Prompts: passages written by stories260K-F32 (seeded, T=0.8, from story openings: text the target
// did not write, as a document given to a model is; the copy target's makers measured its copying
// on such samples) and a few written ones (lists, stories), each given once and then repeated (the
// passage plus the start of its repetition), resumed from its middle, or restarted with a light
// edit (a name changed); plus ordinary story openings. --passages target has the copy target write
// the passages instead: its copy circuit makes its own samples loop ("Fred lived in a small house
// with the room." three times), a loop sends its copy to the wrong occurrence, and no drafter can
// reach on those prompts what a given document allows (docs/benchmarks.md, "What the target
// allows"). lookup16 and lookup32 are prompt lookup at a fixed γ (adaptive off), lookup-n16
// adaptive up to 16 (the default n_max before 0.5.0), lookup-n64 and suffix-n64 adaptive up to 64.
//
// --dump-prompts writes the prompts as DIR/<kind>-<i>.txt for bench/copy_bench.sh (whole-process
// and llama.cpp runs on the same text) and exits. --replay replays prompt lookup on the target's
// greedy outputs, next to the bound of every drafter that copies from the context (the output
// copied exactly from wherever it occurs), and prints the speed-ups they would give on a
// reference cost curve, free of timing noise, and exits.
//
// Every configuration of a prompt runs --reps times, interleaved in a rotating order, on one
// engine per draft model (the dynamic n-gram cache is off: a repeated prompt would otherwise be
// drafted from its own earlier output); each (prompt, configuration) keeps the median generation
// time. Progress on stderr, Markdown on stdout.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "speculative/draft_length.h"
#include "speculative/prompt_lookup.h"
#include "specrpc/engine.hpp"

using namespace specrpc;
using bench::median;

namespace {

constexpr int32_t kCtx = 1024;

// ---------------------------------------------------------------------------------------------
// Prompts

// Openings the target writes its own passages from (seeded T=0.8, kPassageTokens tokens).
const std::vector<std::string> kPassageSeeds = {"Once upon a time", "Tom and Sue went to the park",
                                                "One day, a big bear", "Mia and her mom baked a cake.",
                                                "The little dog", "Max found a shiny stone"};
constexpr int kPassageTokens = 110;

// Written passages, TinyStories-style stories and lists; "edit" prompts change one word in them
// (one that occurs within the first words, so the prompt's restart shows the change).
struct Written {
    std::string text, from, to;  // the passage; the edit replaces every `from` by `to`
};
const std::vector<Written> kWritten = {
    {"Lily had a red ball. She liked to play with it in the park every day. One day, the ball rolled into "
     "the pond. Lily was sad and started to cry. A big duck swam to the ball and pushed it back to her. Lily "
     "said, \"Thank you, duck!\" She gave the duck some bread, and they became friends.",
     "Lily", "Anna"},
    {"Sam had a new blue car. He wanted to show it to his friend Sue. He drove the car to the park, but it "
     "started to rain. Sam and Sue ran under a big tree. They laughed and waited for the rain to stop. When "
     "the sun came out, they saw a rainbow. Sam said, \"This is the best day ever!\"",
     "Sam", "Ben"},
    {"Mom made a list for the shop. 1. Milk for Ben. 2. Bread and jam. 3. Six red apples. 4. A big cake for "
     "the party. 5. Carrots for the bunny. 6. Juice for Lily. 7. Ice cream for Dad. 8. Soap and a new toy "
     "car.",
     "Mom", "Dad"},
    {"The animals on the farm: the cow says moo, the dog says woof, the cat says meow, the duck says quack, "
     "the pig says oink, the sheep says baa, the hen says cluck, and the horse says neigh. Every day they play "
     "in the sun and sleep in the big red barn.",
     "cow", "goat"},
};

// Story openings the target continues on its own. Twelve, because a drafter that is nearly always
// off moves a group of four by 0.92-1.05x between runs (docs/benchmarks.md): the first four are
// the original set, the rest were appended later (a prompt's seed is its index in the full list,
// so the first four sample as before).
const std::vector<std::string> kOrdinary = {"Lily wanted to", "Ben had a red ball. He",
                                            "There was a small bird in a tree.", "The sun was shining and",
                                            "Once upon a time, there was a little girl named Mia.",
                                            "Tom and his dad went to the", "One day, a big cat", "The boy was very hungry.",
                                            "Sara liked to draw pictures of", "It was a cold night and the",
                                            "A little fish lived in a pond. Every day", "Grandma gave Tim a"};

struct Prompt {
    std::string kind, text;
    size_t      id;    // index in the full list: seeds the prompt's draws, so a run with --kinds
                       // samples the same outputs as a run over every kind
    std::string name;  // kind-k, k its index among its kind (as --dump-prompts names the files)
};

// The first `n` words of `s` (words = space-separated).
std::string first_words(const std::string & s, int n) {
    size_t pos = 0;
    for (int i = 0; i < n && pos != std::string::npos; ++i) pos = s.find(' ', pos + 1);
    return pos == std::string::npos ? s : s.substr(0, pos);
}

// The text from the start of the sentence nearest the middle of `s`, its first `n` words.
std::string middle_words(const std::string & s, int n) {
    size_t mid = s.find(". ", s.size() / 2);
    if (mid == std::string::npos) mid = s.rfind(". ", s.size() / 2);
    return mid == std::string::npos ? first_words(s, n) : first_words(s.substr(mid + 2), n);
}

std::string replace_all(std::string s, const std::string & from, const std::string & to) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
    return s;
}

// The passage `e`'s model writes from `opening` (ignore_eos off: a story ends where it ends),
// cut after its last full sentence.
std::string model_passage(Engine & e, const std::string & opening, uint32_t seed) {
    auto p = e.tokenize(opening, true, false);
    if (!p) return "";
    CompletionRequest r;
    r.prompt               = p.value();
    r.n_predict            = kPassageTokens;
    r.sampling.temperature = 0.8f;
    r.sampling.seed        = seed;
    auto res = e.complete(r);
    if (!res) return "";
    std::string s   = opening + res.value().content;
    const size_t dot = s.find_last_of(".!\"");
    if (dot != std::string::npos) s.resize(dot + 1);
    for (char & c : s)
        if (c == '\n') c = ' ';
    return s;
}

std::vector<Prompt> make_prompts(Engine & e) {
    std::vector<Prompt> out;
    std::vector<std::string> passages;
    for (size_t i = 0; i < kPassageSeeds.size(); ++i) {
        std::string p = model_passage(e, kPassageSeeds[i], 7u + uint32_t(i));
        if (p.size() > 80) passages.push_back(p);
    }
    std::map<std::string, int> n_kind;
    auto add = [&](const std::string & kind, std::string text) {
        out.push_back({kind, std::move(text), out.size(), kind + "-" + std::to_string(n_kind[kind]++)});
    };
    // passage, then its repetition's first 8 words: the rest is a copy
    for (size_t i = 0; i < passages.size() && i < 4; ++i)
        add("repeat", passages[i] + "\n\n" + first_words(passages[i], 8));
    // passage, then a sentence from its middle: copy the second half
    for (size_t i = 4; i < passages.size(); ++i)
        add("middle", passages[i] + "\n\n" + middle_words(passages[i], 6));
    for (const Written & w : kWritten) {
        // the passage told again with one name changed: copies break at each change and resume
        add("edit", w.text + "\n\n" + first_words(replace_all(w.text, w.from, w.to), 10));
    }
    for (size_t i = 2; i < kWritten.size(); ++i)  // the two lists repeated verbatim
        add("list", kWritten[i].text + "\n\n" + first_words(kWritten[i].text, 8));
    for (const std::string & o : kOrdinary) add("ordinary", o);
    return out;
}

std::string group_of(const Prompt & p) { return p.kind == "ordinary" ? "ordinary" : "copy-heavy"; }

// ---------------------------------------------------------------------------------------------
// Configurations and their statistics

struct Config {
    std::string name;   // --configs key
    std::string label;  // table label
    int         engine; // 0: draft copy-F32; 1: draft stories260K-F32
    std::vector<SpecType> types;
    int         n_max = 0;        // > 0: SpecParams::n_max (else its default)
    bool        adaptive = true;  // false: always draft n_max
    float       p_min = -1.0f;    // SpecParams::p_min; the -nostop configs: 0, the old default
};

const std::vector<Config> kConfigs = {
    {"plain", "plain", 0, {}},
    {"lookup", "prompt lookup", 0, {SpecType::LOOKUP}},
    {"lookup16", "prompt lookup, fixed γ 16", 0, {SpecType::LOOKUP}, 16, false},
    {"lookup32", "prompt lookup, fixed γ 32", 0, {SpecType::LOOKUP}, 32, false},
    {"lookup-n16", "prompt lookup, n_max 16", 0, {SpecType::LOOKUP}, 16},
    {"lookup-n64", "prompt lookup, n_max 64", 0, {SpecType::LOOKUP}, 64},
    {"ngram", "n-gram caches", 0, {SpecType::NGRAM}},
    {"draft", "draft copy-F32", 0, {SpecType::DRAFT}},
    {"draft260K", "draft 260K-F32 (mismatched)", 1, {SpecType::DRAFT}},
    {"chain", "lookup, then draft copy-F32", 0, {SpecType::LOOKUP, SpecType::DRAFT}},
    // the learned confidence stop off (p_min 0), for its A/B in one run
    {"draft-nostop", "draft copy-F32, no stop", 0, {SpecType::DRAFT}, 0, true, 0.0f},
    {"draft260K-nostop", "draft 260K-F32 (mismatched), no stop", 1, {SpecType::DRAFT}, 0, true, 0.0f},
    {"chain-nostop", "lookup, then draft copy-F32, no stop", 0, {SpecType::LOOKUP, SpecType::DRAFT}, 0, true, 0.0f},
    {"suffix", "suffix tree (request only)", 0, {SpecType::SUFFIX}},
    {"suffix-n64", "suffix tree (request only), n_max 64", 0, {SpecType::SUFFIX}, 64},
};

// Statistics of one configuration over a group of prompts (acceptance summed over every run;
// time from each prompt's median run).
struct Agg {
    double               tokens = 0, ms = 0;
    int64_t              draft_n = 0, accepted = 0, draft_steps = 0, steps = 0, off_rounds = 0;
    std::vector<int64_t> dpos, apos, ghist;
    std::vector<double>  v_sum;
    double               c_sum = 0, o_sum = 0, t1_sum = 0;
    int                  cost_n = 0;
    double               ms_all = 0, draft_ms = 0, verify_ms = 0;  // every run, not the medians
    // The confidence stop's empty rounds: how many, and their price in the engine's model (each
    // request's x, DraftLengthPolicy::observe_empty) summed over those it had measured; the
    // others are priced at c + o, as the policy does before it has measured one.
    int64_t              empty_n = 0, empty_unpriced = 0;
    double               empty_x = 0, empty_ms = 0;

    static void add_vec(std::vector<int64_t> & a, const std::vector<int64_t> & b) {
        if (a.size() < b.size()) a.resize(b.size(), 0);
        for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
    }
    void add_stats(const SpecRequestStats & s) {
        draft_n += s.draft_n; accepted += s.draft_n_accepted; draft_steps += s.draft_n_steps;
        steps += s.n_steps; off_rounds += s.n_off_rounds;
        add_vec(dpos, s.drafted_at_pos); add_vec(apos, s.accepted_at_pos); add_vec(ghist, s.gamma_hist);
        draft_ms += s.t_draft_ms; verify_ms += s.t_verify_ms;
        empty_n += s.n_empty_rounds; empty_ms += s.t_empty_draft_ms;
        if (s.empty_excess >= 0) empty_x += double(s.n_empty_rounds) * s.empty_excess;
        else empty_unpriced += s.n_empty_rounds;
    }
    void add_cost(const CostCurve & cc) {
        if (cc.v.empty()) return;
        if (v_sum.size() < cc.v.size()) v_sum.resize(cc.v.size(), 0.0);
        for (size_t n = 0; n < cc.v.size(); ++n) v_sum[n] += cc.v[n];
        c_sum += cc.c; o_sum += cc.o; t1_sum += cc.t1_ms; cost_n++;
    }
    double accept_rate() const { return draft_n ? double(accepted) / draft_n : 0; }
    double mean_accept_len() const { return draft_steps ? 1.0 + double(accepted) / draft_steps : 0; }
    int    gamma_mode() const {
        int best = 0;
        for (size_t g = 0; g < ghist.size(); ++g)
            if (ghist[g] > ghist[best]) best = int(g);
        return best;
    }
    // Acceptance by depth (conditional on the depths before it), as spec_bench estimates it.
    std::vector<double> depth_profile() const {
        std::vector<double> a(std::max<size_t>(dpos.size(), 1) + 1, 0.0);
        double at_risk = dpos.empty() ? 0 : double(dpos[0]);
        for (size_t i = 0; i < dpos.size() && i < apos.size(); ++i) {
            if (i > 0) at_risk = dpos[i - 1] > 0 ? double(apos[i - 1]) * double(dpos[i]) / double(dpos[i - 1]) : 0;
            a[i + 1] = at_risk > 0 ? double(apos[i]) / at_risk : (i > 0 ? a[i] : 0.0);
        }
        a.back() = a.size() > 2 ? a[a.size() - 2] : a.back();
        return a;
    }
    // Rounds by drafted length L (0 = plain rounds).
    std::vector<int64_t> rounds_by_len() const {
        std::vector<int64_t> r(dpos.size() + 1, 0);
        r[0] = steps - draft_steps;
        for (size_t L = 1; L <= dpos.size(); ++L) r[L] = dpos[L - 1] - (L < dpos.size() ? dpos[L] : 0);
        return r;
    }
    CostModel cost_model(bool model_draft) const {
        CostModel cm;
        for (double x : v_sum) cm.v.push_back(x / cost_n);
        cm.c = model_draft ? c_sum / cost_n : 0.0;
        cm.o = o_sum / cost_n;
        return cm;
    }
    // The model's account of the rounds actually run (plain rounds and every draft length), with
    // the measured acceptance by depth and the engine's cost curve of these runs: the tokens they
    // emit, and their cost in 1-token passes, split into the drafted rounds' verification passes
    // (v(L + 1)), the drafting (L·c in a drafted round, x in a round the confidence stop left
    // empty: the price the policy's S_e puts on it), and the rest (1 per plain or empty round, o
    // per drafted one).
    struct Account { double tok = 0, verify = 0, draft = 0, rest = 0; };
    Account account(bool model_draft) const {
        const CostModel cm   = cost_model(model_draft);
        const auto      rl   = rounds_by_len();
        const auto      prof = depth_profile();
        Account a;
        for (size_t L = 0; L < rl.size(); ++L) {
            a.tok += double(rl[L]) * expected_tokens(prof, int(L));
            if (L == 0) { a.rest += double(rl[L]); continue; }
            a.verify += double(rl[L]) * cost_model_v(cm, int(L) + 1);
            a.draft += double(rl[L]) * double(L) * cm.c;
            a.rest += double(rl[L]) * cm.o;
        }
        a.draft += empty_x + double(empty_unpriced) * (cm.c + cm.o);
        return a;
    }
    // The cost model's speed-up for the rounds actually run.
    double predicted(bool model_draft) const {
        if (!cost_n) return 1;
        const Account a    = account(model_draft);
        const double  cost = a.verify + a.draft + a.rest;
        return cost > 0 ? a.tok / cost : 1;
    }
    // Where a prediction misses, summed over every run: the account against what the runs
    // measured, in seconds at the curve's t(1). The drafting time includes catching the draft
    // model up after plain rounds, which the model leaves out, and the empty rounds' draft steps.
    std::string explain(bool model_draft) const {
        if (!cost_n || !steps) return "no cost curve";
        const Account a  = account(model_draft);
        const double  t1 = t1_sum / cost_n / 1e3;
        const double  all = ms_all / 1e3, ver = verify_ms / 1e3, dr = (draft_ms + empty_ms) / 1e3;
        char buf[448];
        std::snprintf(buf, sizeof buf,
                      "%lld rounds (%lld drafted, %lld empty), tokens %lld (model %.0f); seconds: all %.2f "
                      "(model %.2f), verify %.2f (model %.2f), draft %.2f (model %.2f), rest %.2f (model %.2f); "
                      "t(1) %.2f ms",
                      (long long)steps, (long long)draft_steps, (long long)empty_n, (long long)(steps + accepted),
                      a.tok, all,
                      t1 * (a.verify + a.draft + a.rest), ver, t1 * a.verify, dr, t1 * a.draft, all - ver - dr,
                      t1 * a.rest, 1e3 * t1);
        return buf;
    }
};

struct Options {
    std::string models_dir = SPECRPC_MODELS_DIR;
    std::string target = "stories260K-copy-x100M-Q8_0.gguf";
    std::string drafts[2] = {"stories260K-copy-F32.gguf", "stories260K-F32.gguf"};
    int         n_tokens = 128, reps = 3, threads = 2, lookup_min = 0;
    std::vector<float> temps = {0.0f, 0.8f};
    std::vector<std::string> configs, kinds;
    std::string dump_dir;
    bool        replay = false;
    std::string passage_model = "stories260K-F32.gguf";  // --passages base; "target": o.target
};

std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, sep))
        if (!item.empty()) out.push_back(item);
    return out;
}

bool wanted(const std::vector<std::string> & list, const std::string & x) {
    return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

// An engine on models_dir/target with models_dir/draft ("" = none).
std::unique_ptr<Engine> make_engine(const Options & o, const std::string & target, const std::string & draft) {
    EngineParams p;
    p.target.path        = o.models_dir + "/" + target;
    if (!draft.empty()) p.draft.path = o.models_dir + "/" + draft;
    p.n_ctx              = kCtx;
    p.n_threads          = o.threads;
    p.ngram_cache_max_mb  = 0;  // context cache only: see the file comment
    p.suffix_cache_max_mb = 0;  // the suffix drafter's trie of the request only, for the same reason
    auto e = Engine::create(p);
    if (!e) {
        std::fprintf(stderr, "[copy] cannot create engine %s / %s: %s\n", target.c_str(), draft.c_str(),
                     e.status().to_string().c_str());
        return nullptr;
    }
    return std::move(e.value());
}

CompletionRequest make_request(const std::vector<token_id> & prompt, const Options & o, float temp, uint32_t seed,
                               const Config & c) {
    CompletionRequest r;
    r.prompt               = prompt;
    r.n_predict            = o.n_tokens;
    r.sampling.ignore_eos  = true;  // every run emits exactly n tokens
    r.sampling.temperature = temp;
    r.sampling.seed        = seed;
    r.spec.types           = c.types;
    r.spec.adaptive        = c.adaptive;
    r.spec.p_min           = c.p_min;
    if (c.n_max > 0) r.spec.n_max = c.n_max;
    if (o.lookup_min > 0) r.spec.ngram_min = o.lookup_min;
    return r;
}

// A drafter replayed on the target's own greedy output of a prompt: at each step a draft, accepted
// as far as it matches the output, then one token emitted. What the drafter can at best achieve,
// free of timing noise; the cost is in 1-token passes (1 for a step without a draft, v(d + 1)
// with d drafted).
struct Replay {
    int64_t steps = 0, drafted = 0, accepted = 0, empty = 0, emitted = 0;
    double  cost = 0;
    void step(size_t n_draft, size_t n_acc, const CostModel & cm) {
        steps++; drafted += int64_t(n_draft); accepted += int64_t(n_acc); empty += n_draft == 0;
        emitted += int64_t(n_acc + 1);
        cost += n_draft == 0 ? 1.0 : cost_model_v(cm, int(n_draft) + 1);
    }
    Replay & operator+=(const Replay & r) {
        steps += r.steps; drafted += r.drafted; accepted += r.accepted; empty += r.empty; emitted += r.emitted;
        cost += r.cost;
        return *this;
    }
    double speedup() const { return cost > 0 ? double(emitted) / cost : 0; }
    double tokens_per_step() const { return steps ? double(emitted) / double(steps) : 0; }
    double accept() const { return drafted ? double(accepted) / double(drafted) : 0; }
};

// Prompt lookup with params `lp`, drafting up to `gamma` tokens every step.
Replay lookup_replay(const std::vector<token_id> & prompt, const std::vector<token_id> & out,
                     const PromptLookupParams & lp, int gamma, const CostModel & cm) {
    Replay r;
    std::vector<token_id> seq = prompt;
    for (size_t i = 0; i < out.size();) {
        const int n = int(std::min<size_t>(size_t(gamma), out.size() - i - 1));
        const auto d = prompt_lookup_draft(seq, lp, n);
        size_t acc = 0;
        while (acc < d.size() && d[acc] == out[i + acc]) ++acc;
        r.step(d.size(), acc, cm);
        seq.insert(seq.end(), out.begin() + ptrdiff_t(i), out.begin() + ptrdiff_t(i + acc + 1));
        i += acc + 1;
    }
    return r;
}

// The bound of every drafter that copies from the context (prompt lookup, n-gram caches, suffix
// trees of the request): at each step the longest run of the coming output (up to gamma tokens)
// that occurs anywhere in the context so far (a copy may run on into itself, as lookup's do),
// drafted exactly, so nothing drafted is rejected.
Replay copy_bound(const std::vector<token_id> & prompt, const std::vector<token_id> & out, int gamma,
                  const CostModel & cm) {
    Replay r;
    std::vector<token_id> seq = prompt;
    for (size_t i = 0; i < out.size();) {
        const size_t cap = std::min<size_t>(size_t(gamma), out.size() - i - 1);
        size_t best = 0;
        for (size_t j = 0; j < seq.size() && best < cap; ++j) {
            size_t l = 0;
            auto at = [&](size_t k) { return k < seq.size() ? seq[k] : out[i + k - seq.size()]; };
            while (l < cap && at(j + l) == out[i + l]) ++l;
            best = std::max(best, l);
        }
        r.step(best, best, cm);
        seq.insert(seq.end(), out.begin() + ptrdiff_t(i), out.begin() + ptrdiff_t(i + best + 1));
        i += best + 1;
    }
    return r;
}

}  // namespace

int main(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--models") o.models_dir = next();
        else if (a == "--tokens") o.n_tokens = std::max(8, std::atoi(next().c_str()));
        else if (a == "--reps") o.reps = std::max(1, std::atoi(next().c_str()));
        else if (a == "--threads") o.threads = std::max(1, std::atoi(next().c_str()));
        else if (a == "--lookup-min") o.lookup_min = std::atoi(next().c_str());
        else if (a == "--temps") {
            o.temps.clear();
            for (const auto & t : split(next(), ',')) o.temps.push_back(std::strtof(t.c_str(), nullptr));
        } else if (a == "--configs") o.configs = split(next(), ',');
        else if (a == "--kinds") o.kinds = split(next(), ',');
        else if (a == "--dump-prompts") o.dump_dir = next();
        else if (a == "--replay") o.replay = true;
        else if (a == "--passages") {
            const std::string v = next();
            if (v == "target") o.passage_model.clear();
            else if (v != "base") { std::fprintf(stderr, "[copy] --passages base|target\n"); return 2; }
        }
        else {
            std::fprintf(stderr,
                         "usage: %s [--models DIR] [--tokens N] [--reps N] [--threads N] [--temps 0,0.8] "
                         "[--configs plain,lookup,lookup-n16,lookup-n64,lookup16,lookup32,ngram,draft,draft260K,chain,suffix,suffix-n64,draft-nostop,draft260K-nostop,chain-nostop] [--kinds repeat,middle,edit,list,ordinary] "
                         "[--dump-prompts DIR] [--lookup-min N] [--replay] [--passages base|target]\n",
                         argv[0]);
            return 2;
        }
    }
    std::vector<const Config *> configs;
    for (const Config & c : kConfigs)
        if (c.name == "plain" || wanted(o.configs, c.name)) configs.push_back(&c);
    bool need[2] = {true, false};
    for (const Config * c : configs) need[c->engine] = true;

    std::unique_ptr<Engine> eng[2];
    for (int k = 0; k < 2; ++k)
        if (need[k] && !(eng[k] = make_engine(o, o.target, o.drafts[k]))) return 1;

    std::fprintf(stderr, "[copy] writing the passages with %s\n",
                 o.passage_model.empty() ? o.target.c_str() : o.passage_model.c_str());
    std::vector<Prompt> prompts;
    {
        std::unique_ptr<Engine> writer;
        if (!o.passage_model.empty() && !(writer = make_engine(o, o.passage_model, ""))) return 1;
        for (const Prompt & p : make_prompts(writer ? *writer : *eng[0]))
            if (wanted(o.kinds, p.kind)) prompts.push_back(p);
    }
    if (!o.dump_dir.empty()) {
        for (const Prompt & p : prompts) {
            const std::string path = o.dump_dir + "/" + p.name + ".txt";
            std::ofstream f(path, std::ios::binary);
            f << p.text;
            if (!f) { std::fprintf(stderr, "[copy] cannot write %s\n", path.c_str()); return 1; }
        }
        std::fprintf(stderr, "[copy] %zu prompts written to %s\n", prompts.size(), o.dump_dir.c_str());
        return 0;
    }
    std::vector<std::vector<token_id>> toks;
    for (const Prompt & p : prompts) {
        auto t = eng[0]->tokenize(p.text, true, false);
        if (!t) { std::fprintf(stderr, "[copy] tokenize: %s\n", t.status().to_string().c_str()); return 1; }
        toks.push_back(t.value());
    }

    if (o.replay) {
        // the reference curve: the copy target at 2 threads behind 128 cells, steady passes on an
        // idle machine (bench/pass_bench --sizes 2,4,8,12,16,20,24,32,48; docs/benchmarks.md)
        CostModel ref;
        ref.v.assign(49, 0.0);
        for (auto [n, v] : {std::pair{1, 1.0}, {2, 2.09}, {4, 2.74}, {8, 4.08}, {12, 6.15}, {16, 6.27}, {20, 7.13},
                            {24, 8.03}, {32, 9.96}, {48, 16.12}})
            ref.v[size_t(n)] = v;
        PromptLookupParams lp;  // the engine's defaults (engine/step.cpp)
        std::printf("Replayed on the target's greedy output (%d tokens), speed-up S on the reference curve; bound = "
                    "the output copied from wherever it occurs in the context, drafting exactly what is accepted; "
                    "lookup = prompt lookup drafting all it proposes up to γ.\n\n| prompt | S bound γ 16 | S bound γ 32 "
                    "| tokens/step bound γ 32 | S lookup γ 16 | S lookup γ 32 | accept γ 32 | tokens/step γ 32 "
                    "| empty steps γ 32 |\n|---|---|---|---|---|---|---|---|---|\n",
                    o.n_tokens);
        std::map<std::string, Replay> sum_b16, sum_b32, sum_l16, sum_l32;  // per group
        for (size_t pi = 0; pi < prompts.size(); ++pi) {
            auto res = eng[0]->complete(make_request(toks[pi], o, 0.0f, 1, kConfigs[0]));
            if (!res) return 1;
            std::vector<token_id> out;
            for (const auto & t : res.value().tokens) out.push_back(t.id);
            const Replay b16 = copy_bound(toks[pi], out, 16, ref), b32 = copy_bound(toks[pi], out, 32, ref);
            const Replay l16 = lookup_replay(toks[pi], out, lp, 16, ref), l32 = lookup_replay(toks[pi], out, lp, 32, ref);
            const std::string g = group_of(prompts[pi]);
            sum_b16[g] += b16; sum_b32[g] += b32; sum_l16[g] += l16; sum_l32[g] += l32;
            std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %.2f | %.0f%% |\n", prompts[pi].name.c_str(),
                        b16.speedup(), b32.speedup(), b32.tokens_per_step(), l16.speedup(), l32.speedup(),
                        100 * l32.accept(), l32.tokens_per_step(), 100.0 * l32.empty / double(l32.steps));
            std::fflush(stdout);
        }
        for (const auto & [g, b32] : sum_b32)
            std::printf("| **%s** (Σ tokens ÷ Σ cost) | **%.2f** | **%.2f** | %.2f | %.2f | %.2f | %.1f%% | %.2f | %.0f%% |\n",
                        g.c_str(), sum_b16[g].speedup(), b32.speedup(), b32.tokens_per_step(), sum_l16[g].speedup(),
                        sum_l32[g].speedup(), 100 * sum_l32[g].accept(), sum_l32[g].tokens_per_step(),
                        100.0 * sum_l32[g].empty / double(sum_l32[g].steps));
        return 0;
    }

    // Warm-up: weights paged in, the cost curve measured (first speculative request), each
    // drafter's acceptance prior set by one request on a prompt of each kind's first.
    for (int k = 0; k < 2; ++k) {
        if (!eng[k]) continue;
        for (const Config * c : configs) {
            if (c->engine != k && c->name != "plain") continue;
            for (float t : o.temps)
                if (auto r = eng[k]->complete(make_request(toks[0], o, t, 1, *c)); !r) {
                    std::fprintf(stderr, "[copy] warm-up failed: %s\n", r.status().to_string().c_str());
                    return 1;
                }
        }
    }

    // results[temp][prompt][config] = generation ms of each rep; stats per (temp, group, config)
    const size_t nc = configs.size();
    const bool   has_plain260 = need[1];
    struct Cell { std::vector<double> ms; std::vector<double> plain_ms; };  // plain of the same engine
    std::vector<std::vector<std::vector<Cell>>> cells(o.temps.size(),
        std::vector<std::vector<Cell>>(prompts.size(), std::vector<Cell>(nc)));
    std::map<std::string, Agg> aggs;  // key: temp|group|config

    for (size_t ti = 0; ti < o.temps.size(); ++ti) {
        const float temp = o.temps[ti];
        for (size_t pi = 0; pi < prompts.size(); ++pi) {
            const uint32_t seed = 1000u + uint32_t(prompts[pi].id);
            for (int rep = 0; rep < o.reps; ++rep) {
                // rotate the order; the mismatched draft's engine runs its own plain beside it
                std::vector<int> order;
                for (size_t k = 0; k < nc; ++k) order.push_back(int((k + pi + rep) % nc));
                if (has_plain260) order.push_back(-1);
                for (int v : order) {
                    const Config & c = v < 0 ? kConfigs[0] : *configs[v];
                    Engine &       e = *eng[v < 0 ? 1 : c.engine];
                    auto r = e.complete(make_request(toks[pi], o, temp, seed, c));
                    if (!r) { std::fprintf(stderr, "[copy] request failed: %s\n", r.status().to_string().c_str()); return 1; }
                    const double ms = r.value().timings.predicted_ms;
                    if (v < 0) {
                        for (size_t k = 0; k < nc; ++k)
                            if (configs[k]->engine == 1) cells[ti][pi][k].plain_ms.push_back(ms);
                        continue;
                    }
                    cells[ti][pi][v].ms.push_back(ms);
                    if (c.engine == 0 && c.name == "plain")
                        for (size_t k = 0; k < nc; ++k)
                            if (configs[k]->engine == 0) cells[ti][pi][k].plain_ms.push_back(ms);
                    Agg & a = aggs[std::to_string(ti) + "|" + group_of(prompts[pi]) + "|" + c.name];
                    a.add_stats(r.value().spec);
                    a.ms_all += ms;
                    if (!c.types.empty()) a.add_cost(e.cost_curve());
                }
            }
            std::string line;
            char        buf[96];
            const double plain = median(cells[ti][pi][0].ms);
            for (size_t k = 1; k < nc; ++k) {
                std::snprintf(buf, sizeof buf, " %s %.2fx", configs[k]->name.c_str(),
                              median(cells[ti][pi][k].plain_ms) / std::max(1e-9, median(cells[ti][pi][k].ms)));
                line += buf;
            }
            std::fprintf(stderr, "[copy] T=%.1f %s (%zu tokens): plain %.1f t/s |%s\n", temp, prompts[pi].name.c_str(),
                         toks[pi].size(), 1e3 * o.n_tokens / std::max(1e-9, plain), line.c_str());
        }
    }

    // ---- tables
    const CostCurve cc = eng[0]->cost_curve();
    std::printf("## Copy-heavy benchmark (warm, in-process)\n\n");
    std::printf("Target %s; %d tokens per request (ignore_eos), %d threads, n_ctx %d, %d reps per (prompt, "
                "configuration) interleaved, median time per prompt; dynamic n-gram cache off; T=0.8 requests carry "
                "seeds (coupled draws), sampler defaults (top_k 40, top_p 0.95, min_p 0.05). ratio = Σ plain time ÷ Σ "
                "time over the group's prompts (plain of the same engine and run); med = median of the per-prompt "
                "ratios; pred = the cost model's S over the rounds run (acceptance by depth, v, c, o as the engine "
                "measured them, and each round the confidence stop left empty at 1 + x, the policy's price of it); "
                "ach ÷ pred = ratio ÷ pred; worst ÷ med = the slowest request of the group against the median of "
                "its (prompt, configuration); vs plain = the same with each request's time taken against plain's in "
                "its repetition (seconds apart, same engine), so a slowdown of the whole machine cancels "
                "(1.00 for plain itself).\n\n",
                o.target.c_str(), o.n_tokens, o.threads, kCtx, o.reps);
    std::printf("| T | prompts | configuration | plain t/s | t/s | ratio | med | min | accept | mean acc len | γ mode | off | pred | ach ÷ pred | worst ÷ med | vs plain |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t ti = 0; ti < o.temps.size(); ++ti) {
        for (const std::string group : {"copy-heavy", "ordinary"}) {
            for (size_t k = 0; k < nc; ++k) {
                double t_spec = 0, t_plain = 0;
                int    n      = 0;
                std::vector<double> per;
                double worst = 0;  // the slowest request against the median of its (prompt, configuration)
                size_t worst_pi = 0;
                // the same against plain of its repetition (run seconds apart on the same engine):
                // a slowdown of the whole machine that spans a repetition's configurations cancels
                double worst_rel = 0;
                for (size_t pi = 0; pi < prompts.size(); ++pi) {
                    if (group_of(prompts[pi]) != group) continue;
                    const Cell & c = cells[ti][pi][k];
                    const double s = median(c.ms), pl = median(c.plain_ms);
                    t_spec += s; t_plain += pl; ++n;
                    per.push_back(pl / std::max(1e-9, s));
                    const double w = *std::max_element(c.ms.begin(), c.ms.end()) / std::max(1e-9, s);
                    if (w > worst) worst = w, worst_pi = pi;
                    if (c.plain_ms.size() == c.ms.size()) {
                        std::vector<double> rel;
                        for (size_t r = 0; r < c.ms.size(); ++r) rel.push_back(c.ms[r] / std::max(1e-9, c.plain_ms[r]));
                        worst_rel = std::max(worst_rel, *std::max_element(rel.begin(), rel.end()) / std::max(1e-9, median(rel)));
                    }
                }
                if (!n) continue;
                {   // which request was the slowest, to stderr: one outlier decides "worst ÷ med"
                    auto joined = [](const std::vector<double> & xs) {
                        std::string out;
                        for (double ms : xs) out += (out.empty() ? "" : ", ") + std::to_string(int(ms + 0.5));
                        return out;
                    };
                    const Cell & c = cells[ti][worst_pi][k];
                    std::fprintf(stderr, "[copy] slowest T=%.1f %s %s: %s (%s ms, in run order; plain of each repetition %s ms)\n",
                                 o.temps[ti], group.c_str(), configs[k]->label.c_str(), prompts[worst_pi].name.c_str(),
                                 joined(c.ms).c_str(), joined(c.plain_ms).c_str());
                }
                const Agg &  a     = aggs[std::to_string(ti) + "|" + group + "|" + configs[k]->name];
                const double ratio = t_plain / std::max(1e-9, t_spec);
                const bool   model = std::find(configs[k]->types.begin(), configs[k]->types.end(), SpecType::DRAFT) !=
                                     configs[k]->types.end();
                const double pred  = configs[k]->types.empty() ? 1.0 : a.predicted(model);
                const double off   = a.steps ? 100.0 * a.off_rounds / a.steps : 0;
                if (!configs[k]->types.empty())
                    std::fprintf(stderr, "[copy] prediction T=%.1f %s %s: %s\n", o.temps[ti], group.c_str(),
                                 configs[k]->label.c_str(), a.explain(model).c_str());
                std::printf("| %.1f | %s (%d) | %s | %.1f | %.1f | **%.2fx** | %.2fx | %.2fx | %.1f%% | %.2f | %d | %.0f%% | %.2fx | %.2f | %.2f | %.2f |\n",
                            o.temps[ti], group.c_str(), n, configs[k]->label.c_str(), 1e3 * o.n_tokens * n / t_plain,
                            1e3 * o.n_tokens * n / t_spec, ratio, median(per), *std::min_element(per.begin(), per.end()),
                            100 * a.accept_rate(), a.mean_accept_len(), a.gamma_mode(), off, pred, ratio / pred, worst, worst_rel);
            }
        }
    }
    if (!cc.v.empty()) {
        CostModel cm;
        cm.v = cc.v;
        std::printf("\nCost curve at the end (copy-F32 engine): t(1) %.2f ms, v(2) %.2f, v(4) %.2f, v(8) %.2f, v(16) %.2f, "
                    "c %.3f, o %.3f; R = max n/v(n) = %.2fx.\n",
                    cc.t1_ms, cost_model_v(cm, 2), cost_model_v(cm, 4), cost_model_v(cm, 8), cost_model_v(cm, 16), cc.c,
                    cc.o, speedup_limit(cm));
    }
    return 0;
}
