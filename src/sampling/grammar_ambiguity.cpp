#include "sampling/grammar_ambiguity.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace specrpc {
namespace {

enum class El : uint8_t { END, ALT, REF, CHR, TOK };
struct Elem {
    El       type;
    uint32_t v;  // REF: rule id; CHR: char set id
};
struct CharSet {
    bool                                       negate = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool has(uint32_t c) const {
        bool in = false;
        for (const auto & [lo, hi] : ranges) in = in || (c >= lo && c <= hi);
        return in != negate;
    }
};
constexpr uint32_t kTokenChar = 0xFFFFFFFFu;  // the input symbol every <token> element matches
constexpr uint32_t kNone      = 0xFFFFFFFFu;
constexpr size_t   kMaxElems  = size_t(1) << 21;  // grammar_check bounds the expansion well below

// GBNF as llama.cpp reads it: rules of alternatives of sequences, groups and repetitions turned
// into generated rules (S* -> R ::= S R | ; S{m,n} -> m copies, then n-m nested optional rules).
// Anything it does not understand makes parse() false, and llama.cpp has the last word.
class Parser {
public:
    explicit Parser(const std::string & s) : s_(s) {}

    bool parse() {
        for (skip_ws(); ok_ && i_ < s_.size() && s_[i_] != '\0'; skip_ws()) {
            const std::string nm = name();
            skip_ws();
            if (nm.empty() || s_.compare(i_, 3, "::=") != 0) return false;
            i_ += 3;
            alternates(sym(nm));
        }
        if (!ok_ || !ids.count("root")) return false;
        for (size_t r = 0; r < rules.size(); ++r)
            if (!defined[r]) return false;  // llama.cpp reports the undefined rule
        return true;
    }

    std::vector<std::vector<Elem>> rules;
    std::vector<bool>              defined;
    std::vector<CharSet>           sets;
    std::map<std::string, uint32_t> ids;

private:
    const std::string & s_;
    size_t i_ = 0;
    bool   ok_ = true;
    size_t n_elems_ = 0;
    std::map<uint32_t, uint32_t> single_;  // character -> its one-character set (literals share them)

    static bool word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }
    char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

