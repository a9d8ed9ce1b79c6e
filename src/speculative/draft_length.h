// Draft length: the cost model of a speculative round and the adaptive choice of γ
// (docs/design.md §3). No llama.cpp; the caller measures v(n) and c and feeds round outcomes.
//
// With per-position acceptance α and γ drafted tokens, one round emits on average
//     E[N] = Σ_{i=0..γ} α^i = (1 − α^(γ+1)) / (1 − α)      (γ + 1 when α = 1)
// tokens (accepted prefix + the correction/bonus token) for a cost, in target steps, of
//     v(γ+1) + γ·c + o
// so the speed-up over plain decoding (1 token per target step) is
//     S(γ) = E[N] / (v(γ+1) + γ·c + o),     S(0) = 1 by definition,
// capped by R = max_n n / v(n) (α = 1, c = o = 0).
#pragma once

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"

namespace specrpc {

struct CostModel {
    std::vector<double> v;        // v[n] = time of a target pass over n tokens ÷ time of a
                                  // 1-token pass; index 0 unused, v[1] = 1; entries ≤ 0 = not
                                  // measured (interpolated linearly between measured neighbours);
                                  // past the last measured n, extrapolated along the last two
                                  // measured points (slope clamped ≥ 0); with nothing measured
                                  // beyond n = 1, v(n) = n
    double              c = 0.0;  // one draft step ÷ one target step (0 for n-gram/lookup)
    double              o = 0.0;  // per-round overhead (drafting setup, KV bookkeeping,
                                  // sampling), in target steps
};

// Ok iff v has v[1] (≈ 1 or unset) and finite entries, c ≥ 0, o ≥ 0.
Status cost_model_check(const CostModel & cm);

// v(n) as described on CostModel::v; 0 for n ≤ 0.
double cost_model_v(const CostModel & cm, int n);

// E[N] = Σ_{i=0..γ} α^i, α clamped to [0, 1]; 1 for γ ≤ 0.
double expected_tokens(double alpha, int gamma);

// S(γ) = E[N] / (v(γ+1) + γ·c + o); 1 for γ ≤ 0 (plain decoding).
double predicted_speedup(const CostModel & cm, double alpha, int gamma);

// R = max over 1 ≤ n ≤ n_max of n / v(n): the best any draft could do (α = 1, c = o = 0).
// n_max ≤ 0 = the last n with a measured v.
double speedup_limit(const CostModel & cm, int n_max = 0);

struct GammaChoice {
    int    gamma     = 0;    // chosen draft length; 0 = speculation off
    double predicted = 1.0;  // S(gamma); 1 when off
};

// The γ in [max(gamma_min, 1), gamma_max] maximising S(γ) (the smallest on ties); {0, 1} when
// the best S < 1 or the range is empty.
GammaChoice choose_gamma(const CostModel & cm, double alpha, int gamma_min, int gamma_max);

// Acceptance by depth: a[j] = P(the draft token at depth j is accepted | depths 1..j−1 were),
// j ≥ 1 (a[0] unused; past the end of a, its last entry). Drafts usually get worse the further
// they run from the target's last token, so a[j] falls with j and the i.i.d. model (a[j] = α)
// over-predicts long drafts. Then
//     E[N](γ) = 1 + Σ_{i=1..γ} Π_{j=1..i} a[j].
double expected_tokens(const std::vector<double> & a, int gamma);
double predicted_speedup(const CostModel & cm, const std::vector<double> & a, int gamma);
GammaChoice choose_gamma(const CostModel & cm, const std::vector<double> & a, int gamma_min, int gamma_max);

// A drafter may know before verification how much its proposal is worth: prompt lookup knows the
// length of the match it copies from (a long one is a passage being repeated, and copies on; a
// short one is a coincidence). Its acceptance is then bimodal, ~100% after long matches and ~0
// after short ones, and one profile for both averages the two: γ short where the copy holds,
// speculation off for whole passages it would have drafted (docs/benchmarks.md, "Draft classes").
// Such a drafter tags each proposal with a class 1..kDraftClasses − 1 (0: it tells nothing),
// higher classes for proposals it trusts more, and the policy keeps an acceptance profile per
// class beside the pooled one; γ is chosen on the proposal's class.
constexpr int kDraftClasses = 8;

// What a draft class has shown, per depth j (index 0 unused): s[j] acceptances of n[j] positions
// at risk, both discounted by λ = 1 − ema_weight at each new one (so n saturates near 1/w). The
// class's a[j] is then the Beta-smoothed rate
//     a[j] = (s[j] + m·max(b[j], a[j−1])) / (n[j] + m),   m = kClassPseudo,   a[0] = 0,
// b[j] the best a[j] of the pooled profile and the lower classes (classes are ordered by
// confidence). A rarely reached depth borrows from the depth above: a copy that held to depth 7
// is expected to hold at 8 about as well (its hazard is flat), and a class never drafted deeper
// than its γ could never learn that a longer γ pays if it borrowed a pessimistic pooled value.
struct DraftClassEvidence {
    std::vector<double> s, n;
};

// How a greedy model draft's own confidence predicts its acceptance (DraftLengthPolicy::
// confidence_acceptance): per bin of the draft's top probability (kConfBins, edges kConfEdges),
// s[b] acceptances of n[b] drafted tokens at risk, both discounted by kConfKeep at each new one.
constexpr int kConfBins = 10;
struct ConfidenceEvidence {
    std::vector<double> s, n;  // [bin]; empty = nothing seen
    // The stop's empty rounds (DraftLengthPolicy::observe_empty): their share among its paying
    // rounds (e) and their measured excess over a plain round in target passes (x; < 0: none).
    double empty_share = 0, empty_excess = -1;
};

// What probing has cost: carried from request to request of one drafter and regime by the
// engine, so the probe budget bounds what a useless draft costs a server, not each request (a
// request of 256 tokens cannot afford even one probe at 2%; a stream of them can, now and then).
struct ProbeLedger {
    double work     = 0;  // target work, in 1-token-pass units
    double spent    = 0;  // net cost of probes (work − tokens emitted) and of their catch-ups
    double catch_up = 0;  // the last catch-up's cost: what the next probe's is expected to cost
    // The probe back-off, carried too: it describes the drafter, not one request (restarting at
    // probe_interval, every 256-token request probed a useless drafter at rounds 16, 48, 112, 240).
    int    interval    = 0;  // the interval the last request left; 0 = start at probe_interval
    int    since_probe = 0;  // plain rounds since the last probe (so an interval longer than a
                             // request still comes round)
};

struct DraftLengthOptions {
    int    n_min          = 1;      // smallest γ drafted when speculating (0 behaves as 1)
    int    n_max          = 8;      // largest γ
    bool   adaptive       = true;   // false: always n_max (capped by `remaining`)
    double ema_weight     = 0.1;    // w: weight of one drafted position in the moving average of α
    int    probe_interval = 16;     // when off, draft again after this many plain rounds; 0 = never
    int    probe_interval_max = 512;// each probe with a rejection doubles the interval, up to this
                                    // (a useless probe then costs < 1%); a fully accepted probe
                                    // keeps it; turning speculation on resets it. No probes when
                                    // α = 1 cannot pay.
    int    probe_gamma    = 3;      // least γ of a probe round (clamped to [n_min, n_max]); a
                                    // probe drafts to the γ of the best predicted S if deeper
    double alpha_prior    = 0.85;   // α before any observation: optimistic, so a first request
                                    // drafts at once (a bad drafter is off after 2-3 rounds)
    double min_speedup    = 1.05;   // off when the best predicted S is below this: a prediction
                                    // of 1.00-1.05x is within the cost model's error (x25M ran
                                    // 0.92-0.95x with 1.0 here, 0.95-0.98x with 1.05; docs/benchmarks.md)
    double slow_weight    = 0.02;   // the longer run off_relax fades to: this request's positions
                                    // (and the prior's, prior_run) at each depth, each weighing
                                    // 1 − slow_weight less at every new one (~50 positions,
                                    // against ~20 for ema_weight); used at a depth once they
                                    // weigh kDepthFull
    double off_relax      = 0.1;    // each round off, each depth's average below that longer run
                                    // closes this share of the gap. The profile judges on ~20
                                    // positions a depth, and a drafter worth 1.25x dips below
                                    // min_speedup by chance every few dozen rounds; off, it learns
                                    // only from probes, so the dip stayed, and the next requests
                                    // started from it: x100M at T = 0.8 was off in 30-90% of its
                                    // rounds, up to 1127 in a row (docs/benchmarks.md, "Off on a
                                    // dip, and t(1) by depth again"). What the last rounds said
                                    // grows old while nothing is drafted, and the longer run is
                                    // then the better guess; it turns the drafter on again when it
                                    // pays. A drafter that has got worse for good has a longer run
                                    // that fell too. 0 = the dip stays until probes lift it
    double prior_run      = 16;     // the longer run starts from what earlier requests measured
                                    // (long_prior, else depth_prior), counted as this many
                                    // positions a depth; they weigh less at each new position like
                                    // the request's own. A request of 256 tokens drafts ~15-20
                                    // positions a depth before a dip can switch it off, too few
                                    // for a longer run of its own, so the dip it faded to was the
                                    // request's own start: x100M at T = 0.8 was off again in
                                    // 19-72% of its rounds, whole requests at a time
                                    // (docs/benchmarks.md, "The longer run starts from earlier
                                    // requests"). 0 = each request's longer run starts empty
    DraftClassEvidence long_prior;  // what earlier requests measured at each depth: s[j] accepted
                                    // of n[j] positions, pooled over requests, each request's
                                    // weighing kLongKeep less at every new one
                                    // (DraftLengthPolicy::next_long_prior). Pooled by positions,
                                    // a request whose text the drafter cannot follow (off after a
                                    // few rounds, few positions) moves it little, where it sets
                                    // depth_prior, the profile the next request starts from:
                                    // then that request, whatever its text, started off and faded
                                    // to a longer run as low. Empty = depth_prior
    int    first_look     = 0;      // nothing learned yet for this drafter: its first rounds
                                    // draft (probes outside the budget, as deep as speculation
                                    // would draft) whatever the prediction says, until this many
                                    // draft positions have been tested or first_look_rounds rounds
                                    // drafted; the engine sets it for a model drafter with no
                                    // learned prior. A prior is only a guess, and one round too
                                    // little to judge by: one early rejection would switch a good
                                    // drafter off for the rest of its first request
    int    first_look_rounds = 5;   // at most this many rounds of looking (a drafter rejected at
                                    // depth 1 tests one position per round)
    int    explore_every  = 64;     // while on below the cap, every this many rounds draft
                                    // longer (twice the chosen γ, at most the cap) twice in a row
                                    // (the second a steady pass the engine can time): the cost of
                                    // a size never drafted is never measured again, so one high
                                    // reading would keep γ short for good; 0 = never
    std::vector<double> depth_prior;  // a[j] learned by earlier requests (a[0] unused; past its
                                    // end, its last entry); empty = alpha_prior at every depth.
                                    // Trusted like kDepthFull observations per depth, so a draft
                                    // that falls apart at depth 6 is not drafted to 16 for the
                                    // first rounds of every request; past the depths a request
                                    // drafts, the trust fades (DraftLengthPolicy::kPriorFade)
    double probe_budget   = 0.02;   // probes, with the draft catch-up they need, may cost at most
                                    // this share of the target work (in 1-token-pass units, net
                                    // of the tokens they emit): a drafter that never pays then
                                    // costs ~2% however the interval backs off
    ProbeLedger probe_ledger;       // the spending so far (earlier requests)
    ConfidenceEvidence confidence_prior; // what earlier requests showed of the draft's confidence
                                    // (DraftLengthPolicy::confidence_evidence); empty = nothing
    bool   classes_apart  = false;  // classed proposals (cls ≥ 1) teach their class only, not the
                                    // pooled profile, α and the totals, which are then the
                                    // unclassed drafter's: in "lookup, then draft" the model drafts
                                    // (class 0) when lookup finds nothing, and a pooled profile
                                    // fed by lookup's whole copies kept it drafting 15 tokens at
                                    // 0-2 accepted (docs/benchmarks.md, "A chain's model drafts
                                    // were priced free"); the engine sets it for such chains
    std::vector<DraftClassEvidence> class_prior;  // [cls]: what earlier requests showed of each
                                    // draft class (DraftLengthPolicy::class_evidence); missing or
                                    // empty = nothing, the class starts from the pooled profile
                                    // and the classes below it
};

// Ok iff 0 ≤ n_min ≤ n_max, w in (0, 1], probe_interval ≥ 0, probe_gamma ≥ 1,
// alpha_prior in [0, 1], min_speedup > 0, explore_every ≥ 0, slow_weight in (0, 1], off_relax in
// [0, 1], prior_run ≥ 0. The failing field is named in Status::param.
Status draft_length_options_check(const DraftLengthOptions & opts);

struct GammaDecision {
    int    gamma     = 0;      // γ to draft this round; 0 = plain decoding step
    double predicted = 1.0;    // S(gamma) at the α of the decision
    bool   off       = false;  // speculation judged not to pay (γ = 0)
    bool   probe     = false;  // a short draft while off, so α can recover
    bool   capped    = false;  // γ limited by `remaining`
    bool   explore   = false;  // drafted to the cap to measure its cost (explore_every)
    bool   switch_on = false;  // on again after plain rounds, without a probe: the draft's
                               // catch-up on the tokens emitted meanwhile is paid from the
                               // probe budget, like a probe's
};

// Per-request draft-length policy: tracks α and picks γ each round. Not thread-safe (owned by
// the engine thread, like the rest of a request's speculative state).
class DraftLengthPolicy {
  public:
    DraftLengthPolicy(CostModel cm, DraftLengthOptions opts);  // opts assumed checked

