// The on-disk cache of learned priors (see prior_cache.h). Format, one item a line:
//   specrpc-priors 1
//   key <the key, newlines replaced by spaces>
//   prior <regime> <n types> <type>...           one block per chain and regime:
//   alpha <a | none>
//   depth <count> <a[0]> ... <a[count-1]>
//   ledger <work> <spent> <catch_up> <interval> <since_probe>
//   classes <count>
//   class <len> <s[0]> ... <s[len-1]> <n[0]> ... <n[len-1]>   (count of them)
//   end
#include "engine/prior_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/cost_cache.h"

namespace specrpc {

static constexpr const char * kMagic = "specrpc-priors 1";
static constexpr size_t kMaxDepth   = 257;  // a profile is n_max + 2 long, n_max ≤ 64
static constexpr size_t kMaxChain   = 8;
static constexpr size_t kMaxBlocks  = 256;

std::string prior_cache_dir() {
    if (const char * p = std::getenv("SPECRPC_PRIORS")) {
        const std::string s = p;
        if (s == "off" || s == "0") return "";
    }
    return cost_cache_dir();
}

std::string prior_cache_path(const std::string & dir, const std::string & key) {
    return cache_file_path(dir, "priors", key);
}

static bool rate(double x) { return std::isfinite(x) && x >= 0.0 && x <= 1.0; }
static bool count(double x) { return std::isfinite(x) && x >= 0.0 && x <= 1e12; }

// One block's lines after "prior": false on anything malformed or implausible.
static bool read_block(std::istream & f, LearnedPrior & L) {
    std::string line, word;
    auto next = [&](const char * want, std::istringstream & in) {
        if (!std::getline(f, line)) return false;
        in = std::istringstream(line);
        return in >> word && word == want;
    };
    auto done = [&](std::istringstream & in) { return !(in >> word); };  // no trailing garbage
    std::istringstream in;
    if (!next("alpha", in) || !(in >> word)) return false;
    if (word != "none") {
        char * end = nullptr;
        const double a = std::strtod(word.c_str(), &end);
        if (*end || !rate(a)) return false;
        L.alpha = a;
    }
    if (!done(in)) return false;
    size_t n = 0;
    if (!next("depth", in) || !(in >> n) || n > kMaxDepth) return false;
    L.depth.resize(n);
    for (double & x : L.depth)
        if (!(in >> x) || !rate(x)) return false;
    if (!done(in)) return false;
    ProbeLedger & g = L.ledger;
    if (!next("ledger", in) || !(in >> g.work >> g.spent >> g.catch_up >> g.interval >> g.since_probe) || !done(in))
        return false;
    if (!count(g.work) || !std::isfinite(g.spent) || std::fabs(g.spent) > 1e12 || !count(g.catch_up) ||
        g.interval < 0 || g.since_probe < 0)
        return false;
    size_t nc = 0;
    if (!next("classes", in) || !(in >> nc) || nc > size_t(kDraftClasses) || !done(in)) return false;
    L.classes.resize(nc);
    for (DraftClassEvidence & ev : L.classes) {
        size_t len = 0;
        if (!next("class", in) || !(in >> len) || len > kMaxDepth) return false;
        ev.s.resize(len);
        ev.n.resize(len);
        for (double & x : ev.s)
            if (!(in >> x) || !count(x)) return false;
        for (size_t j = 0; j < len; ++j)
            if (!(in >> ev.n[j]) || !count(ev.n[j]) || ev.s[j] > ev.n[j] * (1 + 1e-9) + 1e-9) return false;
        if (!done(in)) return false;
    }
    return true;
}

std::optional<PriorBook> prior_cache_load(const std::string & dir, const std::string & key) {
    if (dir.empty()) return std::nullopt;
    std::ifstream f(prior_cache_path(dir, key));
    if (!f) return std::nullopt;
    std::string line;
    if (!std::getline(f, line) || line != kMagic) return std::nullopt;
    if (!std::getline(f, line) || line != "key " + cache_key_line(key)) return std::nullopt;  // another key
    PriorBook book;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string word;
        if (!(in >> word)) return std::nullopt;
        if (word == "end") {  // the last line: nothing after it, not even on its own line
            if (in >> word) return std::nullopt;
            while (std::getline(f, line))
                if (line.find_first_not_of(" \t\r") != std::string::npos) return std::nullopt;
            return book;
        }
        if (word != "prior" || book.size() >= kMaxBlocks) return std::nullopt;
        int    regime = -1;
        size_t nt     = 0;
        if (!(in >> regime >> nt) || regime < 0 || regime > 3 || nt == 0 || nt > kMaxChain) return std::nullopt;
        std::vector<SpecType> chain(nt);
        for (SpecType & t : chain) {
            int v = -1;
            if (!(in >> v) || v <= int(SpecType::NONE) || v > int(SpecType::SUFFIX)) return std::nullopt;
            t = SpecType(v);
        }
        if (in >> word) return std::nullopt;
        LearnedPrior L;
        if (!read_block(f, L)) return std::nullopt;
        book[{chain, regime}] = std::move(L);
    }
    return std::nullopt;  // truncated: no "end"
}

Status prior_cache_save(const std::string & dir, const std::string & key, const PriorBook & book) {
    if (dir.empty()) return Status::ok();
    std::ostringstream f;
    char buf[40];
    auto num = [&](double x) {
        std::snprintf(buf, sizeof buf, " %.17g", x);
        f << buf;
    };
    f << kMagic << "\nkey " << cache_key_line(key) << "\n";
    for (const auto & [k, L] : book) {
        f << "prior " << k.second << " " << k.first.size();
        for (SpecType t : k.first) f << " " << int(t);
        f << "\nalpha";
        if (L.alpha) num(*L.alpha);
        else f << " none";
        f << "\ndepth " << L.depth.size();
        for (double x : L.depth) num(x);
        f << "\nledger";
        num(L.ledger.work);
        num(L.ledger.spent);
        num(L.ledger.catch_up);
        f << " " << L.ledger.interval << " " << L.ledger.since_probe << "\nclasses " << L.classes.size() << "\n";
        for (const DraftClassEvidence & ev : L.classes) {
            const size_t len = std::min(ev.s.size(), ev.n.size());
            f << "class " << len;
            for (size_t j = 0; j < len; ++j) num(ev.s[j]);
            for (size_t j = 0; j < len; ++j) num(ev.n[j]);
            f << "\n";
        }
    }
    f << "end\n";
    return cache_write_file(dir, prior_cache_path(dir, key), f.str());
}

}  // namespace specrpc
