// How a draft tree maps onto KV sequences. Each root-to-leaf path is a branch; leaf j (in node
// order) owns sequence main_seq + j. A node belongs to every branch whose leaf descends from it,
// so shared prefixes are stored once (unified KV) and each branch attends only to its own path.
#pragma once

#include <vector>

#include "speculative/verify.h"

namespace specrpc {

// For each node, the sequence ids it belongs to. Branches beyond `max_branches` are not allowed
// (the drafter must respect the limit); a chain maps entirely to main_seq.
std::vector<std::vector<int32_t>> tree_node_seqs(const DraftTree & t, int32_t main_seq, int32_t max_branches);

// The lowest branch index containing `node` (0 for the root and for every node of a chain).
int32_t tree_node_branch(const DraftTree & t, int32_t node);

// Number of leaves (branches) of the tree; 1 for a bare root.
int32_t tree_n_branches(const DraftTree & t);

// Depth of `node` (0 for the root): its KV position is the slot's cache size plus this.
int32_t tree_node_depth(const DraftTree & t, int32_t node);

// The tokens from the root (exclusive) to `node` (inclusive): what a sampler advances along
// before it gives the distribution after `node`.
std::vector<token_id> tree_path(const DraftTree & t, int32_t node);

}  // namespace specrpc
