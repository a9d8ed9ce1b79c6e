// A cheap, non-recursive pre-check of a GBNF grammar before llama.cpp parses it.
//
// llama.cpp's grammar parser recurses once per nesting level of parentheses (parse_alternates ->
// parse_sequence -> parse_alternates), and its left-recursion check recurses once per rule along
// chains of leading rule references (`a ::= b ...`, `b ::= c ...`, and every group is such a
// rule). Both run on the thread that creates the sampler (the engine thread): a 60 KB grammar of
// 30,000 nested parentheses overflowed its stack and killed the process. This scan bounds both
// depths by bounding nesting and the number of rules (definitions plus groups) the text can
// produce, and the size llama.cpp's expansion of repetitions reaches, so nothing unbounded
// reaches llama.cpp. It does not validate the grammar otherwise (llama.cpp does that and reports
// syntax errors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "sampling/grammar_ambiguity.h"

namespace specrpc {

struct GrammarLimits {
    // Deepest nesting of parentheses. Hand-written and JSON-schema grammars nest a few levels;
    // 256 keeps llama.cpp's parser well inside the engine thread's stack (also under ASan).
    int    max_nesting = 256;
    // Rule definitions plus groups (each group becomes a rule in llama.cpp). Bounds the depth of
    // llama.cpp's left-recursion check, which can follow a chain through all of them.
    size_t max_rules = 4096;
    // Elements of the grammar once llama.cpp has expanded its repetitions (S{m,n}: m copies of S
    // and n-m rules), each rule counted as 7 more. Bounds the parser's memory and the sampler's
    // work: 200 x "a"{0,2000} (2.4 KB) took 8.7 s and +89 MB for 2 tokens, and the 256 KiB a
    // request may send would have taken gigabytes. 2^19 is twice the elements of any grammar of
    // plain literals that fits in those 256 KiB.
    uint64_t max_elements = 1 << 19;
    // The work llama.cpp's sampler can be made to do per token (grammar_ambiguity.h).
    GrammarAmbiguityLimits ambiguity;
};

// OK, or INVALID_ARGUMENT (param "grammar") naming the limit exceeded. The size scan is
// O(grammar size) without recursion; the ambiguity check runs only on grammars within its limits.
Status grammar_check(const std::string & gbnf, const GrammarLimits & limits = {});

}  // namespace specrpc
