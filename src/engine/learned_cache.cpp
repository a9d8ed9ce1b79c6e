// The on-disk copy of the learned priors (see learned_cache.h). Format, one item a line; a block
// per chain of drafters and regime, each item of a block optional:
//   specrpc-learned 1
//   key <the key, newlines replaced by spaces>
//   prior <regime> <number of drafters> <drafter type>...
//   alpha <rate>
//   depth <count> <a[0]> ... <a[count-1]>
//   long <count> <s[0]> ... <s[count-1]> <n[0]> ... <n[count-1]>
//   ledger <work> <spent> <catch_up> <interval> <since_probe>
//   class <index> <count> <s[0]> ... <s[count-1]> <n[0]> ... <n[count-1]>
//   confidence <count> <s...> <n...> <empty_share> <empty_excess>
//   end
#include "engine/learned_cache.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/cost_cache.h"

namespace specrpc {

static constexpr const char * kMagic = "specrpc-learned 1";
static constexpr size_t       kMaxLen = 4096;  // longer vectors are not ours: a corrupt file
static constexpr int          kMaxInterval = 1 << 16;  // a probe interval beyond any back-off cap
// A probe ledger's credit per unit of work: spent ≥ −kMaxCredit × work (see "ledger" below).
static constexpr double       kMaxCredit = SpecParams::kMaxDraft;

std::string learned_cache_path(const std::string & dir, const std::string & key) {
    return cache_file_path(dir, "learned", key);
}

static void put(std::ostringstream & f, double x) {
    char buf[40];
    std::snprintf(buf, sizeof buf, " %.17g", x);
    f << buf;
}

static void put(std::ostringstream & f, const std::vector<double> & v) {
    f << ' ' << v.size();
    for (double x : v) put(f, x);
}

// Evidence by position (successes s[i] of trials n[i]): " <count> <s...> <n...>".
static void put_evidence(std::ostringstream & f, const std::vector<double> & s, const std::vector<double> & n) {
    f << ' ' << s.size();
    for (double x : s) put(f, x);
    for (double x : n) put(f, x);
}

Status learned_cache_save(const std::string & dir, const std::string & key, const LearnedPriors & priors) {
    if (dir.empty()) return Status::ok();
    std::ostringstream f;
    f << kMagic << "\nkey " << cache_key_line(key) << "\n";
    for (const auto & [k, p] : priors) {
        f << "prior " << k.second << ' ' << k.first.size();
        for (SpecType t : k.first) f << ' ' << static_cast<int>(t);
        f << '\n';
        if (p.alpha) { f << "alpha"; put(f, *p.alpha); f << '\n'; }
        if (!p.depth.empty()) { f << "depth"; put(f, p.depth); f << '\n'; }
        if (!p.long_run.n.empty() && p.long_run.s.size() == p.long_run.n.size()) {
            f << "long";
            put_evidence(f, p.long_run.s, p.long_run.n);
            f << '\n';
        }
        f << "ledger";
        for (double x : {p.ledger.work, p.ledger.spent, p.ledger.catch_up}) put(f, x);
        f << ' ' << p.ledger.interval << ' ' << p.ledger.since_probe << '\n';
        for (size_t c = 0; c < p.classes.size(); ++c) {
            const DraftClassEvidence & ev = p.classes[c];
            bool seen = false;  // a class never drafted is no evidence: not written
            for (double x : ev.n) seen = seen || x > 0;
            if (!seen || ev.s.size() != ev.n.size()) continue;
            f << "class " << c;
            put_evidence(f, ev.s, ev.n);
            f << '\n';
        }
        const ConfidenceEvidence & ce = p.confidence;
        if (!ce.s.empty() && ce.s.size() == ce.n.size()) {
            f << "confidence";
            put_evidence(f, ce.s, ce.n);
            put(f, ce.empty_share);
            put(f, ce.empty_excess);
            f << '\n';
        }
    }
    f << "end\n";
    return cache_file_write(dir, learned_cache_path(dir, key), f.str());
}

// Reads `count` numbers into v; false on a short line or one that is not a number.
static bool get(std::istringstream & in, std::vector<double> & v, size_t count) {
    if (count > kMaxLen) return false;
    v.resize(count);
    for (double & x : v)
        if (!(in >> x) || !std::isfinite(x)) return false;
    return true;
}

static bool rate(double x) { return x >= 0.0 && x <= 1.0; }
static bool rates(const std::vector<double> & v) {
    for (double x : v)
        if (!rate(x)) return false;
    return true;
}
// Reads what put_evidence wrote; false unless every success count is within [0, its trials].
static bool get_evidence(std::istringstream & in, std::vector<double> & s, std::vector<double> & n) {
    size_t count = 0;
    if (!(in >> count) || !get(in, s, count) || !get(in, n, count)) return false;
    for (size_t i = 0; i < count; ++i)
        if (!(n[i] >= 0.0 && s[i] >= 0.0 && s[i] <= n[i] + 1e-9)) return false;
    return true;
}

std::optional<LearnedPriors> learned_cache_load(const std::string & dir, const std::string & key) {
    std::optional<std::ifstream> file = cache_file_open(dir, learned_cache_path(dir, key), kMagic, key);
    if (!file) return std::nullopt;
    std::ifstream & f = *file;
    std::string line;
    LearnedPriors out;
    LearnedPrior * cur = nullptr;
    bool           end = false;
    std::string    word;
    while (!end && std::getline(f, line)) {
        std::istringstream in(line);
        if (!(in >> word)) return std::nullopt;
        size_t n = 0;
        if (word == "end") {
            end = true;
        } else if (word == "prior") {
            LearnedKey k;
            if (!(in >> k.second >> n) || k.second < 0 || n > 64) return std::nullopt;
            for (size_t i = 0; i < n; ++i) {
                int t = 0;
                if (!(in >> t) || t < 0 || t > static_cast<int>(SpecType::SUFFIX)) return std::nullopt;
                k.first.push_back(static_cast<SpecType>(t));
            }
            cur = &out[k];
        } else if (!cur) {
            return std::nullopt;  // an item outside a block
        } else if (word == "alpha") {
            double a = 0;
            if (!(in >> a) || !rate(a)) return std::nullopt;
            cur->alpha = a;
        } else if (word == "depth") {
            if (!(in >> n) || !get(in, cur->depth, n) || !rates(cur->depth)) return std::nullopt;
        } else if (word == "long") {
            if (!get_evidence(in, cur->long_run.s, cur->long_run.n)) return std::nullopt;
        } else if (word == "ledger") {
            ProbeLedger & l = cur->ledger;
            if (!(in >> l.work >> l.spent >> l.catch_up >> l.interval >> l.since_probe)) return std::nullopt;
            // spent is a net cost, below 0 when probes paid (a probe round that emits more tokens
            // than its work): the engine writes such ledgers, so they must load; a refused file
            // lost every block in it, the other regimes' priors too. A round's credit is at most
            // its k + 1 ≤ kMaxDraft + 1 tokens (spec.n_max, check_request) less its work (≥ 1 unit),
            // so the credit stays within kMaxCredit units per unit of work; more is not a ledger
            // the engine wrote.
            if (!(std::isfinite(l.work) && l.work >= 0 && std::isfinite(l.spent) && l.spent >= -kMaxCredit * l.work &&
                  std::isfinite(l.catch_up) && l.catch_up >= 0 && l.interval >= 0 && l.interval <= kMaxInterval &&
                  l.since_probe >= 0))
                return std::nullopt;
        } else if (word == "class") {
            size_t c = 0;
            if (!(in >> c) || c == 0 || c >= size_t(kDraftClasses)) return std::nullopt;
            if (cur->classes.size() <= c) cur->classes.resize(c + 1);
            DraftClassEvidence & ev = cur->classes[c];
            if (!get_evidence(in, ev.s, ev.n)) return std::nullopt;
        } else if (word == "confidence") {
            ConfidenceEvidence & ce = cur->confidence;
            if (!get_evidence(in, ce.s, ce.n) || ce.s.size() != size_t(kConfBins) ||
                !(in >> ce.empty_share >> ce.empty_excess) || !rate(ce.empty_share) || !std::isfinite(ce.empty_excess))
                return std::nullopt;
        } else {
            return std::nullopt;
        }
        if (in >> word) return std::nullopt;  // trailing garbage
    }
    if (!end) return std::nullopt;  // a truncated write has no "end"
    return out;
}

}  // namespace specrpc
