// N-gram statistics for model-free drafting: for every n-gram of 1..4 tokens seen in a token
// stream, how often each token followed it. Three caches feed the n-gram drafter
// (speculative/prompt_lookup.h): a per-request context cache updated with every accepted token, a
// dynamic cache accumulated across requests, and a static cache built offline from a corpus.
//
// Persistence: a versioned, checksummed little-endian binary file of our own (layout in
// ngram_cache.cpp), written atomically and validated on load.
//
// Thread-safety: none; a cache is owned by one thread at a time (const methods may run
// concurrently with each other).
#pragma once

#include "common/status.h"
#include "speculative/dist.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace specrpc {

constexpr int NGRAM_MAX_LEN = 4;  // longest n-gram a cache can hold, in tokens

// A key of 1..NGRAM_MAX_LEN tokens; unused slots are 0 so that equal n-grams compare equal.
struct Ngram {
    std::array<token_id, NGRAM_MAX_LEN> tokens{};  // tokens[0..n) oldest first
    uint8_t                             n = 0;     // length in tokens

    // The n-gram first[0..n); requires 1 <= n <= NGRAM_MAX_LEN.
    static Ngram of(const token_id * first, int n);

    bool operator==(const Ngram &) const = default;
};

// Hash of an Ngram: 64-bit mixing of the packed tokens and the length.
struct NgramHash {
    size_t operator()(const Ngram & g) const noexcept;
};

// One continuation of an n-gram and how many times it was seen.
struct TokenCount {
    token_id token = 0;  // the following token
    uint32_t count = 0;  // occurrences, >= 1 (saturates at UINT32_MAX)

    bool operator==(const TokenCount &) const = default;
};

// The continuations of one n-gram, sorted by token id ascending, no duplicates.
using TokenCounts = std::vector<TokenCount>;

// Map n-gram -> counts of the tokens that followed it, for n in [ngram_min, ngram_max].
class NgramCache {
  public:
    // An empty cache for n-grams of ngram_min..ngram_max tokens (clamped into
    // [1, NGRAM_MAX_LEN], max raised to min if below it).
    explicit NgramCache(int ngram_min = 1, int ngram_max = NGRAM_MAX_LEN);

    int ngram_min() const { return ngram_min_; }  // shortest n-gram counted, tokens
    int ngram_max() const { return ngram_max_; }  // longest n-gram counted, tokens

    // Counts the n-grams whose following token is one of the last n_new entries of `tokens`
    // (n_new is clamped to tokens.size()). Calling it with the whole stream once, or after each
    // append with only the appended count, gives the same cache. O(n_new * (max - min + 1)).
    void update(const std::vector<token_id> & tokens, size_t n_new);

    // Adds every count of `other` to this cache (saturating) and widens [ngram_min, ngram_max]
    // to cover other's range.
    void merge(const NgramCache & other);

    // The continuations of `key`, or nullptr if it was never seen. Invalidated by any mutation.
    const TokenCounts * find(const Ngram & key) const;

    // Occurrences of `next` after `key` (0 if never seen).
    uint32_t count(const Ngram & key, token_id next) const;

    size_t size() const { return map_.size(); }    // distinct n-grams
    bool   empty() const { return map_.empty(); }  // no n-gram at all
    size_t n_pairs() const { return n_pairs_; }    // distinct (n-gram, next token) pairs
    void   clear() { map_.clear(); n_pairs_ = 0; } // drops all counts, keeps the n-gram range

    // Approximate heap bytes the cache holds: kEntryBytes per n-gram (hash node, bucket, the
    // continuation vector's header and allocation) plus kPairBytes per continuation.
    static constexpr size_t kEntryBytes = 96;
    static constexpr size_t kPairBytes  = sizeof(TokenCount);
    size_t bytes() const { return map_.size() * kEntryBytes + n_pairs_ * kPairBytes; }

    // Caps bytes() (0 = no cap, the default). Once an addition takes the cache over the cap, every
    // count is halved (rounding down; zero counts and n-grams left without continuations go)
    // until the cache is at 3/4 of the cap: rare n-grams are forgotten first, frequent ones keep
    // their order, and old counts fade against new ones. Each eviction is O(size) and frees a
    // quarter of the cap, so the amortised cost per added pair stays O(1).
    void   set_max_bytes(size_t max_bytes);
    size_t max_bytes() const { return max_bytes_; }

    // Same n-gram range and identical counts.
    bool operator==(const NgramCache & other) const;

    // Writes the cache to `path` atomically (temp file `path`.tmp.<pid> in the same folder, fsync,
    // rename). Entries are written in sorted order, so equal caches give byte-identical files.
    // Temp files of `path` left by processes that no longer run (a save interrupted by a kill)
    // are removed first; load() removes them too.
    Status save(const std::string & path) const;

    // Reads a file written by save(). Missing file -> NOT_FOUND; truncated, corrupt (bad magic,
    // checksum, field out of range, unsorted or duplicate entries) or other-version files ->
    // LOAD_FAILED. Never allocates more than the file size justifies.
    static Result<NgramCache> load(const std::string & path);

  private:
    // Adds `count` occurrences of `next` after `key`, then evicts if over the cap.
    void add(const Ngram & key, token_id next, uint32_t count);
    // Halves every count until bytes() <= target (see set_max_bytes).
    void evict(size_t target);

    int ngram_min_;
    int ngram_max_;
    size_t n_pairs_   = 0;
    size_t max_bytes_ = 0;
    std::unordered_map<Ngram, TokenCounts, NgramHash> map_;
};

}  // namespace specrpc
