#include "speculative/suffix_tree.h"

#include <algorithm>
#include <queue>

namespace specrpc {

// ---------------------------------------------------------------------------------------------
// SuffixTrie

SuffixTrie::SuffixTrie(int max_depth) : max_depth_(std::clamp(max_depth, 2, 256)) { clear(); }

void SuffixTrie::clear() {
    nodes_.assign(1, Node{});
    nodes_.shrink_to_fit();
    free_.clear();
    free_.shrink_to_fit();
    root_index_.clear();
    root_index_.shrink_to_fit();
    open_.clear();
}

size_t SuffixTrie::bytes() const { return n_nodes() * sizeof(Node) + root_index_.size() * sizeof(uint32_t); }

size_t SuffixTrie::allocated_bytes() const {
    return nodes_.capacity() * sizeof(Node) + free_.capacity() * sizeof(uint32_t) +
           root_index_.capacity() * sizeof(uint32_t) + open_.capacity() * sizeof(Open);
}

uint32_t SuffixTrie::find_child(uint32_t node, token_id t) const {
    if (node == 0) return t >= 0 && size_t(t) < root_index_.size() ? root_index_[size_t(t)] : 0;
    for (uint32_t c = nodes_[node].first_child; c != 0; c = nodes_[c].next_sibling)
        if (nodes_[c].token == t) return c;
    return 0;
}

uint32_t SuffixTrie::get_or_add_child(uint32_t node, token_id t) {
    if (uint32_t c = find_child(node, t)) return c;
    uint32_t c;
    if (!free_.empty()) {
        c = free_.back();
        free_.pop_back();
    } else {
        c = uint32_t(nodes_.size());
        nodes_.emplace_back();
    }
    if (node == 0) {  // the root's children live in root_index_ only (no O(n_vocab) sibling list)
        nodes_[c] = Node{t, 0, 0, 0};
        if (size_t(t) >= root_index_.size()) root_index_.resize(size_t(t) + 1, 0);
        root_index_[size_t(t)] = c;
        return c;
    }
    nodes_[c]                = Node{t, 0, 0, nodes_[node].first_child};
    nodes_[node].first_child = c;
    return c;
}

void SuffixTrie::unlink_child(uint32_t parent, uint32_t child) {
    if (parent == 0) {
        root_index_[size_t(nodes_[child].token)] = 0;
    } else {
        uint32_t * link = &nodes_[parent].first_child;
        while (*link != 0 && *link != child) link = &nodes_[*link].next_sibling;
        if (*link == child) *link = nodes_[child].next_sibling;
    }
    nodes_[child] = Node{};
    free_.push_back(child);
}

void SuffixTrie::append(const token_id * tokens, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const token_id t = tokens[i];
        if (t < 0) {  // not a token: ends the stream rather than indexing garbage
            open_.clear();
            continue;
        }
        // every open suffix (oldest first) and the new one starting at this token grow by t; the
        // ones reaching max_depth close
        size_t keep = 0;
        for (size_t k = 0; k < open_.size(); ++k) {
            const uint32_t c = get_or_add_child(open_[k].node, t);
            ++nodes_[c].count;
            if (open_[k].depth + 1 < max_depth_) open_[keep++] = Open{c, open_[k].depth + 1};
        }
        open_.resize(keep);
        const uint32_t c = get_or_add_child(0, t);
        ++nodes_[c].count;
        open_.push_back(Open{c, 1});
    }
}

void SuffixTrie::remove(const std::vector<token_id> & tokens) {
    std::vector<uint32_t> path;
    // streams split at invalid tokens (append): remove each piece
    size_t begin = 0;
    while (begin < tokens.size()) {
        size_t end = begin;
        while (end < tokens.size() && tokens[end] >= 0) ++end;
        for (size_t i = begin; i < end; ++i) {
            path.clear();
            uint32_t u = 0;
            for (size_t j = i; j < end && j - i < size_t(max_depth_); ++j) {
                u = find_child(u, tokens[j]);
                if (u == 0) break;
                path.push_back(u);
            }
            // a node's count bounds its children's sum, so nodes reaching 0 form the path's tail:
            // free them deepest first
            for (size_t d = path.size(); d-- > 0;) {
                Node & nd = nodes_[path[d]];
                if (nd.count > 0) --nd.count;
            }
            for (size_t d = path.size(); d-- > 0;) {
                if (nodes_[path[d]].count != 0 || nodes_[path[d]].first_child != 0) break;
                unlink_child(d == 0 ? 0 : path[d - 1], path[d]);
            }
        }
        begin = end + 1;
    }
    open_.clear();
}