    // γ to draft this round. `remaining` = tokens the request may still emit (n_predict and
    // context room): the round emits up to γ + 1, so γ ≤ remaining − 1. `cls`: the class of the
    // proposal already made (a drafter that proposes before the decision; its length then
    // belongs in `remaining`), 0 = none; out of range counts as 0.
    int next_gamma(int remaining = INT_MAX, int cls = 0);

    // Outcome of a round: `n_drafted` = length of the drafted path the verifier walked (chain:
    // γ; tree: its depth, or the leaf's depth if the accepted path ended at a leaf), `n_accepted`
    // = accepted length. Positions at risk n = k + (k < γ ? 1 : 0), successes k, and
    //     α ← λ^n · α + (1 − λ^n) · k / n,   λ = 1 − w,
    // i.e. n per-position EMA steps α ← λα + w·x_i with the round's x_i replaced by their mean
    // (Σ_{i=1..n} w λ^{n−i} = 1 − λ^n), so the update does not depend on the order within a round.
    // Each depth also keeps its own moving average of a[j] (the depth k+1 of a rejection is a
    // failure, the depths 1..k successes, deeper ones unseen); γ is chosen on that profile.
    // `cls` > 0 teaches that class's profile too (the pooled one learns from every round).
    void observe(int n_drafted, int n_accepted, int cls = 0);
    // The confidence stop of a greedy model draft (the engine's default; SpecParams::p_min < 0).
    // A draft whose top probability is low is often wrong, how often depends on the pair of
    // models: a draft distilled near its target is right at 0.3 as at 0.9, one that copies its
    // context is right when sure and guesses otherwise. So the engine learns, per bin of the
    // draft's top probability, how often such a token is accepted (a_b, Beta-smoothed towards
    // α), and while drafting keeps P_d = Π_{i ≤ d} a_{b_i}, the chance that the whole path so far
    // is accepted. Token d + 1 adds P_{d+1} expected tokens at the cost of one more verified
    // position, about (v(γ+1) − 1 + γc) / γ target passes at the round's γ; it is worth it while
    // it earns at least the round's predicted speed-up S, or while it is as likely to be accepted
    // as the profile γ was chosen on expected of the round's last token (A_γ = Π_{j ≤ γ} a[j]):
    //     draft on while P_{d+1} ≥ min(S · (v(γ+1) − 1 + γc) / γ, A_γ)     (stop_below()).
    // So bins that tell nothing (a_b = α) never cut a draft short of γ. Probes, explorations and a
    // fixed γ (not adaptive) have no stop. A chain the stop cut is verified only if it pays
    // (chain_pays). The stop is decided from the draft's distribution before its token is taken;
    // at T = 0 the token is its argmax whatever is decided, so the output cannot change.
    static int confidence_bin(double top_p);
    double     confidence_acceptance(int bin) const;   // a_b
    double     stop_below() const { return stop_below_; }  // for the γ last chosen; 0 when off
    // Whether a drafted chain of L tokens whose paths are accepted with probabilities P_1..P_L
    // is worth a verification pass: (1 + Σ P_i) / (v(L+1) + Lc + o) ≥ min_speedup.
    bool       chain_pays(const std::vector<double> & path_p) const;
    // A verified greedy model draft: bins[i] the confidence bin of its token at depth i + 1;
    // depths 1..k accepted, k + 1 rejected (if drafted), deeper ones not at risk.
    void       observe_confidence(const std::vector<int8_t> & bins, int n_accepted);
    // A paying round the stop left with nothing worth verifying (cut before its first token, or
    // too short to pay): it decoded plain after running the draft, `excess` target passes dearer
    // than a plain round (< 0: not timed; then c + o is assumed). With e the share of such rounds
    // among the stop's paying ones and x their excess, a round of γ is worth
    //     S_e = ((1 − e)·E[N(γ)] + e) / ((1 − e)·(v(γ+1) + γc + o) + e·(1 + x)),
    // and speculation stays on only while S_e ≥ min_speedup, the verified rounds' own margin (at
    // 1.0, a drafter at S_e ≈ 1.0 with 79% of its rounds empty stayed on and ran 0.91-0.98x on a
    // machine of dearer short passes). The profile cannot see this: it learns from
    // verified drafts alone, which the stop made the confident ones (stories260K drafting for the
    // copy target: 78 of a request's 92 paying rounds empty, each ~0.23 passes dearer than plain;
    // 0.92-0.93x on ordinary prompts, docs/benchmarks.md "Empty rounds of the confidence stop").
    // While off, e fades (kEmptyFade a round), so a draft whose text has changed is tried again.
    // e and x are carried to the next request with the bins (confidence_evidence).
    void       observe_empty(double excess);
    double     empty_share() const { return conf_.empty_share; }
    static constexpr double kEmptyFade = 0.99;
    const ConfidenceEvidence & confidence_evidence() const { return conf_; }
    static constexpr double kConfKeep   = 0.98;  // a bin remembers ~50 tokens
    static constexpr double kConfPseudo = 2.0;   // the prior α counts as 2 tokens of a bin

