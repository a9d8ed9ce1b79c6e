#include "speculative/coupled_noise.h"

#include <cmath>
#include <limits>

namespace specrpc {

namespace {

// splitmix64's finaliser: a bijection of 64-bit words with full avalanche, so consecutive seeds,
// positions and ids give unrelated outputs.
uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The per-(seed, pos) key, computed once per draw; the token id is mixed in last.
uint64_t position_key(uint64_t seed, uint64_t pos) {
    return mix64(mix64(seed ^ 0xC2B2AE3D27D4EB4Full) ^ pos);
}

double to_open_unit(uint64_t bits) {
    return (double(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (k + ½) / 2^53
}

}  // namespace

double coupled_uniform(uint64_t seed, uint64_t pos, token_id id) {
    return to_open_unit(mix64(position_key(seed, pos) ^ uint64_t(uint32_t(id))));
}

token_id coupled_argmax(const Dist & d, uint64_t seed, uint64_t pos) {
    const uint64_t key  = position_key(seed, pos);
    token_id       best = -1;
    double         best_score = -std::numeric_limits<double>::infinity();
    for (const auto & tp : d) {
        if (!(tp.p > 0.0f)) continue;
        const double u     = to_open_unit(mix64(key ^ uint64_t(uint32_t(tp.id))));
        const double score = std::log(double(tp.p)) - std::log(-std::log(u));
        if (best < 0 || score > best_score || (score == best_score && tp.id < best)) {
            best       = tp.id;
            best_score = score;
        }
    }
    return best;
}

}  // namespace specrpc
