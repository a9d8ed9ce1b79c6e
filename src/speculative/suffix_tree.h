// Suffix drafting (SuffixDecoding, arXiv 2411.04975): token streams indexed in a depth-bounded
// suffix trie with per-node occurrence counts, and a drafter that matches the longest suffix of the
// context and proposes a TREE of the continuations seen after it, most frequent first, as large as
// the cost model says is worth verifying. Two tries feed it: one per request over its prompt and
// output, and one store of recent responses shared by all slots under a byte budget (oldest
// responses evicted first). Drafts are deterministic (q one-hot), so the tree verifiers keep them
// lossless at any temperature.
//
// Thread-safety: none; each trie and store is owned by one thread (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "speculative/draft_length.h"
#include "speculative/verify.h"

namespace specrpc {

// Every substring of up to max_depth tokens of the streams appended, as a path from the root, with
// the number of its occurrences. A node for string s counts the positions where s starts (inside
// one stream), so the children of the node for a context suffix are the tokens that followed it,
// with their frequencies. Memory: at most max_depth nodes of kNodeBytes per token appended, far
// fewer for repetitive text (shared paths).
class SuffixTrie {
  public:
    // A draft continues below the node of its match, so it can be at most max_depth − match
    // deep: 48 lets a 16-token match (SuffixDraftParams::max_match) draft the full 32 tokens of
    // n_max (at 32, copies were drafted 16 at a time).
    static constexpr int kDefaultDepth = 48;

    explicit SuffixTrie(int max_depth = kDefaultDepth);  // clamped to [2, 256]

    int max_depth() const { return max_depth_; }

    // Appends tokens to the current stream: each extends every suffix of the stream that is still
    // shorter than max_depth. O(n * max_depth).
    void append(const token_id * tokens, size_t n);
    void append(const std::vector<token_id> & tokens) { append(tokens.data(), tokens.size()); }
    // Ends the current stream: no counted substring spans the tokens before and after.
    void end_stream() { open_.clear(); }
    // Removes a stream appended earlier (as one stream, between end_stream calls): its substrings'
    // counts go down, nodes left at zero are freed. The stream must have been appended (else other
    // streams' counts go down). O(n * max_depth).
    void remove(const std::vector<token_id> & tokens);
    // Drops everything (keeps max_depth).
    void clear();

    // The node of the longest suffix of tokens[0, n) of at most max_match tokens (and < max_depth)
    // that occurred followed by some token, and its length; {0, 0} if none (the root).
    struct Match {
        uint32_t node   = 0;
        int      length = 0;
    };
    Match match(const token_id * tokens, size_t n, int max_match) const;

    // Children of `node` (token, occurrences), in no particular order.
    struct Child {
        token_id token;
        uint32_t count;
        uint32_t node;
    };
    void children(uint32_t node, std::vector<Child> & out) const;
    uint32_t count(uint32_t node) const { return nodes_[node].count; }

    // Live nodes (root included); their bytes with the root index (what a budget bounds); and the
    // heap the arrays hold, free slots included (at most about twice the largest bytes() reached:
    // vector growth; freed slots are reused, not returned).
    size_t n_nodes() const { return nodes_.size() - free_.size(); }
    size_t bytes() const;
    size_t allocated_bytes() const;
    static constexpr size_t kNodeBytes = 16;

  private:
    struct Node {
        token_id token        = -1;
        uint32_t count        = 0;
        uint32_t first_child  = 0;  // 0 = none (the root is nobody's child)
        uint32_t next_sibling = 0;
    };
    static_assert(sizeof(Node) == kNodeBytes);

    uint32_t find_child(uint32_t node, token_id t) const;
    uint32_t get_or_add_child(uint32_t node, token_id t);
    void     unlink_child(uint32_t parent, uint32_t child);

    int                   max_depth_;
    std::vector<Node>     nodes_;       // [0] = root
    std::vector<uint32_t> free_;        // freed node slots, reused first
    std::vector<uint32_t> root_index_;  // token -> child of the root (0 = none): the root has up to n_vocab children
    struct Open {
        uint32_t node;
        int      depth;
    };
    std::vector<Open> open_;  // where the current stream's suffixes shorter than max_depth end
};

// Recent responses of all requests in one trie, under a byte budget: adding a response that takes
// the store over it evicts the oldest responses (whole; "least recently added") until it fits
// again. A response is cut to the tail a quarter of the budget holds in the worst case (every
// token max_depth new nodes), so after add() returns bytes() <= max_bytes, and the arrays
// (allocated_bytes: vector growth, the free list) stay below about 3x the budget.
class SuffixStore {
  public:
    explicit SuffixStore(size_t max_bytes = 0, int max_depth = SuffixTrie::kDefaultDepth);

