// The speculative benchmark: plain vs speculative tokens/s of the engine on the benchmark models
// (../shared/models/MANIFEST.md), next to the speed-up the cost model of docs/design.md §3
// predicts from the measured v(n), c, o and acceptance α. Plain and speculative runs of the same
// prompt are interleaved so machine noise hits both alike.
//
//   spec_bench [--quick] [--models DIR] [--cases a,b,c,d,e,f] [--tokens N] [--prompts N] [--threads N] [--reps N]
//
// --reps N: run every (prompt, configuration) N times, interleaved, and keep the fastest run of
// each (robust against stalls when other jobs take a core); default 1.
// --threads defaults to 2 (the machine's cores); with other jobs on the machine, 2 ggml threads
// spin at every barrier while a core is taken, so numbers get very noisy.
// Cases:
//   a  stories260K-F32 target, Q4_0 / Q8_0 drafts (tiny: measures our overheads)
//   b  x25M / x100M / x100M-near targets, stories260K-F32 draft
//   c  n-gram and prompt lookup on copy-heavy prompts, x100M
//   d  fixed-γ sweep (adaptive off, γ in kSweep: 1..16) vs adaptive on x100M-near and x100M, T = 0
//   e  speculation that cannot pay: x25M + F32 draft, synthetic α = 0.1 on x100M
//   f  T = 0.8 on x100M-near: rejection sampling vs sample-and-compare
// Progress goes to stderr; the Markdown tables and the PASS/FAIL list to stdout.
#include <algorithm>
#include <optional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "speculative/draft_length.h"
#include "specrpc/engine.hpp"

using namespace specrpc;
using specrpc::bench::kPrompts;
using specrpc::bench::short_name;

namespace {

// Copy-heavy prompts: a TinyStories-style paragraph, then the beginning of the same paragraph, so
// the natural continuation is to repeat it.
const std::vector<std::string> kCopyPrompts = {
    "Lily had a red ball. She liked to play with it in the park every day. One day, the ball rolled "
    "into the pond. Lily was sad and started to cry. A big duck swam to the ball and pushed it back "
    "to her. Lily said, \"Thank you, duck!\" She gave the duck some bread, and they became friends.\n"
    "Lily had a red ball. She liked to play",
    "Tom and his dog Max went for a walk in the woods. They saw a tall tree with a nest in it. A "
    "little bird was in the nest. The bird was scared because it could not fly. Tom helped the bird "
    "back into the nest. The mom bird came back and sang a happy song. Tom and Max smiled and went "
    "home.\nTom and his dog Max went for a walk in the woods. They saw",
    "Once upon a time, there was a little cat named Kitty. Kitty liked to sleep in the sun. One day, "
    "she saw a big box in the yard. She jumped into the box and found a soft toy. Kitty played with "
    "the toy all day. When the sun went down, she was very tired. She went to sleep in the box with "
    "her new toy.\nOnce upon a time, there was a little cat named Kitty. Kitty liked",
    "Sam had a new blue car. He wanted to show it to his friend Sue. He drove the car to the park, "
    "but it started to rain. Sam and Sue ran under a big tree. They laughed and waited for the rain "
    "to stop. When the sun came out, they saw a rainbow. Sam said, \"This is the best day ever!\"\n"
    "Sam had a new blue car. He wanted to show it",
    "Mia wanted to bake a cake for her mom. She got flour, eggs and milk. She mixed them in a big "
    "bowl. Her dad helped her put the cake in the oven. When the cake was ready, it smelled very "
    "good. Mia gave the cake to her mom. Her mom hugged her and said, \"I love you, Mia.\"\n"
    "Mia wanted to bake a cake for her mom. She got",
};

int32_t kThreads = 2;  // --threads
// --verifier: the verifier of every speculative request at T > 0 (default: the engine's AUTO,
// coupled draws for these seeded requests), to compare acceptance and speed on the same pairs
std::optional<SpecVerifier> kVerifier;
constexpr int32_t kCtx     = 512;

// ---------------------------------------------------------------------------------------------
// Accumulated statistics of one configuration over the prompts of a group.

struct Agg {
    int     runs = 0;
    double  tokens = 0, ms = 0;
    int64_t draft_n = 0, accepted = 0, draft_steps = 0, steps = 0, off_rounds = 0;
    std::vector<int64_t> dpos, apos, ghist;
    // The engine's cost curve after each of this configuration's requests, summed: v and c are
    // refined online from the passes and drafts actually run (t(1) from the interleaved plain
    // requests), so the prediction uses the costs of the same minutes as the speed it judges.
    std::vector<double> v_sum;
    double  c_sum = 0, o_sum = 0, t1_sum = 0;
    int     cost_n = 0;  // requests whose cost curve was added
    int     greedy_checked = 0, greedy_equal = 0;
    std::vector<double> ratios;  // per prompt: plain time ÷ speculative time

