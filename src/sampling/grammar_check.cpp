#include "sampling/grammar_check.h"

namespace specrpc {

// Lexes GBNF as llama.cpp does for the purposes that matter here: string literals "..." and
// character classes [...] (with backslash escapes), token references <...>, comments # to the
// end of the line; everything else is scanned for '(' ')' and "::=". Unbalanced or otherwise
// malformed text is left to llama.cpp's parser, which rejects it.
Status grammar_check(const std::string & g, const GrammarLimits & lim) {
    int    depth = 0;
    size_t n_rules = 0;
    const size_t n = g.size();
    for (size_t i = 0; i < n; ++i) {
        const char c = g[i];
        if (c == '\0') break;  // llama.cpp reads a C string: nothing after a NUL reaches it
        if (c == '#') {
            while (i + 1 < n && g[i + 1] != '\n' && g[i + 1] != '\r') ++i;
        } else if (c == '"' || c == '[') {
            const char close = c == '"' ? '"' : ']';
            for (++i; i < n && g[i] != close && g[i] != '\0'; ++i)
                if (g[i] == '\\' && i + 1 < n) ++i;
        } else if (c == '<') {
            while (i + 1 < n && g[i + 1] != '>' && g[i + 1] != '\0') ++i;
        } else if (c == '(') {
            if (++depth > lim.max_nesting)
                return invalid_arg("grammar nests parentheses deeper than " + std::to_string(lim.max_nesting) +
                                       " levels", "grammar");
            if (++n_rules > lim.max_rules) break;
        } else if (c == ')') {
            if (depth > 0) --depth;
        } else if (c == ':' && i + 2 < n && g[i + 1] == ':' && g[i + 2] == '=') {
            i += 2;
            if (++n_rules > lim.max_rules) break;
        }
    }
    if (n_rules > lim.max_rules)
        return invalid_arg("grammar defines more than " + std::to_string(lim.max_rules) +
                               " rules (rule definitions plus parenthesised groups)", "grammar");
    return Status::ok();
}

}  // namespace specrpc
