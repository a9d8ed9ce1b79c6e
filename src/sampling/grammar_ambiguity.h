// A bound on the work llama.cpp's grammar sampler can be made to do, measured on the grammar
// before llama.cpp sees it.
//
// llama.cpp tracks a grammar's parse as a set of stacks (element positions). A nullable item
// (`"a"?`, `x*`, a rule that may be empty) makes every later position reachable from one point,
// and alternatives that match the same character keep one stack each, so the set multiplies:
// `root ::= "a"? "a"? ...` with 250 items holds 251 stacks, and applying the grammar to the
// vocabulary advances each one into up to 250 more per character of every token (with a linear
// duplicate search), 31 s at 250 items, minutes at 20,000, on the engine thread that every
// request shares. `s ::= "a" s "b" | "a" s "c" | ...` grows 4x per accepted character.
//
// This check parses the GBNF itself (the same language, expanded as llama.cpp expands it) and runs
// the same stack machine on an adversarial input: at each character the one that keeps the most
// stacks alive. It counts what llama.cpp would do (stacks alive after a prefix; stacks visited
// while matching one token of up to `token_chars` characters, without deduplication across
// branches, as llama.cpp's candidate rejection does), and, for every position of the grammar
// (so that a long literal prefix hides nothing), the stacks advancing from it yields; it refuses
// a grammar over the limits. The counts are deterministic; the check's own work is bounded by
// `max_work` (llama.cpp's grammars/*.gbnf take under 3 ms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace specrpc {

struct GrammarAmbiguityLimits {
    // Stacks alive at once after any prefix. Each costs a pass over the candidates per apply.
    // llama.cpp's grammars/*.gbnf stay far below; 128 x "a"? (129 stacks) took 0.4 s per apply.
    size_t max_stacks = 48;
    // Stacks visited while one token of up to `token_chars` characters is matched from one state
    // (the tree llama.cpp's candidate rejection walks, each branch separately). 16 x "a"? costs
    // 9,384, 32 x "a"? 284,240; llama.cpp's grammars/*.gbnf at most 105.
    uint64_t max_token_work = 32768;
    int      token_chars    = 4;
    // Characters of adversarial input the set of stacks is followed for.
    int      prefix_chars = 8;
    // The check's own budget (stack expansions); a grammar that needs more is refused as too
    // ambiguous to analyse.
    uint64_t max_work = 400000;
};

// OK (also when the text does not parse: llama.cpp reports syntax errors), or INVALID_ARGUMENT
// (param "grammar"), "grammar too ambiguous: ...". Assumes grammar_check's size and nesting
// limits already hold (the parser recurses once per nesting level).
Status grammar_ambiguity_check(const std::string & gbnf, const GrammarAmbiguityLimits & limits = {});

}  // namespace specrpc