    // 0 = keep nothing (add is a no-op). Shrinking evicts at once.
    void   set_max_bytes(size_t max_bytes);
    size_t max_bytes() const { return max_bytes_; }

    void add(std::vector<token_id> tokens);
    void clear();

    const SuffixTrie & trie() const { return trie_; }
    size_t             n_docs() const { return docs_.size(); }
    size_t             n_evicted() const { return n_evicted_; }
    // The trie's bytes plus the stored responses (kept to remove them on eviction).
    size_t             bytes() const { return trie_.bytes() + doc_tokens_ * sizeof(token_id); }
    size_t             allocated_bytes() const { return trie_.allocated_bytes() + doc_tokens_ * sizeof(token_id); }

  private:
    void evict_to(size_t target);

    SuffixTrie                        trie_;
    std::deque<std::vector<token_id>> docs_;  // oldest first
    size_t                            doc_tokens_ = 0;
    size_t                            max_bytes_  = 0;
    size_t                            n_evicted_  = 0;
};

// A request's own trie, kept in step with its prompt + output: sync() appends what is new since
// the last call, and starts over when the request changes. Bounded by the request's length (the
// slot's context): at most max_depth nodes a token, 768 KiB per 1k tokens of novel text.
class SuffixContext {
  public:
    explicit SuffixContext(int max_depth = SuffixTrie::kDefaultDepth) : trie_(max_depth) {}
    // `tokens` = prompt + output so far of request `request`; within a request it only grows.
    void sync(int64_t request, const std::vector<token_id> & tokens);
    const SuffixTrie & trie() const { return trie_; }

  private:
    SuffixTrie trie_;
    int64_t    request_ = -1;
    size_t     n_       = 0;  // tokens of the request appended
};

struct SuffixDraftParams {
    int    max_match    = 16;    // longest context suffix matched, tokens (< the trie's depth)
    int    min_match    = 1;     // shortest match drafted from, tokens
    double spec_factor  = 2.0;   // the tree is at most spec_factor * match length + spec_offset
    int    spec_offset  = 1;     //   deep: short matches are weak evidence (SuffixDecoding's rule)
    double min_prob     = 0.05;  // nodes with a lower estimated path probability are not drafted
    // Size of the tree: nodes are taken best-first by estimated path probability P(node) =
    // Π a(j) * count(child) / count(all children) along the path, a(j) the acceptance at the
    // child's depth j, and the tree is the prefix of that order maximising (1 + Σ P) / (v(n + 1) + o),
    // the speed-up the cost model predicts for a tree of n nodes (each node's acceptance adds P to
    // the tokens a round emits).
    double alpha        = 0.85;  // a(j) at every depth: acceptance of a continuation seen every time
    std::vector<double> depth_alpha;  // a(j) per depth instead (index 0 unused; past its end, its
                                 // last entry; fewer than 2 entries = alpha): the acceptance
                                 // profile of the proposal's draft class, when its match gave one
    int    max_depth    = 16;    // deepest node (the policy's γ)
    int    max_nodes    = 16;    // drafted nodes (the pass's budget)
    int    max_branches = 1;     // leaves (KV sequences per slot); 1 = a chain
};

// What a proposal is worth, for choosing between sources: the predicted speed-up of the tree
// (1 for an empty one) and the match it grew from.
struct SuffixProposal {
    DraftTree tree;
    double    score        = 1.0;
    int       match_length = 0;
};

// The tree of continuations of `context` (whose last token is the tree's root) found in `trie`,
// under `params` and the cost model `cm` (v and o; c is ignored: looking up costs nothing).
// Deterministic: same trie, context and params, same tree; siblings in descending count, ties to
// the smaller token id.
SuffixProposal suffix_propose(const SuffixTrie & trie, const std::vector<token_id> & context,
                              const SuffixDraftParams & params, const CostModel & cm);

// The best of the request's own trie and the shared store (either may be null): the one with a
// draft, else the longer match, else the higher score, ties to the request's. Empty tree (root
// only) when neither proposes.
SuffixProposal suffix_draft(const SuffixTrie * request, const SuffixTrie * store, const std::vector<token_id> & context,
                            const SuffixDraftParams & params, const CostModel & cm);

// The most probable root-to-leaf path of a tree (first child at every level): the chain a
// shadow draft compares with plain decoding.
std::vector<token_id> suffix_main_path(const DraftTree & tree);

}  // namespace specrpc