    // A probe in shadow: the last decision was a probe, and the engine drafted it but decodes the
    // round plain, comparing the draft with the tokens plain decoding then emits (a greedy or
    // one-hot model draft: a drafted token is accepted exactly when plain decoding emits it, or
    // with the law of that event, so the comparison is the verification's outcome or a sample of
    // it). A probe's verification pass is most of what a useless draft costs: v(γ+1) + o target
    // passes for the one or two tokens it emits (stories260K beside the copy target, γ = 3: ~1.5
    // passes net of its tokens, against ~0.2 for drafting it). In shadow the probe costs its draft
    // only (γc, charged to the budget); the price is that the tokens it would have accepted come
    // plain. Returns false, and changes nothing, unless the last decision was a probe of a
    // drafter judged off (a first look drafts for real: it is also how a fresh drafter's first
    // rounds gain). The outcome comes back through observe_shadow_probe once it is known.
    bool shadow_probe();
    // A probe in shadow compared: the first `n_accepted` of its `n_drafted` tokens were emitted.
    // Teaches the profile as observe does; a rejection backs the probe interval off, as a
    // verified probe's does.
    void observe_shadow_probe(int n_drafted, int n_accepted);

    // Work of this round beyond its draft and verification, in 1-token target passes: catching
    // the draft up on the tokens emitted while it was off (charged to the probe budget when this
    // round is a probe or a switch-on; it predicts the next one's catch-up).
    void add_catch_up(double units);
    // The books to carry to the next request of this drafter and regime (with the back-off).
    ProbeLedger                  probe_ledger() const;