SuffixTrie::Match SuffixTrie::match(const token_id * tokens, size_t n, int max_match) const {
    const int m_max = std::min({max_match, max_depth_ - 1, int(std::min<size_t>(n, 1 << 20))});
    // The longest suffix first: one walk per length, O(max_match^2) child look-ups, cheap next
    // to a target pass; a shorter suffix is tried when the longer one never had a continuation.
    for (int m = m_max; m >= 1; --m) {
        uint32_t u = 0;
        for (size_t j = n - size_t(m); j < n && (u != 0 || j == n - size_t(m)); ++j) u = find_child(u, tokens[j]);
        if (u != 0 && nodes_[u].first_child != 0) return Match{u, m};
    }
    return Match{};
}

void SuffixTrie::children(uint32_t node, std::vector<Child> & out) const {
    out.clear();
    if (node == 0) {
        for (uint32_t c : root_index_)
            if (c != 0) out.push_back(Child{nodes_[c].token, nodes_[c].count, c});
        return;
    }
    for (uint32_t c = nodes_[node].first_child; c != 0; c = nodes_[c].next_sibling)
        out.push_back(Child{nodes_[c].token, nodes_[c].count, c});
}

// ---------------------------------------------------------------------------------------------
// SuffixStore

SuffixStore::SuffixStore(size_t max_bytes, int max_depth) : trie_(max_depth), max_bytes_(max_bytes) {}

void SuffixStore::set_max_bytes(size_t max_bytes) {
    max_bytes_ = max_bytes;
    if (max_bytes_ == 0) clear();
    else evict_to(max_bytes_);
}

void SuffixStore::clear() {
    trie_.clear();
    docs_.clear();
    doc_tokens_ = 0;
}

void SuffixStore::add(std::vector<token_id> tokens) {
    if (max_bytes_ == 0 || tokens.empty()) return;
    // Worst case a token adds max_depth nodes and itself: keep at most a quarter of the budget's
    // worth, so one response never flushes the whole store and the arrays stay bounded.
    const size_t per_token = size_t(trie_.max_depth()) * SuffixTrie::kNodeBytes + sizeof(token_id);
    const size_t cap       = std::max<size_t>(1, max_bytes_ / 4 / per_token);
    if (tokens.size() > cap) tokens.erase(tokens.begin(), tokens.end() - ptrdiff_t(cap));
    trie_.append(tokens);
    trie_.end_stream();
    doc_tokens_ += tokens.size();
    docs_.push_back(std::move(tokens));
    evict_to(max_bytes_);
}

// Oldest responses first, whole. Freed node slots are reused by the next responses, so the
// arrays never outgrow the largest live size reached (at most the budget plus one capped response).
void SuffixStore::evict_to(size_t target) {
    while (!docs_.empty() && bytes() > target) {
        trie_.remove(docs_.front());
        doc_tokens_ -= docs_.front().size();
        docs_.pop_front();
        ++n_evicted_;
    }
}

// ---------------------------------------------------------------------------------------------
// SuffixContext

void SuffixContext::sync(int64_t request, const std::vector<token_id> & tokens) {
    if (request != request_ || tokens.size() < n_) {
        trie_.clear();
        request_ = request;
        n_       = 0;
    }
    trie_.append(tokens.data() + n_, tokens.size() - n_);
    n_ = tokens.size();
}

// ---------------------------------------------------------------------------------------------
// Drafting

namespace {

struct Candidate {
    double   prob;     // estimated probability that the path root..node is accepted
    uint32_t trie;     // trie node
    int32_t  parent;   // parent in the draft tree
    int      depth;
    token_id token;
    uint64_t order;    // insertion order: ties broken deterministically
    bool operator<(const Candidate & o) const {  // priority_queue: top = largest prob, then oldest
        if (prob != o.prob) return prob < o.prob;
        return order > o.order;
    }
};

}  // namespace

