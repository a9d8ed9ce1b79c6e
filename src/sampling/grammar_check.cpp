#include "sampling/grammar_check.h"

#include <algorithm>
#include <cstdint>

namespace specrpc {

// Lexes GBNF as llama.cpp does for the purposes that matter here: string literals "..." and
// character classes [...] (with backslash escapes), token references <...>, comments # to the
// end of the line, names; '(' ')' "::=" and the repetition operators * + ? {m,n} are counted.
// Malformed text is left to llama.cpp's parser, which rejects it.
//
// Size: llama.cpp expands repetitions into copies and rules (S{m,n} -> m copies of S, then n-m
// nested optional rules; S* S+ S? -> one rule), so `last` tracks the size in grammar elements of
// the item a repetition applies to, as llama.cpp's parser sees it (a group is one rule
// reference; a repetition keeps applying to the repeated sequence), and `size` the elements of
// the expanded grammar.
Status grammar_check(const std::string & g, const GrammarLimits & lim) {
    int      depth   = 0;
    size_t   n_rules = 0;
    uint64_t size    = 0, last = 0;
    const size_t n = g.size();
    auto is_word = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; };
    auto number = [&](size_t & i) {  // digits at g[i..], i left on the last one; saturates
        uint64_t v = 0;
        for (; i < n && g[i] >= '0' && g[i] <= '9'; ++i) v = std::min<uint64_t>(v * 10 + uint64_t(g[i] - '0'), 1u << 30);
        --i;
        return v;
    };
    // m copies of the last item, then `rules` rules holding it (its elements, a reference, an
    // alternate, an end, and a rule's own vector, counted as 4 more)
    auto repeat = [&](uint64_t m, uint64_t rules) {
        size += (m > 1 ? m - 1 : 0) * last + rules * (last + 7);
        last = last * std::max<uint64_t>(m, 1) + (rules > 0 ? 1 : 0);
    };
    for (size_t i = 0; i < n && size <= lim.max_elements; ++i) {
        const char c = g[i];
        if (c == '\0') break;  // llama.cpp reads a C string: nothing after a NUL reaches it
        if (c == '#') {
            while (i + 1 < n && g[i + 1] != '\n' && g[i + 1] != '\r') ++i;
        } else if (c == '"' || c == '[') {
            const char close = c == '"' ? '"' : ']';
            uint64_t chars = 0;
            for (++i; i < n && g[i] != close && g[i] != '\0'; ++i, ++chars)
                if (g[i] == '\\' && i + 1 < n) ++i;
            last = std::max<uint64_t>(chars, 1) + (c == '[' ? 1 : 0);
            size += last;
        } else if (c == '<') {
            while (i + 1 < n && g[i + 1] != '>' && g[i + 1] != '\0') ++i;
            last = 1;
            size += 1;
        } else if (c == '(') {
            if (++depth > lim.max_nesting)
                return invalid_arg("grammar nests parentheses deeper than " + std::to_string(lim.max_nesting) +
                                       " levels", "grammar");
            if (++n_rules > lim.max_rules) break;
        } else if (c == ')') {
            if (depth > 0) --depth;
            last = 1;  // the group is one reference to its rule
            size += 1;
        } else if (c == ':' && i + 2 < n && g[i + 1] == ':' && g[i + 2] == '=') {
            i += 2;
            if (++n_rules > lim.max_rules) break;
        } else if (c == '*' || c == '+' || c == '?') {
            repeat(c == '+' ? 1 : 0, 1);
        } else if (c == '{') {
            size_t j = i + 1;
            while (j < n && g[j] == ' ') ++j;
            const uint64_t m = number(j);
            uint64_t       rules = 1;  // {m,}: one recursive rule
            for (++j; j < n && g[j] == ' '; ++j) {}
            if (j < n && g[j] == '}') {
                rules = 0;
            } else if (j < n && g[j] == ',') {
                for (++j; j < n && g[j] == ' '; ++j) {}
                if (j < n && g[j] >= '0' && g[j] <= '9') {
                    const uint64_t mx = number(j);
                    rules = mx > m ? mx - m : 0;
                    ++j;
                }
            }
            repeat(m, rules);
            i = std::max(i, j > 0 ? j - 1 : j);
        } else if (c == '.') {
            last = 1;
            size += 1;
        } else if (is_word(c)) {
            while (i + 1 < n && is_word(g[i + 1])) ++i;
            last = 1;
            size += 1;
        }
        if (n_rules > lim.max_rules) break;
    }
    if (n_rules > lim.max_rules)
        return invalid_arg("grammar defines more than " + std::to_string(lim.max_rules) +
                               " rules (rule definitions plus parenthesised groups)", "grammar");
    if (size > lim.max_elements)
        return invalid_arg("grammar expands to more than " + std::to_string(lim.max_elements) +
                               " elements (repetitions {m,n} are copied m times and add n-m rules)", "grammar");
    return grammar_ambiguity_check(g, lim.ambiguity);
}

}  // namespace specrpc
