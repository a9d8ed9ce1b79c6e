// What requests taught the draft-length policy (acceptance by depth, the probe budget's books, the
// draft classes' and the confidence stop's evidence), per chain of drafters and acceptance regime,
// and its on-disk copy: a process starts where the last one with the same models left off, as a
// request of a warm engine starts where the one before it left off.
//
// Why on disk: a process that serves one request (`specrpc generate`, a script calling it, an FFI
// user who loads the library per task) otherwise judges every drafter from the optimistic prior
// with a few verified "first look" rounds. For a draft model whose text is not copyable that look
// cost ~100 ms a process (copy-F32 beside the copy target at T = 0.8: 0.92x plain as a whole
// process, 0.98x in a warm engine; docs/benchmarks.md, "A fresh process remembers what it learned").
// Acceptance depends on the models and the text, not on the machine, so the key is the two model
// files alone. One small text file per key beside the cost cache (cost_cache_dir()); a missing,
// corrupt or differently keyed file is ignored (the engine then starts from the prior, and looks).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "specrpc/engine.hpp"
#include "speculative/draft_length.h"

namespace specrpc {

struct LearnedPrior {
    std::optional<double> alpha;   // per-position acceptance: the next prior
    std::vector<double>   depth;   // acceptance by depth of the last request that drafted
                                   // enough to measure it (empty: none yet)
    DraftClassEvidence    long_run; // positions by depth pooled over the requests, each
                                   // request's discounted (DraftLengthOptions::long_prior)
    ProbeLedger           ledger;  // the probe budget's books
    std::vector<DraftClassEvidence> classes;  // each draft class's evidence, as the last
                                   // request left it (its own discounting bounds its weight)
    ConfidenceEvidence    confidence; // what the draft's confidence was worth (greedy drafts)
};
using LearnedKey    = std::pair<std::vector<SpecType>, int>;  // the chain, the regime
using LearnedPriors = std::map<LearnedKey, LearnedPrior>;

// The file `key` is kept in, in dir (a hash of the key names it; the key itself is its second line).
std::string learned_cache_path(const std::string & dir, const std::string & key);
// The priors kept for `key` in dir; nullopt when there are none, the file is corrupt or
// implausible (a rate outside [0, 1], a negative count), or it was written for another key.
std::optional<LearnedPriors> learned_cache_load(const std::string & dir, const std::string & key);
// Writes them (creating dir; atomically: a temporary file renamed over the old one). "" = no cache.
Status learned_cache_save(const std::string & dir, const std::string & key, const LearnedPriors & priors);

}  // namespace specrpc
