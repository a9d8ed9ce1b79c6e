// What requests taught the draft-length policy (acceptance, its profile by depth, each draft
// class's evidence, the probe budget's books), per chain of drafters and regime, and its on-disk
// cache: a fresh process then starts its first request where the last process of the same models
// left off, as a warm server's next request does, instead of from the optimistic prior and a few
// rounds of looking (a `specrpc generate` per prompt decoded 1.8x plain where a warm engine ran
// 2.0-2.3x; docs/benchmarks.md). One small text file per key beside the cost cache
// (cost_cache.h); a missing, corrupt or differently keyed file is ignored.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "speculative/draft_length.h"
#include "specrpc/engine.hpp"

namespace specrpc {

struct LearnedPrior {
    std::optional<double> alpha;   // per-position acceptance: the next prior
    std::vector<double>   depth;   // acceptance by depth of the last request that drafted
                                   // enough to measure it (empty: none yet)
    ProbeLedger           ledger;  // the probe budget's books
    std::vector<DraftClassEvidence> classes;  // each draft class's evidence, as the last
                                   // request left it (its own discounting bounds its weight)
};
// The chain of drafters and the regime its drafts are verified in (scheduler.cpp, prior_key).
using PriorKey  = std::pair<std::vector<SpecType>, int>;
using PriorBook = std::map<PriorKey, LearnedPrior>;

// The directory the priors are kept in: the cost cache's (cost_cache_dir), unless
// $SPECRPC_PRIORS is "off" or "0" (tests set it: a test's first request must not depend on the
// tests that ran before it); "" = not kept.
std::string prior_cache_dir();

// The file a key is kept in, in dir (a hash of the key names it; the key itself is its second line).
std::string prior_cache_path(const std::string & dir, const std::string & key);
// The book kept for `key` in dir; nullopt when there is none, the file is corrupt or implausible
// (a rate outside [0, 1], more successes than trials, an unknown drafter), or it was written for
// another key.
std::optional<PriorBook> prior_cache_load(const std::string & dir, const std::string & key);
// Writes the book (creating dir; atomically: a temporary file renamed over the old one).
Status prior_cache_save(const std::string & dir, const std::string & key, const PriorBook & book);

}  // namespace specrpc