SuffixProposal suffix_propose(const SuffixTrie & trie, const std::vector<token_id> & context,
                              const SuffixDraftParams & params, const CostModel & cm) {
    SuffixProposal out;
    out.tree = draft_tree_init(context.empty() ? -1 : context.back());
    if (context.empty() || params.max_nodes <= 0 || params.max_depth <= 0) return out;
    const SuffixTrie::Match m = trie.match(context.data(), context.size(), params.max_match);
    if (m.length < std::max(1, params.min_match)) return out;
    out.match_length = m.length;
    const int depth_cap = std::min(
        params.max_depth, int(params.spec_factor * m.length) + params.spec_offset);
    // a(j): per-position acceptance at depth j, clamped so a child never beats its parent
    const double alpha = std::clamp(params.alpha, 0.0, 1.0);
    auto accept_at = [&](int j) {
        if (params.depth_alpha.size() < 2) return alpha;
        const size_t i = std::min(size_t(j), params.depth_alpha.size() - 1);
        return std::clamp(params.depth_alpha[i], 0.0, 1.0);
    };

    std::priority_queue<Candidate> pq;
    std::vector<SuffixTrie::Child> kids;
    uint64_t order = 0;
    std::vector<int32_t> n_children(1, 0);  // per draft node
    // Pushes the children of trie node `u` (draft node `parent` at `depth`, path probability `p`).
    auto expand = [&](uint32_t u, int32_t parent, int depth, double p) {
        if (depth >= depth_cap) return;
        trie.children(u, kids);
        uint64_t total = 0;
        for (const auto & k : kids) total += k.count;
        if (total == 0) return;
        // descending count, ties to the smaller id: the order siblings are tried in
        std::sort(kids.begin(), kids.end(), [](const auto & a, const auto & b) {
            return a.count != b.count ? a.count > b.count : a.token < b.token;
        });
        const double a = accept_at(depth + 1);
        for (const auto & k : kids) {
            const double pc = p * a * double(k.count) / double(total);
            if (pc < params.min_prob) break;  // sorted: the rest are no better
            pq.push(Candidate{pc, k.node, parent, depth + 1, k.token, order++});
        }
    };
    expand(m.node, 0, 0, 1.0);

    // Best-first: children never beat their parent, so the order pops parents before children and
    // every prefix of it is a tree. Keep the prefix with the best predicted speed-up.
    struct Taken { int32_t parent; token_id token; double prob; };
    std::vector<Taken> taken;
    int    leaves   = 1;  // the root alone is one (empty) branch
    double sum_p    = 0;
    double best     = 1.0;  // plain decoding
    size_t best_len = 0;
    while (!pq.empty() && int(taken.size()) < params.max_nodes) {
        Candidate c = pq.top();
        pq.pop();
        // a second child of a node opens a branch (a KV sequence): none beyond max_branches
        const bool new_leaf = n_children[size_t(c.parent)] > 0;
        if (new_leaf && leaves >= std::max(1, params.max_branches)) continue;
        if (new_leaf) ++leaves;
        ++n_children[size_t(c.parent)];
        taken.push_back(Taken{c.parent, c.token, c.prob});
        n_children.push_back(0);
        sum_p += c.prob;
        const int    n   = int(taken.size());
        const double cost = cost_model_v(cm, n + 1) + cm.o;
        const double s    = cost > 0 ? (1.0 + sum_p) / cost : 0.0;
        if (s > best) {
            best     = s;
            best_len = taken.size();
        }
        expand(c.trie, int32_t(taken.size()), c.depth, c.prob);
    }
    for (size_t i = 0; i < best_len; ++i) draft_tree_add(out.tree, taken[i].parent, taken[i].token);
    out.score = best;
    return out;
}

SuffixProposal suffix_draft(const SuffixTrie * request, const SuffixTrie * store, const std::vector<token_id> & context,
                            const SuffixDraftParams & params, const CostModel & cm) {
    SuffixProposal a, b;
    if (request) a = suffix_propose(*request, context, params, cm);
    if (store) b = suffix_propose(*store, context, params, cm);
    if (!request) return b;
    if (!store) return a;
    const bool ha = draft_tree_size(a.tree) > 0, hb = draft_tree_size(b.tree) > 0;
    if (ha != hb) return hb ? b : a;
    // the longer match is the stronger evidence (count ratios do not show it: a continuation seen
    // once after a 2-token match has ratio 1 as one seen after 16 tokens); then the better score
    if (a.match_length != b.match_length) return b.match_length > a.match_length ? b : a;
    return b.score > a.score ? b : a;
}

std::vector<token_id> suffix_main_path(const DraftTree & tree) {
    std::vector<token_id> path;
    int32_t u = 0;
    for (;;) {
        int32_t next = -1;
        for (size_t c = size_t(u) + 1; c < tree.nodes.size(); ++c)
            if (tree.nodes[c].parent == u) { next = int32_t(c); break; }
        if (next < 0) return path;
        path.push_back(tree.nodes[size_t(next)].token);
        u = next;
    }
}

}  // namespace specrpc
