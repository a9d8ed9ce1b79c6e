#include "speculative/tree_layout.h"

#include <algorithm>

namespace specrpc {

static std::vector<int32_t> leaf_index(const DraftTree & t) {
    std::vector<char> has_child(t.nodes.size(), 0);
    for (size_t i = 1; i < t.nodes.size(); ++i) has_child[t.nodes[i].parent] = 1;
    std::vector<int32_t> leaf(t.nodes.size(), -1);
    int32_t n = 0;
    for (size_t i = 0; i < t.nodes.size(); ++i)
        if (!has_child[i]) leaf[i] = n++;
    return leaf;
}

std::vector<std::vector<int32_t>> tree_node_seqs(const DraftTree & t, int32_t main_seq, int32_t max_branches) {
    std::vector<std::vector<int32_t>> seqs(t.nodes.size());
    const std::vector<int32_t> leaf = leaf_index(t);
    for (size_t i = 0; i < t.nodes.size(); ++i) {
        if (leaf[i] < 0 || leaf[i] >= max_branches) continue;
        for (int32_t n = static_cast<int32_t>(i); n >= 0; n = n > 0 ? t.nodes[n].parent : -1)
            seqs[n].push_back(main_seq + leaf[i]);
    }
    return seqs;
}

int32_t tree_node_branch(const DraftTree & t, int32_t node) {
    const std::vector<int32_t> leaf = leaf_index(t);
    int32_t best = -1;
    for (size_t i = 0; i < t.nodes.size(); ++i) {
        if (leaf[i] < 0) continue;
        for (int32_t n = static_cast<int32_t>(i); n >= 0; n = n > 0 ? t.nodes[n].parent : -1)
            if (n == node) { if (best < 0 || leaf[i] < best) best = leaf[i]; break; }
    }
    return best < 0 ? 0 : best;
}

int32_t tree_n_branches(const DraftTree & t) {
    int32_t n = 0;
    for (int32_t l : leaf_index(t)) n += l >= 0;
    return n;
}

int32_t tree_node_depth(const DraftTree & t, int32_t node) {
    int32_t d = 0;
    for (int32_t n = node; n > 0; n = t.nodes[n].parent) ++d;
    return d;
}

std::vector<token_id> tree_path(const DraftTree & t, int32_t node) {
    std::vector<token_id> path;
    for (int32_t n = node; n > 0; n = t.nodes[n].parent) path.push_back(t.nodes[n].token);
    std::reverse(path.begin(), path.end());
    return path;
}

}  // namespace specrpc