    void skip_ws() {
        while (i_ < s_.size()) {
            const char c = s_[i_];
            if (c == ' ' || c == '\t' || c == '\r' || c == '\n') ++i_;
            else if (c == '#') while (i_ < s_.size() && s_[i_] != '\n') ++i_;
            else break;
        }
    }
    std::string name() {
        const size_t b = i_;
        while (word(peek())) ++i_;
        return s_.substr(b, i_ - b);
    }
    bool definition_ahead() {  // `name ::=` starts the next rule
        const size_t save = i_;
        name();
        while (peek() == ' ' || peek() == '\t') ++i_;
        const bool def = s_.compare(i_, 3, "::=") == 0;
        i_ = save;
        return def;
    }
    uint32_t sym(const std::string & nm) {
        auto it = ids.find(nm);
        if (it != ids.end()) return it->second;
        ids[nm] = new_rule();
        defined.back() = false;
        return ids[nm];
    }
    uint32_t new_rule() {
        rules.emplace_back();
        defined.push_back(true);
        return static_cast<uint32_t>(rules.size() - 1);
    }
    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k, ++i_) {
            const char c = peek();
            const int  d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) { ok_ = false; return 0; }
            v = v * 16 + uint32_t(d);
        }
        return v;
    }
    uint32_t character() {  // one (escaped or UTF-8) character at i_, consumed
        if (i_ >= s_.size()) { ok_ = false; return 0; }
        const unsigned char c = static_cast<unsigned char>(s_[i_++]);
        if (c == '\\') {
            const char e = peek();
            ++i_;
            switch (e) {
                case 'x': return hex(2);
                case 'u': return hex(4);
                case 'U': return hex(8);
                case 't': return '\t';
                case 'r': return '\r';
                case 'n': return '\n';
                case '\0': ok_ = false; return 0;
                default: return static_cast<unsigned char>(e);
            }
        }
        const int len = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 0;
        uint32_t  v   = len == 0 ? c : c & (0x3F >> len);
        for (int k = 0; k < len && i_ < s_.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(s_[i_++]) & 0x3F);
        return v;
    }
    uint32_t add_set(CharSet cs) {
        sets.push_back(std::move(cs));
        return static_cast<uint32_t>(sets.size() - 1);
    }
    void push(std::vector<Elem> & out, Elem e) {
        if (++n_elems_ > kMaxElems) ok_ = false;
        else out.push_back(e);
    }

    void alternates(uint32_t rule) {
        std::vector<Elem> out;
        sequence(out);
        for (skip_ws(); ok_ && peek() == '|'; skip_ws()) {
            ++i_;
            push(out, {El::ALT, 0});
            sequence(out);
        }
        push(out, {El::END, 0});
        rules[rule]   = std::move(out);
        defined[rule] = true;
    }

    void sequence(std::vector<Elem> & out) {
        size_t last = kNone;  // where the item a repetition applies to starts
        for (skip_ws(); ok_ && i_ < s_.size(); skip_ws()) {
            const char c = peek();
            if (c == ')' || c == '|' || c == '\0') return;
            if (word(c)) {
                if (definition_ahead()) return;
                last = out.size();
                push(out, {El::REF, sym(name())});
            } else if (c == '"') {
                ++i_;
                last = out.size();
                while (ok_ && i_ < s_.size() && peek() != '"') {
                    const uint32_t ch = character();
                    auto [it, fresh] = single_.emplace(ch, 0);
                    if (fresh) it->second = add_set({false, {{ch, ch}}});
                    push(out, {El::CHR, it->second});
                }
                if (peek() != '"') { ok_ = false; return; }
                ++i_;
            } else if (c == '[') {
                ++i_;
                CharSet cs;
                if (peek() == '^') { cs.negate = true; ++i_; }
                while (ok_ && i_ < s_.size() && peek() != ']') {
                    const uint32_t lo = character();
                    uint32_t       hi = lo;
                    if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') { ++i_; hi = character(); }
                    cs.ranges.push_back({lo, hi});
                }
                if (peek() != ']') { ok_ = false; return; }
                ++i_;
                last = out.size();
                push(out, {El::CHR, add_set(std::move(cs))});
            } else if (c == '.') {
                ++i_;
                last = out.size();
                push(out, {El::CHR, add_set({true, {}})});
            } else if (c == '<' || (c == '!' && peek(1) == '<')) {
                while (i_ < s_.size() && peek() != '>') ++i_;
                if (peek() != '>') { ok_ = false; return; }
                ++i_;
                last = out.size();
                push(out, {El::TOK, 0});
            } else if (c == '(') {
                ++i_;
                const uint32_t r = new_rule();
                alternates(r);
                skip_ws();
                if (peek() != ')') { ok_ = false; return; }
                ++i_;
                last = out.size();
                push(out, {El::REF, r});
            } else if (c == '*' || c == '+' || c == '?') {
                ++i_;
                if (last == kNone) { ok_ = false; return; }
                repeat(out, last, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
            } else if (c == '{') {
                ++i_;
                if (last == kNone) { ok_ = false; return; }
                const auto number = [&] {
                    int64_t v = -1;
                    while (peek() == ' ') ++i_;
                    for (; peek() >= '0' && peek() <= '9'; ++i_) v = std::min<int64_t>((v < 0 ? 0 : v) * 10 + (peek() - '0'), 1 << 30);
                    while (peek() == ' ') ++i_;
                    return v;
                };
                const int64_t m = number();
                int64_t       n = m;
                if (peek() == ',') { ++i_; n = number(); }
                if (m < 0 || peek() != '}' || (n >= 0 && n < m)) { ok_ = false; return; }
                ++i_;
                repeat(out, last, m, n);
            } else {
                ok_ = false;
            }
        }
    }

    // S{m,n} (n < 0: unbounded): m copies of S, then one recursive rule or n-m nested optional ones
    void repeat(std::vector<Elem> & out, size_t start, int64_t m, int64_t n) {
        const std::vector<Elem> item(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
        out.resize(start);
        for (int64_t k = 0; k < m && ok_; ++k)
            for (const Elem & e : item) push(out, e);
        if (n < 0) {
            const uint32_t r = new_rule();
            std::vector<Elem> body = item;
            body.push_back({El::REF, r});
            body.push_back({El::ALT, 0});
            body.push_back({El::END, 0});
            n_elems_ += body.size();
            rules[r] = std::move(body);
            push(out, {El::REF, r});
        } else if (n > m) {
            uint32_t inner = kNone;
            for (int64_t k = 0; k < n - m && ok_; ++k) {
                const uint32_t r = new_rule();
                std::vector<Elem> body = item;
                if (inner != kNone) body.push_back({El::REF, inner});
                body.push_back({El::ALT, 0});
                body.push_back({El::END, 0});
                n_elems_ += body.size();
                if (n_elems_ > kMaxElems) ok_ = false;
                rules[r] = std::move(body);
                inner    = r;
            }
            push(out, {El::REF, inner});
        }
    }
};

using Stack = std::vector<uint32_t>;  // positions in Machine::all, innermost last

// llama.cpp's stack machine over the parsed rules, counting its work.
struct Machine {
    std::vector<Elem>     all;    // every rule's elements, one after another
    std::vector<uint32_t> start;  // rule id -> its first element in `all`
    const std::vector<CharSet> & sets;
    uint64_t work = 0, max_work = 0;
    size_t   n_rules = 0;
    bool     left_recursive = false;

    Machine(const Parser & p, uint64_t budget) : sets(p.sets), max_work(budget), n_rules(p.rules.size()) {
        for (const auto & r : p.rules) {
            start.push_back(static_cast<uint32_t>(all.size()));
            all.insert(all.end(), r.begin(), r.end());
        }
    }
    bool over() const { return left_recursive || work > max_work; }
    bool is_end(uint32_t p) const { return all[p].type == El::END || all[p].type == El::ALT; }

    // Replaces rule references on top by each of their alternatives until every stack has a
    // terminal on top (or is empty, the grammar complete), as llama_grammar_advance_stack does.
    void advance(Stack st, std::vector<Stack> & out) {
        const size_t base = st.size();
        std::vector<Stack> todo{std::move(st)};
        std::set<Stack>    seen;
        while (!todo.empty() && !over()) {
            Stack cur = std::move(todo.back());
            todo.pop_back();
            if (!seen.insert(cur).second) continue;
            ++work;
            if (cur.empty() || all[cur.back()].type != El::REF) {
                out.push_back(std::move(cur));
                continue;
            }
            const uint32_t pos = cur.back();
            for (uint32_t sub = start[all[pos].v];;) {
                Stack next(cur.begin(), cur.end() - 1);
                if (!is_end(pos + 1)) next.push_back(pos + 1);
                if (!is_end(sub)) next.push_back(sub);
                // without consuming input a rule can only be re-entered through left recursion,
                // which llama.cpp refuses with its own message
                if (next.size() > base + n_rules + 1) { left_recursive = true; return; }
                todo.push_back(std::move(next));
                while (!is_end(sub)) ++sub;
                if (all[sub].type != El::ALT) break;
                ++sub;
            }
        }
    }
    // The most stacks advancing from one position can yield (saturating; recursion through a rule
    // still being computed counts nothing, which only left recursion, refused by llama.cpp, needs).
    uint64_t max_fan_out() {
        struct Fan { uint64_t stacks = 0; bool exits = false; };
        const uint64_t cap = uint64_t(1) << 32;
        std::vector<Fan>     rule_fan(n_rules);
        std::vector<uint8_t> state(n_rules, 0);  // 0 new, 1 open, 2 done
        uint64_t most = 0;
        auto finish = [&](uint32_t r) {
            Fan total;
            for (uint32_t a = start[r];;) {  // each alternative backwards from its end
                uint32_t q = a;
                while (!is_end(q)) ++q;
                Fan next{0, true};
                for (uint32_t p = q; p-- > a;) {
                    Fan f;
                    if (all[p].type == El::REF) {
                        const Fan & sub = state[all[p].v] == 2 ? rule_fan[all[p].v] : Fan{};
                        f.stacks = std::min(cap, sub.stacks + (sub.exits ? next.stacks : 0));
                        f.exits  = sub.exits && next.exits;
                    } else {
                        f.stacks = 1;
                    }
                    most = std::max(most, f.stacks);
                    next = f;
                }
                total.stacks = std::min(cap, total.stacks + next.stacks);
                total.exits  = total.exits || next.exits;
                if (all[q].type != El::ALT) break;
                a = q + 1;
            }
            rule_fan[r] = total;
            state[r]    = 2;
        };
        for (uint32_t root = 0; root < n_rules; ++root) {
            if (state[root]) continue;
            std::vector<std::pair<uint32_t, bool>> todo{{root, false}};  // (rule, children pushed)
            while (!todo.empty()) {
                auto [r, expanded] = todo.back();
                todo.pop_back();
                if (expanded) { finish(r); continue; }
                if (state[r]) continue;
                state[r] = 1;
                todo.push_back({r, true});
                for (uint32_t p = start[r]; p < all.size() && !(all[p].type == El::END); ++p)
                    if (all[p].type == El::REF && state[all[p].v] == 0) todo.push_back({all[p].v, false});
                ++work;
            }
        }
        return most;
    }

    bool matches(const Stack & st, uint32_t c) const {
        if (st.empty()) return false;
        const Elem & e = all[st.back()];
        return e.type == El::TOK ? c == kTokenChar : e.type == El::CHR && c != kTokenChar && sets[e.v].has(c);
    }
    // The stacks after `c` (no deduplication across the input stacks: llama.cpp's candidate
    // rejection recurses into each stack's successors separately).
    void step(const std::vector<Stack> & in, uint32_t c, std::vector<Stack> & out) {
        for (const Stack & st : in) {
            if (over()) return;
            if (!matches(st, c)) continue;
            Stack nx(st.begin(), st.end() - 1);
            if (!is_end(st.back() + 1)) nx.push_back(st.back() + 1);
            advance(std::move(nx), out);
        }
    }
    // Input characters worth trying on `in`: the lower end of every range of the sets on top (a
    // character in the most sets is always one of those), one character outside each negated set.
    std::vector<uint32_t> candidates(const std::vector<Stack> & in) const {
        std::set<uint32_t> done, chars;
        for (const Stack & st : in) {
            if (st.empty()) continue;
            const Elem & e = all[st.back()];
            if (e.type == El::TOK) { chars.insert(kTokenChar); continue; }
            if (!done.insert(e.v).second) continue;
            const CharSet & cs = sets[e.v];
            if (!cs.negate) {
                for (const auto & r : cs.ranges) chars.insert(r.first);
            } else {
                uint32_t c = 0x20;  // past every range it falls in
                for (bool moved = true; moved;) {
                    moved = false;
                    for (const auto & [lo, hi] : cs.ranges)
                        if (c >= lo && c <= hi && hi < 0x10FFFF) { c = hi + 1; moved = true; }
                }
                if (cs.has(c)) chars.insert(c);
            }
            if (chars.size() >= 64) break;
        }
        return {chars.begin(), chars.end()};
    }
    // The character of `candidates` that leaves the most stacks, and those stacks.
    std::vector<Stack> worst_step(const std::vector<Stack> & in, bool dedup) {
        std::vector<Stack>             best;
        std::set<std::vector<bool>>    tried;  // characters matching the same stacks step alike
        for (uint32_t c : candidates(in)) {
            std::vector<bool> sig(in.size());
            for (size_t i = 0; i < in.size(); ++i) sig[i] = matches(in[i], c);
            if (!tried.insert(std::move(sig)).second) continue;
            std::vector<Stack> out;
            step(in, c, out);
            if (dedup) {
                std::sort(out.begin(), out.end());
                out.erase(std::unique(out.begin(), out.end()), out.end());
            }
            if (out.size() > best.size()) best = std::move(out);
            if (over()) break;
        }
        return best;
    }
};

Status too_ambiguous(const std::string & what) {
    return invalid_arg("grammar too ambiguous: " + what +
                           " (optional or repeated items in sequence, or alternatives, that match the same text "
                           "multiply llama.cpp's parse stacks)", "grammar");
}

}  // namespace