    double                       alpha() const { return alpha_; }
    // Plain totals since construction (no prior, no forgetting): accepted positions and
    // positions at risk; what a request teaches the next one's prior.
    int64_t                      n_at_risk() const { return n_at_risk_; }
    int64_t                      n_accepted() const { return n_accepted_; }
    // a[j] for j = 1..n_max + 1 (a[0] unused): each depth's average, shrunk towards the depth
    // above it (towards α for depth 1) while it has fewer than kDepthFull observations, so rarely
    // reached depths borrow from shallower ones instead of sitting at the prior. For cls > 0 the
    // class's Beta-smoothed rates (DraftClassEvidence).
    std::vector<double>          depth_acceptance(int cls = 0) const;
    // The profile the next request of this drafter starts from (DraftLengthOptions::depth_prior):
    // depth_acceptance() with its dips faded to the longer run, as off_relax fades them while off
    // (a request that ended on a dip would otherwise hand it on, and the next requests, starting
    // off, would draft too little to lift it), at the depths it drafted kDepthFull positions.
    // depth_acceptance() itself when off_relax is 0.
    std::vector<double>          next_depth_prior() const;
    // What the next request's longer run starts from (DraftLengthOptions::long_prior): the
    // prior's counts, discounted by kLongKeep, plus this request's own positions at each depth.
    DraftClassEvidence           next_long_prior() const;
    static constexpr double      kLongKeep = 0.6;  // ~2.5 requests
    static constexpr double      kClassPseudo = 1.0;
    // [cls]: each draft class's evidence, the prior's included (what the next request starts from).
    const std::vector<DraftClassEvidence> & class_evidence() const { return classes_; }
    static constexpr int         kDepthFull = 16;
    static constexpr double      kPriorFade = 0.9;
    const GammaDecision &        last_decision() const { return last_; }
    const std::vector<int64_t> & gamma_hist() const { return gamma_hist_; }  // [γ] = rounds
    int64_t                      n_off_rounds() const { return n_off_rounds_; }
    const CostModel &            cost_model() const { return cm_; }
    const DraftLengthOptions &   options() const { return opts_; }