    static void add_vec(std::vector<int64_t> & a, const std::vector<int64_t> & b) {
        if (a.size() < b.size()) a.resize(b.size(), 0);
        for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
    }
    void add(const CompletionResult & r) {
        runs++;
        tokens += r.timings.predicted_n;
        ms += r.timings.predicted_ms;
        const auto & s = r.spec;
        draft_n += s.draft_n; accepted += s.draft_n_accepted; draft_steps += s.draft_n_steps;
        steps += s.n_steps; off_rounds += s.n_off_rounds;
        add_vec(dpos, s.drafted_at_pos); add_vec(apos, s.accepted_at_pos); add_vec(ghist, s.gamma_hist);
    }
    double tps() const { return ms > 0 ? 1e3 * tokens / ms : 0; }
    double accept_rate() const { return draft_n ? double(accepted) / draft_n : 0; }
    double mean_accept_len() const { return draft_steps ? 1.0 + double(accepted) / draft_steps : 0; }
    double o() const { return cost_n ? o_sum / cost_n : 0; }
    void add_cost(const CostCurve & cc) {
        if (cc.v.empty()) return;
        if (v_sum.size() < cc.v.size()) v_sum.resize(cc.v.size(), 0.0);
        for (size_t n = 0; n < cc.v.size(); ++n) v_sum[n] += cc.v[n];
        c_sum += cc.c;
        o_sum += cc.o;
        t1_sum += cc.t1_ms;
        cost_n++;
    }
    // The mean cost curve over this configuration's requests (empty if none was measured).
    CostCurve cost() const {
        CostCurve cc;
        if (!cost_n) return cc;
        for (double x : v_sum) cc.v.push_back(x / cost_n);
        cc.c = c_sum / cost_n;
        cc.o = o_sum / cost_n;
        cc.t1_ms = t1_sum / cost_n;
        return cc;
    }
    // Per-position α, policy-consistent: accepted positions ÷ positions at risk. Positions at risk
    // at depth i = rounds that accepted depths 0..i-1 and drafted depth i; the second factor is
    // estimated as the share of rounds drafting depth i-1 that also drafted depth i (exact for a
    // fixed γ).
    double alpha() const {
        if (dpos.empty() || dpos[0] == 0) return 0;
        double num = 0, den = double(dpos[0]);
        for (size_t i = 0; i < apos.size(); ++i) num += double(apos[i]);
        for (size_t i = 1; i < dpos.size(); ++i)
            if (dpos[i - 1] > 0) den += double(apos[i - 1]) * double(dpos[i]) / double(dpos[i - 1]);
        return den > 0 ? num / den : 0;
    }
    // Acceptance by depth a[j] (conditional on depths 1..j-1 accepted), with the same estimate
    // of the positions at risk as alpha(): the profile the engine's policy predicts with.
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
    int gamma_mode() const {
        int best = 0;
        for (size_t g = 0; g < ghist.size(); ++g)
            if (ghist[g] > ghist[best]) best = static_cast<int>(g);
        return best;
    }
    // Rounds by actual drafted length L (chain drafts): L = 0 are plain rounds.
    std::vector<int64_t> rounds_by_len() const {
        std::vector<int64_t> r(dpos.size() + 1, 0);
        r[0] = steps - draft_steps;
        for (size_t L = 1; L <= dpos.size(); ++L) r[L] = dpos[L - 1] - (L < dpos.size() ? dpos[L] : 0);
        return r;
    }
};

struct Variant {
    std::string label;  // drafter description
    SpecParams  sp;
    bool        synth = false;  // synth_reference = the plain greedy output of the prompt
};

struct Group {
    std::string key, title;
    std::string target, draft;  // file names; draft empty = none
    float       temp = 0;
    bool        copy_prompts = false;
    bool        fresh_engine = false;  // new engine per prompt (no dynamic n-gram cache carry-over)
    std::vector<Variant> variants;
};

struct GroupResult {
    bool             ok = false;
    Agg              plain;
    std::vector<Agg> spec;
    CostCurve        cc;
    int64_t          copy_hits = 0, copy_n = 0;  // copy-heavy prompts: see copy_share()
};

// How copy-heavy an output really is: the number of output positions whose 4-gram (the token
// and the 3 before it, prompt included) occurs in the prompt. A faithful copy of a passage in the
// prompt scores ~100%; this is what n-gram and prompt-lookup drafts can at best be right about.
int64_t copy_hits(const std::vector<token_id> & prompt, const std::vector<token_id> & out) {
    constexpr size_t kN = 4;
    std::set<std::vector<token_id>> grams;
    for (size_t i = 0; i + kN <= prompt.size(); ++i) grams.emplace(prompt.begin() + i, prompt.begin() + i + kN);
    std::vector<token_id> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    int64_t hits = 0;
    for (size_t i = prompt.size(); i < all.size(); ++i)
        if (i + 1 >= kN && grams.count(std::vector<token_id>(all.begin() + (i + 1 - kN), all.begin() + i + 1))) ++hits;
    return hits;
}

struct Options {
    std::string models_dir = SPECRPC_MODELS_DIR;
    bool        quick = false;
    int         n_tokens = 256, n_prompts = 10, n_copy = 5, reps = 1;
    std::string cases = "abcdef";
};

// The fixed draft lengths of the sweep (case d); adaptive runs use the engine's default n_max (32).
constexpr int kSweep[8] = {1, 2, 3, 4, 6, 8, 12, 16};

SpecParams spec_draft(int n_max = SpecParams{}.n_max, bool adaptive = true) {
    SpecParams sp;
    sp.types      = {SpecType::DRAFT};
    sp.n_max      = n_max;
    sp.adaptive   = adaptive;
    sp.n_parallel = 1;
    return sp;
}

SpecParams spec_of(SpecType t) {
    SpecParams sp = spec_draft();
    sp.types      = {t};
    return sp;
}

std::unique_ptr<Engine> make_engine(const Options & o, const std::string & target, const std::string & draft) {
    EngineParams p;
    p.target.path = o.models_dir + "/" + target;
    if (!draft.empty()) p.draft.path = o.models_dir + "/" + draft;
    p.n_ctx      = kCtx;
    p.n_threads  = kThreads;
    p.n_parallel = 1;
    auto e = Engine::create(p);
    if (!e) {
        std::fprintf(stderr, "[bench] cannot create engine %s / %s: %s\n", target.c_str(), draft.c_str(),
                     e.status().to_string().c_str());
        return nullptr;
    }
    return std::move(e.value());
}

CompletionRequest make_request(const std::vector<token_id> & prompt, int n, float temp, uint32_t seed) {
    CompletionRequest r;
    r.prompt               = prompt;
    r.n_predict            = n;
    r.sampling.ignore_eos  = true;  // every run emits exactly n tokens (same KV depths for both sides)
    r.sampling.temperature = temp;
    r.sampling.top_k       = 40;
    r.sampling.top_p       = 0.95f;
    r.sampling.seed        = seed;
    return r;
}

std::vector<token_id> ids_of(const CompletionResult & r) {
    std::vector<token_id> v;
    for (const auto & t : r.tokens) v.push_back(t.id);
    return v;
}

// Warm-up: page in the weights, measure the cost curve (first speculative request). The
// speculative warm-up uses a 1-token prompt so the dynamic n-gram cache learns nothing useful.
bool warm_up(Engine & e, const Group & g) {
    auto p = e.tokenize("Once upon a time", true, false);
    if (!p) return false;
    auto r = e.complete(make_request(p.value(), 16, 0.0f, 1));
    if (!r) return false;
    CompletionRequest s = make_request({e.info().bos >= 0 ? e.info().bos : p.value()[0]}, 2, 0.0f, 1);
    s.spec = g.variants.front().sp;
    s.spec.synth_reference.clear();
    auto rs = e.complete(s);
    return rs.is_ok();
}

GroupResult run_group(const Options & o, const Group & g, int idx, int n_groups) {
    GroupResult gr;
    gr.spec.resize(g.variants.size());
    std::fprintf(stderr, "[bench] case %d/%d: %s\n", idx, n_groups, g.title.c_str());
    const auto & all_prompts = g.copy_prompts ? kCopyPrompts : kPrompts;
    const int    n_prompts   = std::min<int>(g.copy_prompts ? o.n_copy : o.n_prompts, static_cast<int>(all_prompts.size()));
    const bool   any_synth   = std::any_of(g.variants.begin(), g.variants.end(), [](const Variant & v) { return v.synth; });

    std::unique_ptr<Engine> eng;
    const size_t nv = g.variants.size();
    for (int i = 0; i < n_prompts; ++i) {
        const uint32_t seed = 1000u + static_cast<uint32_t>(i);
        std::vector<token_id> prompt, plain_ids;
        // best of o.reps (smallest generation time) per configuration; -1 = not yet run
        CompletionResult plain_best;
        std::vector<CompletionResult> best(nv);
        bool have_plain = false;
        std::vector<char> have(nv, 0);
        for (int rep = 0; rep < o.reps; ++rep) {
            if (!eng || g.fresh_engine) {
                eng.reset();
                eng = make_engine(o, g.target, g.draft);
                if (!eng || !warm_up(*eng, g)) { std::fprintf(stderr, "[bench]   engine/warm-up failed\n"); return gr; }
                gr.cc = eng->cost_curve();
            }
            if (prompt.empty()) {
                auto tp = eng->tokenize(all_prompts[i], true, false);
                if (!tp) { std::fprintf(stderr, "[bench]   tokenize failed: %s\n", tp.status().to_string().c_str()); return gr; }
                prompt = tp.value();
            }
            // order: plain first on even (prompt + rep), last on odd (synthetic needs the plain
            // output first); the variants rotate unless the group keeps a fixed order (fresh engines)
            std::vector<int> order;  // -1 = plain
            for (size_t k = 0; k < nv; ++k) order.push_back(static_cast<int>(g.fresh_engine ? k : (k + i + rep) % nv));
            if (any_synth || (i + rep) % 2 == 0) order.insert(order.begin(), -1);
            else order.push_back(-1);

            for (int v : order) {
                CompletionRequest req = make_request(prompt, o.n_tokens, g.temp, seed);
                if (v >= 0) {
                    req.spec = g.variants[v].sp;
                    if (kVerifier && g.temp > 0) req.spec.verifier = *kVerifier;
                    if (g.variants[v].synth) req.spec.synth_reference = plain_ids;
                }
                auto r = eng->complete(req);
                if (!r) {
                    std::fprintf(stderr, "[bench]   request failed (%s): %s\n", v < 0 ? "plain" : g.variants[v].label.c_str(),
                                 r.status().to_string().c_str());
                    return gr;
                }
                if (v < 0) {
                    if (plain_ids.empty()) plain_ids = ids_of(r.value());
                    if (!have_plain || r.value().timings.predicted_ms < plain_best.timings.predicted_ms) plain_best = r.value();
                    have_plain = true;
                } else {
                    if (!have[v] || r.value().timings.predicted_ms < best[v].timings.predicted_ms) best[v] = r.value();
                    have[v] = 1;
                    gr.spec[v].add_cost(eng->cost_curve());
                }
            }
        }
        gr.plain.add(plain_best);
        if (g.copy_prompts) {
            gr.copy_hits += copy_hits(prompt, plain_ids);
            gr.copy_n += static_cast<int64_t>(plain_ids.size());
        }
        std::string line;
        char buf[160];
        for (size_t v = 0; v < nv; ++v) {
            gr.spec[v].add(best[v]);
            gr.spec[v].ratios.push_back(plain_best.timings.predicted_ms / std::max(1e-9, best[v].timings.predicted_ms));
            if (g.temp <= 0) {
                gr.spec[v].greedy_checked++;
                gr.spec[v].greedy_equal += ids_of(best[v]) == plain_ids;
            }
            std::snprintf(buf, sizeof buf, " | %s %.1f t/s acc %.0f%%", g.variants[v].label.c_str(),
                          best[v].timings.predicted_per_second(), 100 * best[v].spec.accept_rate());
            line += buf;
        }
        std::fprintf(stderr, "[bench]   prompt %d/%d: plain %.1f t/s%s\n", i + 1, n_prompts,
                     plain_best.timings.predicted_per_second(), line.c_str());
    }
    gr.ok = true;
    return gr;
}

// ---------------------------------------------------------------------------------------------
// Rows of the report

struct Row {
    std::string case_id, target, drafter, temp;
    int         n_prompts = 0;
    bool        ok = false;
    double      plain_tps = 0, spec_tps = 0, ratio = 0, ratio_med = 0, accept = 0, alpha = 0, mal = 0, off_pct = 0;
    int         gamma = 0, gamma_star = 0;
    double      best_s = 1;
    double      v_g1 = 0, c = 0, o = 0, pred = 1, pred_mix = 1, ach_pred = 0;
    int         greedy_checked = 0, greedy_equal = 0;
};

// The cost model a configuration's prediction uses: the engine's curve as it stood after that
// configuration's requests (mean over them), or the start-up curve if none was recorded.
CostModel cost_model_of(const GroupResult & gr, const Variant & v, const Agg & s) {
    const CostCurve cc = s.cost_n ? s.cost() : gr.cc;
    CostModel cm;
    cm.v = cc.v;
    cm.c = (!v.sp.types.empty() && v.sp.types.front() == SpecType::DRAFT) ? cc.c : 0.0;
    cm.o = s.o();
    return cm;
}

Row make_row(const std::string & case_id, const Group & g, const GroupResult & gr, int v, int n_prompts) {
    Row r;
    r.case_id   = case_id;
    r.target    = short_name(g.target);
    r.drafter   = g.variants[v].label;
    r.temp      = g.temp > 0 ? "0.8" : "0";
    r.n_prompts = n_prompts;
    if (!gr.ok) return r;
    const Agg & s = gr.spec[v];
    r.ok        = true;
    r.plain_tps = gr.plain.tps();
    r.spec_tps  = s.tps();
    r.ratio     = r.plain_tps > 0 ? r.spec_tps / r.plain_tps : 0;
    {
        std::vector<double> q = s.ratios;
        std::sort(q.begin(), q.end());
        r.ratio_med = q.empty() ? 0 : q.size() % 2 ? q[q.size() / 2] : 0.5 * (q[q.size() / 2 - 1] + q[q.size() / 2]);
    }
    r.accept    = s.accept_rate();
    r.alpha     = s.alpha();
    r.mal       = s.mean_accept_len();
    r.off_pct   = s.steps ? 100.0 * s.off_rounds / s.steps : 0;
    r.gamma     = s.gamma_mode();
    r.o         = s.o();
    const CostModel cm = cost_model_of(gr, g.variants[v], s);
    r.c         = cm.c;
    r.v_g1      = cm.v.empty() ? 0 : cost_model_v(cm, r.gamma + 1);
    r.pred      = cm.v.empty() ? 1 : predicted_speedup(cm, r.alpha, r.gamma);
    if (!cm.v.empty()) {
        const GammaChoice gc = choose_gamma(cm, r.alpha, std::max(1, g.variants[v].sp.n_min), g.variants[v].sp.n_max);
        r.gamma_star = gc.gamma;
        r.best_s     = gc.predicted;
    }
    // prediction for the draft lengths actually verified (mixture over rounds, plain rounds
    // included), with the measured acceptance by depth: what the achieved speed-up is judged by
    const auto rl = s.rounds_by_len();
    const std::vector<double> prof = s.depth_profile();
    double tok = 0, cost = 0;
    for (size_t L = 0; L < rl.size(); ++L) {
        tok += double(rl[L]) * expected_tokens(prof, static_cast<int>(L));
        cost += double(rl[L]) * (L == 0 ? 1.0 : cost_model_v(cm, static_cast<int>(L) + 1) + double(L) * cm.c + cm.o);
    }
    r.pred_mix       = cost > 0 && !cm.v.empty() ? tok / cost : 1;
    r.ach_pred       = r.pred_mix > 0 ? r.ratio / r.pred_mix : 0;
    r.greedy_checked = s.greedy_checked;
    r.greedy_equal   = s.greedy_equal;
    return r;
}

void print_row(const Row & r) {
    if (!r.ok) {
        std::printf("| %s | %s | %s | %s | %d | — | — | — | — | — | — | — | — | — | — | — | — | — | — | — | — (failed) |\n", r.case_id.c_str(),
                    r.target.c_str(), r.drafter.c_str(), r.temp.c_str(), r.n_prompts);
        return;
    }
    std::printf("| %s | %s | %s | %s | %d | %.1f | %.1f | **%.2fx** | %.2fx | %.1f%% | %.3f | %.2f | %d | %.0f%% | %.2f | %.3f | %.3f | %.2fx | %.2fx | %.2fx (γ*=%d) | %.2f |\n",
                r.case_id.c_str(), r.target.c_str(), r.drafter.c_str(), r.temp.c_str(), r.n_prompts, r.plain_tps,
                r.spec_tps, r.ratio, r.ratio_med, 100 * r.accept, r.alpha, r.mal, r.gamma, r.off_pct, r.v_g1, r.c, r.o,
                r.pred, r.pred_mix, r.best_s, r.gamma_star, r.ach_pred);
}

std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, sep))
        if (!item.empty()) out.push_back(item);
    return out;
}

}  // namespace