Status grammar_ambiguity_check(const std::string & gbnf, const GrammarAmbiguityLimits & lim) {
    Parser p(gbnf);
    if (!p.parse()) return Status::ok();
    Machine m(p, lim.max_work);

    std::vector<Stack> stacks;
    const uint32_t root = p.ids.at("root");
    for (uint32_t a = m.start[root];;) {  // one stack per alternative of root, as llama.cpp starts
        m.advance(m.is_end(a) ? Stack{} : Stack{a}, stacks);
        while (!m.is_end(a)) ++a;
        if (m.all[a].type != El::ALT) break;
        ++a;
    }
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());

    for (int n_chars = 0; n_chars <= lim.prefix_chars && !stacks.empty(); ++n_chars) {
        if (m.left_recursive) return Status::ok();
        if (m.work > m.max_work) break;
        const std::string after = n_chars == 0 ? "at the start" : "after " + std::to_string(n_chars) + " characters";
        if (stacks.size() > lim.max_stacks)
            return too_ambiguous(std::to_string(stacks.size()) + " parse stacks alive " + after + " (limit " +
                                 std::to_string(lim.max_stacks) + ")");
        // one token of up to token_chars characters matched from here
        uint64_t token_work = 0;
        std::vector<Stack> frontier = stacks;
        for (int k = 0; k < lim.token_chars && !frontier.empty() && token_work <= lim.max_token_work && !m.over(); ++k) {
            frontier = m.worst_step(frontier, false);
            token_work += frontier.size();
        }
        if (m.left_recursive) return Status::ok();
        if (token_work > lim.max_token_work)
            return too_ambiguous("matching one token " + after + " visits more than " +
                                 std::to_string(lim.max_token_work) + " parse stacks");
        stacks = m.worst_step(stacks, true);
    }
    // The adversarial input sees the first prefix_chars characters; a nullable run behind a longer
    // literal is found here, statically: for every position, the stacks that advancing from it
    // alone yields (each rule reference: the stacks of its rule's alternatives, plus what follows
    // when the rule can end). Rules in post-order, iteratively (chains of rules are long).
    if (uint64_t most = m.max_fan_out(); most > lim.max_stacks)
        return too_ambiguous(std::to_string(most) + " parse stacks alive at one point (limit " +
                             std::to_string(lim.max_stacks) + ")");
    if (m.left_recursive) return Status::ok();
    if (m.work > m.max_work)
        return too_ambiguous("its parse stacks took more than " + std::to_string(m.max_work) + " expansions to explore");
    return Status::ok();
}

}  // namespace specrpc