    // The next `rounds` decisions are plain steps (γ = 0), whatever the policy would choose, and
    // teach it nothing: the engine's first round while it has no cost model yet, so the first
    // token comes as fast as without speculation.
    void hold(int rounds) { hold_ = rounds > 0 ? rounds : 0; }

    // Replaces the cost model (e.g. once v(n) and c are measured); keeps α and the history.
    void set_cost_model(CostModel cm) { cm_ = std::move(cm); }

  private:
    GammaDecision decide(int remaining, int cls);
    double        confidence_stop(const std::vector<double> & a, const GammaDecision & d) const;
    double        with_empty_rounds(const GammaChoice & best) const;
    // Whether work of `est` units more, spent on probing (a probe, or a switch-on's catch-up),
    // keeps the spending within probe_budget of all the work.
    bool          within_budget(double est) const;
    // observe's learning (α, the depths, the class), k of n_drafted accepted
    void          learn(int n_drafted, int k, int cls);
    void          learn_class(int c, int n, int k);  // class c's counts: k accepted of n at risk
    void          back_off();  // doubles the probe interval, up to its cap
    double        long_run(size_t j) const;  // what off_relax fades depth j's average to


    CostModel            cm_;
    DraftLengthOptions   opts_;
    double               alpha_;
    int                  off_streak_   = 0;  // consecutive off rounds since the last probe
    int                  interval_     = 0;  // current probe interval (backs off while probes fail)
    bool                 probing_      = false; // the last decision was a probe
    bool                 probe_rejected_ = false; // the last probe saw a rejection
    bool                 shadow_whole_   = false; // the last probe in shadow was accepted whole
    int                  since_explore_ = 0; // rounds on since the last exploration
    int                  n_decided_     = 0;     // decisions made while looking (first_look)
    bool                 looking_       = false; // the last decision was a first-look round
    int                  explore_left_  = 0; // exploration rounds still to run (of a pair)
    int                  hold_          = 0; // plain rounds still to run (hold)
    std::vector<double>  depth_ema_;         // [j] moving average of acceptance at depth j
    std::vector<double>  slow_s_, slow_n_;   // [j] acceptances and positions at depth j, the
                                             // prior's (prior_run) and this request's, discounted
                                             // by 1 − slow_weight (off_relax)
    std::vector<int64_t> depth_n_;           // [j] observations at depth j (this request's)
    std::vector<double>  own_s_;             // [j] this request's acceptances at depth j, of
                                             // depth_n_[j] (next_long_prior)
    std::vector<double>  depth_prior_w_;     // [j] weight of depth_prior at depth j, in
                                             // observations: kDepthFull, fading by kPriorFade
                                             // each drafting round that does not reach j
    int64_t              n_at_risk_ = 0, n_accepted_ = 0;
    GammaDecision        last_;
    std::vector<int64_t> gamma_hist_;        // size n_max + 1
    std::vector<DraftClassEvidence> classes_; // [cls], 0 unused (the pooled profile above)
    ProbeLedger          ledger_;
    int64_t              n_off_rounds_ = 0;
    ConfidenceEvidence   conf_;
    double               stop_below_ = 0;
};

}  // namespace specrpc