int main(int argc, char ** argv) {
    Options o;
    int tokens = -1, prompts = -1;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--quick") o.quick = true;
        else if (a == "--models" && i + 1 < argc) o.models_dir = argv[++i];
        else if (a == "--cases" && i + 1 < argc) {
            o.cases.clear();
            for (const auto & c : split(argv[++i], ',')) o.cases += c;
        } else if (a == "--tokens" && i + 1 < argc) tokens = std::atoi(argv[++i]);
        else if (a == "--prompts" && i + 1 < argc) prompts = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) kThreads = std::max(1, std::atoi(argv[++i]));
        else if (a == "--verifier" && i + 1 < argc) {
            const std::string v = argv[++i];
            kVerifier = v == "block" ? SpecVerifier::BLOCK : v == "tokenwise" ? SpecVerifier::TOKENWISE
                      : v == "coupled" ? SpecVerifier::COUPLED : SpecVerifier::AUTO;
        }
        else if (a == "--reps" && i + 1 < argc) o.reps = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: %s [--quick] [--models DIR] [--cases a,b,c,d,e,f] [--tokens N] [--prompts N] [--threads N] [--reps N] [--verifier auto|tokenwise|block|coupled]\n", argv[0]);
            return 2;
        }
    }
    if (o.quick) { o.n_tokens = 128; o.n_prompts = 3; o.n_copy = 2; }
    if (tokens > 0) o.n_tokens = tokens;
    if (prompts > 0) { o.n_prompts = std::min(prompts, 10); o.n_copy = std::min(prompts, 5); }
    for (char c : o.cases)
        if (c < 'a' || c > 'f') { std::fprintf(stderr, "unknown case '%c' (a..f)\n", c); return 2; }
    auto want = [&](char c) { return o.cases.find(c) != std::string::npos; };

    const std::string F32 = "stories260K-F32.gguf", Q4 = "stories260K-Q4_0.gguf", Q8 = "stories260K-Q8_0.gguf";
    const std::string X25 = "stories260K-x25M-Q8_0.gguf", X100 = "stories260K-x100M-Q8_0.gguf",
                      NEAR = "stories260K-x100M-near-Q8_0.gguf";

    // All groups by key; the cases reference them (a group used by two cases runs once).
    std::map<std::string, Group> groups;
    auto add = [&](Group g) { groups[g.key] = std::move(g); };
    auto tname = [](float t) { return std::string(t > 0 ? "T=0.8" : "T=0"); };
    for (float t : {0.0f, 0.8f}) {
        const std::string ts = tname(t);
        for (auto [d, dn] : {std::pair{Q4, "Q4_0"}, std::pair{Q8, "Q8_0"}})
            add({"a-" + std::string(dn) + ts, "260K-F32 <- " + std::string(dn) + " draft, " + ts, F32, d, t, false, false,
                 {{std::string(dn) + " draft", spec_draft()}}});
        for (auto [tg, tn] : {std::pair{X25, "x25M"}, std::pair{X100, "x100M"}, std::pair{NEAR, "x100M-near"}})
            add({"b-" + std::string(tn) + ts, std::string(tn) + " <- F32 draft, " + ts, tg, F32, t, false, false,
                 {{"F32 draft", spec_draft()}}});
        add({"c-" + ts, "copy-heavy prompts on x100M: n-gram, lookup, " + ts, X100, "", t, true, true,
             {{"ngram", spec_of(SpecType::NGRAM)}, {"lookup", spec_of(SpecType::LOOKUP)}}});
    }
    for (auto [tg, tn] : {std::pair{NEAR, "x100M-near"}, std::pair{X100, "x100M"}}) {
        Group g{"d-" + std::string(tn), std::string(tn) + " <- F32 draft, T=0: fixed γ 1..16 and adaptive", tg, F32, 0.0f,
                false, false, {}};
        for (int n : kSweep) g.variants.push_back({"fixed γ=" + std::to_string(n), spec_draft(n, false)});
        g.variants.push_back({"adaptive", spec_draft(16, true)});
        add(g);
    }
    {
        SpecParams sp   = spec_of(SpecType::SYNTH);
        sp.synth_rates  = {0.1f};
        add({"e-synth", "x100M, synthetic α=0.1, T=0", X100, "", 0.0f, false, false, {{"synth α=0.1", sp, true}}});
        SpecParams sc         = spec_draft();
        sc.sample_and_compare = true;
        add({"f", "x100M-near <- F32 draft, T=0.8: rejection vs sample-and-compare", NEAR, F32, 0.8f, false, false,
             {{"F32 draft, rejection", spec_draft()}, {"F32 draft, sample&compare", sc}}});
    }

    // Cases → groups they need, in order.
    std::vector<std::string> sched;
    auto need = [&](const std::string & k) {
        if (std::find(sched.begin(), sched.end(), k) == sched.end()) sched.push_back(k);
    };
    const std::vector<std::string> a_keys = {"a-Q4_0T=0", "a-Q4_0T=0.8", "a-Q8_0T=0", "a-Q8_0T=0.8"};
    const std::vector<std::string> b_keys = {"b-x25MT=0",  "b-x25MT=0.8",       "b-x100MT=0",
                                             "b-x100MT=0.8", "b-x100M-nearT=0", "b-x100M-nearT=0.8"};
    if (want('a')) for (auto & k : a_keys) need(k);
    if (want('b')) for (auto & k : b_keys) need(k);
    if (want('c')) { need("c-T=0"); need("c-T=0.8"); }
    if (want('d')) { need("d-x100M-near"); need("d-x100M"); }
    if (want('e')) { need("b-x25MT=0"); need("b-x25MT=0.8"); need("e-synth"); }
    if (want('f')) need("f");

    std::fprintf(stderr, "[bench] %zu case(s), %d prompts (%d copy-heavy), %d tokens, %d threads, n_ctx %d%s\n",
                 sched.size(), o.n_prompts, o.n_copy, o.n_tokens, kThreads, kCtx, o.quick ? ", --quick" : "");
    std::map<std::string, GroupResult> results;
    for (size_t i = 0; i < sched.size(); ++i)
        results[sched[i]] = run_group(o, groups[sched[i]], static_cast<int>(i) + 1, static_cast<int>(sched.size()));

    auto n_pr = [&](const Group & g) { return std::min<int>(g.copy_prompts ? o.n_copy : o.n_prompts, 10); };
    auto row_of = [&](const std::string & case_id, const std::string & key, int v) {
        const Group & g = groups[key];
        return make_row(case_id, g, results[key], v, n_pr(g));
    };

    // ---- the main table
    std::vector<Row> rows;
    if (want('a')) for (auto & k : a_keys) rows.push_back(row_of("a", k, 0));
    if (want('b')) for (auto & k : b_keys) rows.push_back(row_of("b", k, 0));
    if (want('c'))
        for (const char * k : {"c-T=0", "c-T=0.8"})
            for (int v = 0; v < 2; ++v) rows.push_back(row_of("c", k, v));
    struct Sweep { std::string key; int best = -1; double best_ratio = 0, adaptive_ratio = 0; bool ok = false; };
    std::vector<Sweep> sweeps;
    if (want('d')) {
        for (const char * k : {"d-x100M-near", "d-x100M"}) {
            Sweep sw{k};
            const GroupResult & gr = results[k];
            if (gr.ok) {
                for (int v = 0; v < 8; ++v) {
                    const double ratio = gr.plain.tps() > 0 ? gr.spec[v].tps() / gr.plain.tps() : 0;
                    if (ratio > sw.best_ratio) { sw.best_ratio = ratio; sw.best = v; }
                }
                sw.adaptive_ratio = gr.spec[8].tps() / gr.plain.tps();
                sw.ok = true;
                rows.push_back(row_of("d", k, 8));
                rows.push_back(row_of("d", k, sw.best));
            } else {
                rows.push_back(row_of("d", k, 8));
            }
            sweeps.push_back(sw);
        }
    }
    if (want('e')) {
        rows.push_back(row_of("e", "b-x25MT=0", 0));
        rows.push_back(row_of("e", "b-x25MT=0.8", 0));
        rows.push_back(row_of("e", "e-synth", 0));
    }
    if (want('f')) { rows.push_back(row_of("f", "f", 0)); rows.push_back(row_of("f", "f", 1)); }

    std::printf("## Speculative decoding benchmark%s\n\n", o.quick ? " (--quick)" : "");
    std::printf("%d tokens per prompt (ignore_eos), %d threads, n_ctx %d, n_parallel 1; T=0.8 uses top_k 40, top_p 0.95, "
                "min_p 0.05. Plain and speculative runs interleaved per prompt. t/s = generated tokens ÷ generation time "
                "summed over the prompts; α = per-position acceptance (accepted ÷ positions at risk); γ = most frequent "
                "draft length (0 = off); pred S = E[N]/(v(γ+1)+γc+o) at that γ and α (i.i.d. acceptance); S mix = the "
                "prediction over the rounds actually run (plain rounds and every draft length) with E[N] from the measured "
                "acceptance by depth: achieved ÷ pred is judged against S mix; best S = the best S over γ at that α (γ*); ratio = spec t/s ÷ plain t/s, "
                "and its median over the prompts; off = share of rounds with speculation switched off; accept = accepted ÷ "
                "drafted tokens. %s\n\n",
                o.n_tokens, kThreads, kCtx,
                o.reps > 1 ? ("Each configuration ran " + std::to_string(o.reps) + " times per prompt; the fastest run is kept.").c_str() : "");
    std::printf("| case | target | drafter | T | prompts | plain t/s | spec t/s | ratio | ratio med/prompt | accept | α | mean acc len | γ | off | v(γ+1) | c | o | pred S | S mix | best S | achieved ÷ pred |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto & r : rows) print_row(r);

    // ---- the γ sweep
    if (want('d')) {
        std::printf("\n### Fixed-γ sweep (adaptive off), T=0\n\n| target | ");
        for (int n : kSweep) std::printf("γ=%d | ", n);
        std::printf("adaptive | best fixed | adaptive ÷ best |\n|---|");
        for (int n = 0; n < 11; ++n) std::printf("---|");
        std::printf("\n");
        for (const auto & sw : sweeps) {
            const Group & g = groups[sw.key];
            const GroupResult & gr = results[sw.key];
            std::printf("| %s | ", short_name(g.target).c_str());
            if (!sw.ok) { std::printf("failed |\n"); continue; }
            for (int v = 0; v < 9; ++v) {
                const Agg & s = gr.spec[v];
                const CostModel cm = cost_model_of(gr, g.variants[v], s);
                std::printf("%.2fx (α %.2f, pred %.2f) | ", s.tps() / gr.plain.tps(), s.alpha(),
                            predicted_speedup(cm, s.alpha(), v < 8 ? kSweep[v] : s.gamma_mode()));
            }
            std::printf("γ=%d %.2fx | %.3f |\n", kSweep[sw.best], sw.best_ratio, sw.adaptive_ratio / sw.best_ratio);
        }
    }

    // ---- measured cost curves
    std::printf("\n### Measured cost curves (Engine::cost_curve() at depth 128; \"runs\": refined online during the "
                "first variant's requests, the curve its prediction used)\n\n");
    std::printf("| target | draft | when | t(1) ms | v(2) | v(3) | v(4) | v(5) | v(6) | v(8) | v(9) | v(12) | v(16) | c | R = max n/v(n) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::set<std::string> seen;
    for (const auto & k : sched) {
        const Group & g = groups[k];
        const GroupResult & gr = results[k];
        const std::string id = g.target + "|" + g.draft;
        if (!gr.ok || gr.cc.v.empty() || seen.count(id)) continue;
        seen.insert(id);
        const CostCurve runs = gr.spec.empty() ? CostCurve{} : gr.spec.front().cost();
        for (const CostCurve * cc : {&gr.cc, &runs}) {
            if (cc->v.empty()) continue;
            CostModel cm;
            cm.v = cc->v;
            std::printf("| %s | %s | %s | %.3f |", short_name(g.target).c_str(), g.draft.empty() ? "—" : short_name(g.draft).c_str(),
                        cc == &gr.cc ? "start-up" : "runs", cc->t1_ms);
            for (int n : {2, 3, 4, 5, 6, 8, 9, 12, 16}) std::printf(" %.2f |", cost_model_v(cm, n));
            std::printf(" %.3f | %.2fx |\n", cc->c, speedup_limit(cm));
        }
    }

    // ---- targets
    std::printf("\n### Targets\n\n");
    auto find = [&](const std::string & c, const std::string & target, const std::string & drafter, const std::string & t) -> const Row * {
        for (const auto & r : rows)
            if (r.case_id == c && r.target == target && r.drafter == drafter && r.temp == t) return &r;
        return nullptr;
    };
    auto verdict = [](bool known, bool pass) { return !known ? "N/A (not run)" : pass ? "PASS" : "FAIL"; };
    {
        std::string bad;
        int n = 0;
        bool known = false;
        for (const auto & r : rows) {
            if (!r.ok) continue;
            known = true;
            ++n;
            if (r.ach_pred < 0.9) {
                char buf[200];
                std::snprintf(buf, sizeof buf, "%s%s %s %s T=%s (%.2f)", bad.empty() ? "" : "; ", r.case_id.c_str(),
                              r.target.c_str(), r.drafter.c_str(), r.temp.c_str(), r.ach_pred);
                bad += buf;
            }
        }
        std::printf("- achieved ≥ 0.9 × predicted (all %d rows): **%s**%s%s\n", n, verdict(known, bad.empty()),
                    bad.empty() ? "" : " — below: ", bad.c_str());
    }
    {
        bool known = false, pass = true;
        std::string detail;
        for (const auto & sw : sweeps) {
            if (!sw.ok) continue;
            known = true;
            const double q = sw.adaptive_ratio / sw.best_ratio;
            pass &= q >= 0.95;
            char buf[160];
            std::snprintf(buf, sizeof buf, "%s%s: adaptive %.2fx vs fixed γ=%d %.2fx (%.3f)", detail.empty() ? "" : "; ",
                          short_name(groups[sw.key].target).c_str(), sw.adaptive_ratio, kSweep[sw.best], sw.best_ratio, q);
            detail += buf;
        }
        std::printf("- adaptive within 5%% of the best fixed γ: **%s** %s\n", verdict(known, pass), detail.c_str());
    }
    {
        const Row * a = find("e", "x25M-Q8_0", "F32 draft", "0");
        const Row * b = find("e", "x25M-Q8_0", "F32 draft", "0.8");
        const Row * s = find("e", "x100M-Q8_0", "synth α=0.1", "0");
        const bool known = a && b && s && a->ok && b->ok && s->ok;
        const bool pass  = known && a->ratio >= 0.97 && b->ratio >= 0.97 && s->ratio >= 0.97;
        std::printf("- x25M (T=0, T=0.8) and synthetic α=0.1 ≥ 0.97x plain: **%s**", verdict(known, pass));
        if (known) std::printf(" (x25M T=0 %.2fx, T=0.8 %.2fx; synthetic %.2fx)", a->ratio, b->ratio, s->ratio);
        std::printf("\n");
    }
    {
        const Row * r = find("b", "x100M-near-Q8_0", "F32 draft", "0");
        const bool known = r && r->ok;
        std::printf("- x100M-near T=0 ≥ 1.4x: **%s**", verdict(known, known && r->ratio >= 1.4));
        if (known) std::printf(" (%.2fx)", r->ratio);
        std::printf("\n");
    }
    {
        const Row * n = find("c", "x100M-Q8_0", "ngram", "0");
        const Row * l = find("c", "x100M-Q8_0", "lookup", "0");
        const bool known = n && l && n->ok && l->ok;
        std::printf("- copy-heavy n-gram / lookup on x100M (T=0) ≥ 1.5x: **%s**",
                    verdict(known, known && n->ratio >= 1.5 && l->ratio >= 1.5));
        if (known) std::printf(" (n-gram %.2fx, lookup %.2fx)", n->ratio, l->ratio);
        const auto it = results.find("c-T=0");
        if (it != results.end() && it->second.copy_n > 0)
            std::printf("; the target's own T=0 output repeats a 4-gram of its prompt at %.0f%% of positions "
                        "(a faithful copy: ~100%%)", 100.0 * double(it->second.copy_hits) / double(it->second.copy_n));
        std::printf("\n");
    }
    {
        const Row * rj = find("f", "x100M-near-Q8_0", "F32 draft, rejection", "0.8");
        const Row * sc = find("f", "x100M-near-Q8_0", "F32 draft, sample&compare", "0.8");
        const bool known = rj && sc && rj->ok && sc->ok;
        std::printf("- T=0.8: rejection sampling accepts more than sample-and-compare: **%s**",
                    verdict(known, known && rj->accept > sc->accept));
        if (known) std::printf(" (accept %.1f%% vs %.1f%%; α %.3f vs %.3f; speed %.2fx vs %.2fx)", 100 * rj->accept,
                               100 * sc->accept, rj->alpha, sc->alpha, rj->ratio, sc->ratio);
        std::printf("\n");
        std::printf("- x100M-near T=0.8 ≥ 1.25x: **%s**", verdict(known, known && rj->ratio >= 1.25));
        if (known) std::printf(" (%.2fx)", rj->ratio);
        std::printf("\n");
    }
    // greedy equality as a side check (T=0 speculative output vs the plain output of the same prompt)
    {
        std::string bad;
        for (const auto & r : rows)
            if (r.ok && r.greedy_checked && r.greedy_equal != r.greedy_checked) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "%s%s %s %s: %d/%d", bad.empty() ? "" : "; ", r.case_id.c_str(),
                              r.target.c_str(), r.drafter.c_str(), r.greedy_equal, r.greedy_checked);
                bad += buf;
            }
        std::printf("- (check) T=0 speculative output identical to plain: %s\n",
                    bad.empty() ? "all identical" : ("differs — " + bad).c_str());
    }
    bool any_failed = false;
    for (const auto & r : rows) any_failed |= !r.ok;
    return any_failed ? 1 : 0;
}
