// NgramCache: counting, incremental update, merge, and the binary file format (round trip,
// truncation, corruption, hostile headers).
#include "speculative/ngram_cache.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace specrpc {
namespace {

Ngram ng(std::initializer_list<token_id> t) { return Ngram::of(t.begin(), int(t.size())); }

std::vector<token_id> random_tokens(size_t n, int vocab, uint32_t seed) {
    std::mt19937                       rng(seed);
    std::uniform_int_distribution<int> d(0, vocab - 1);
    std::vector<token_id>              v(n);
    for (auto & t : v) t = d(rng);
    return v;
}

std::string temp_path(const std::string & name) {
    return testing::TempDir() + "ngram_cache_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_bytes(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string & path, const std::string & bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Little-endian builder for hand-crafted files, with the format's FNV-1a-64 checksum.
struct Bytes {
    std::string s;
    Bytes & raw(const std::string & x) { s += x; return *this; }
    Bytes & u8(uint8_t v) { s.push_back(char(v)); return *this; }
    Bytes & u32(uint32_t v) { for (int i = 0; i < 4; ++i) s.push_back(char(v >> (8 * i))); return *this; }
    Bytes & u64(uint64_t v) { for (int i = 0; i < 8; ++i) s.push_back(char(v >> (8 * i))); return *this; }
    std::string with_checksum() const {
        uint64_t h = 14695981039346656037ull;
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        Bytes out = *this;
        out.u64(h);
        return out.s;
    }
};

TEST(NgramCache, CountsFollowingTokens) {
    NgramCache c(1, 2);
    c.update({1, 2, 3, 1, 2, 4}, 6);
    EXPECT_EQ(c.count(ng({1}), 2), 2u);
    EXPECT_EQ(c.count(ng({2}), 3), 1u);
    EXPECT_EQ(c.count(ng({2}), 4), 1u);
    EXPECT_EQ(c.count(ng({1, 2}), 3), 1u);
    EXPECT_EQ(c.count(ng({1, 2}), 4), 1u);
    EXPECT_EQ(c.count(ng({3, 1}), 2), 1u);
    EXPECT_EQ(c.count(ng({4}), 1), 0u);  // 4 is last: nothing followed it
    EXPECT_EQ(c.find(ng({4})), nullptr);
    EXPECT_EQ(c.size(), 6u);  // 1-grams {1,2,3}, 2-grams {12,23,31}
    EXPECT_EQ(c.n_pairs(), 8u);
    const TokenCounts * tc = c.find(ng({2}));
    ASSERT_NE(tc, nullptr);
    ASSERT_EQ(tc->size(), 2u);
    EXPECT_EQ((*tc)[0].token, 3);  // sorted by token id
    EXPECT_EQ((*tc)[1].token, 4);
    c.clear();
    EXPECT_TRUE(c.empty());
    EXPECT_EQ(c.ngram_max(), 2);
}

TEST(NgramCache, RespectsRangeAndLengthIsPartOfKey) {
    NgramCache c(2, 3);
    c.update({0, 0, 0, 7}, 4);
    EXPECT_EQ(c.count(ng({0}), 0), 0u);  // 1-grams not counted
    EXPECT_EQ(c.count(ng({0, 0}), 0), 1u);
    EXPECT_EQ(c.count(ng({0, 0}), 7), 1u);
    EXPECT_EQ(c.count(ng({0, 0, 0}), 7), 1u);
    EXPECT_FALSE(ng({5}) == ng({5, 0}));  // zero padding must not alias lengths
    EXPECT_EQ(NgramCache(0, 9).ngram_min(), 1);
    EXPECT_EQ(NgramCache(0, 9).ngram_max(), NGRAM_MAX_LEN);
    EXPECT_EQ(NgramCache(3, 1).ngram_max(), 3);
}

TEST(NgramCache, IncrementalUpdateEqualsBatch) {
    const auto tokens = random_tokens(3000, 20, 1);
    NgramCache batch;
    batch.update(tokens, tokens.size());

    NgramCache            inc;
    std::vector<token_id> grown;
    std::mt19937          rng(2);
    size_t                i = 0;
    while (i < tokens.size()) {
        const size_t step = std::min<size_t>(1 + rng() % 7, tokens.size() - i);
        grown.insert(grown.end(), tokens.begin() + i, tokens.begin() + i + step);
        inc.update(grown, step);
        i += step;
    }
    EXPECT_TRUE(inc == batch);

    NgramCache clamped;  // n_new larger than the stream is clamped
    clamped.update(tokens, tokens.size() * 10);
    EXPECT_TRUE(clamped == batch);

    NgramCache partial;  // the last token alone adds exactly (max - min + 1) counts
    partial.update(tokens, 1);
    EXPECT_EQ(partial.n_pairs(), 4u);
}

TEST(NgramCache, MergeAddsCounts) {
    const auto a_tok = random_tokens(500, 10, 3);
    const auto b_tok = random_tokens(500, 10, 4);
    NgramCache a, b, both;
    a.update(a_tok, a_tok.size());
    b.update(b_tok, b_tok.size());
    both.update(a_tok, a_tok.size());
    both.update(b_tok, b_tok.size());

    NgramCache m = a;
    m.merge(b);
    EXPECT_TRUE(m == both);
    EXPECT_FALSE(m == a);

    NgramCache twice = a;
    twice.merge(a);
    for (int t = 0; t < 10; ++t) EXPECT_EQ(twice.count(ng({3}), t), 2 * a.count(ng({3}), t));

    NgramCache narrow(2, 2);
    narrow.merge(NgramCache(1, 3));
    EXPECT_EQ(narrow.ngram_min(), 1);
    EXPECT_EQ(narrow.ngram_max(), 3);
}

TEST(NgramCacheFile, RoundTrip) {
    const auto tokens = random_tokens(5000, 50, 5);
    NgramCache c(1, 4);
    c.update(tokens, tokens.size());
    const std::string path = temp_path("roundtrip.bin");
    ASSERT_TRUE(c.save(path).is_ok());
    auto loaded = NgramCache::load(path);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    EXPECT_TRUE(*loaded == c);
    EXPECT_EQ(loaded->size(), c.size());
    EXPECT_EQ(loaded->count(ng({tokens[10], tokens[11]}), tokens[12]), c.count(ng({tokens[10], tokens[11]}), tokens[12]));

    // Deterministic bytes: saving the loaded copy gives the same file.
    const std::string path2 = temp_path("roundtrip2.bin");
    ASSERT_TRUE(loaded->save(path2).is_ok());
    EXPECT_EQ(read_bytes(path), read_bytes(path2));

    NgramCache empty(2, 3);
    ASSERT_TRUE(empty.save(path).is_ok());
    auto e = NgramCache::load(path);
    ASSERT_TRUE(e.is_ok());
    EXPECT_TRUE(e->empty());
    EXPECT_EQ(e->ngram_min(), 2);
    EXPECT_EQ(e->ngram_max(), 3);
    std::remove(path.c_str());
    std::remove(path2.c_str());
}

TEST(NgramCacheFile, MissingFileAndUnwritablePath) {
    auto r = NgramCache::load(temp_path("does_not_exist.bin"));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::NOT_FOUND);

    NgramCache c;
    c.update({1, 2, 3}, 3);
    const Status st = c.save(temp_path("no_such_dir/x.bin"));
    EXPECT_FALSE(st.is_ok());
}

TEST(NgramCacheFile, EveryTruncationFails) {
    NgramCache c(1, 3);  // small: every prefix is tried
    c.update(random_tokens(16, 5, 6), 16);
    const std::string path = temp_path("trunc.bin");
    ASSERT_TRUE(c.save(path).is_ok());
    const std::string full = read_bytes(path);
    ASSERT_GT(full.size(), 36u);
    for (size_t len = 0; len < full.size(); ++len) {
        write_bytes(path, full.substr(0, len));
        auto r = NgramCache::load(path);
        ASSERT_FALSE(r.is_ok()) << "truncated to " << len;
        EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED);
    }
    write_bytes(path, full + "x");  // trailing garbage
    EXPECT_FALSE(NgramCache::load(path).is_ok());
    std::remove(path.c_str());
}

TEST(NgramCacheFile, EveryFlippedByteFails) {
    NgramCache c(1, 2);
    c.update(random_tokens(12, 4, 7), 12);
    const std::string path = temp_path("flip.bin");
    ASSERT_TRUE(c.save(path).is_ok());
    const std::string full = read_bytes(path);
    for (size_t i = 0; i < full.size(); ++i) {
        std::string bad = full;
        bad[i]          = char(bad[i] ^ 0x5a);
        write_bytes(path, bad);
        auto r = NgramCache::load(path);
        ASSERT_FALSE(r.is_ok()) << "flipped byte " << i;
        EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED);
    }
    std::remove(path.c_str());
}

// Files with a valid checksum but hostile fields: must fail without huge allocations.
TEST(NgramCacheFile, HostileHeadersFail) {
    const std::string path = temp_path("hostile.bin");
    auto header = [](uint32_t version, uint32_t nmin, uint32_t nmax, uint64_t n_entries) {
        Bytes b;
        b.raw("SPRNGRAM").u32(version).u32(nmin).u32(nmax).u64(n_entries);
        return b;
    };
    auto expect_fail = [&](const std::string & bytes, const char * what) {
        write_bytes(path, bytes);
        auto r = NgramCache::load(path);
        EXPECT_FALSE(r.is_ok()) << what;
        if (!r.is_ok()) {
            EXPECT_EQ(r.status().code(), ErrorCode::LOAD_FAILED) << what;
        }
    };

    // Sanity: a well-formed one-entry file written by hand loads.
    Bytes good = header(1, 1, 2, 1);
    good.u8(1).u32(7).u32(1).u32(9).u32(3);
    write_bytes(path, good.with_checksum());
    auto ok = NgramCache::load(path);
    ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
    EXPECT_EQ(ok->count(ng({7}), 9), 3u);

    expect_fail(header(1, 1, 4, uint64_t(1) << 60).with_checksum(), "huge entry count");
    expect_fail(header(2, 1, 4, 0).with_checksum(), "future version");
    expect_fail(header(1, 0, 4, 0).with_checksum(), "ngram_min 0");
    expect_fail(header(1, 3, 2, 0).with_checksum(), "min > max");
    expect_fail(header(1, 1, 9, 0).with_checksum(), "max too large");
    Bytes b = header(1, 1, 2, 1);
    b.u8(1).u32(7).u32(0xFFFFFFFFu).u32(9).u32(3);
    expect_fail(b.with_checksum(), "huge continuation count");
    b = header(1, 1, 2, 1);
    b.u8(3).u32(7).u32(7).u32(7).u32(1).u32(9).u32(3);
    expect_fail(b.with_checksum(), "n-gram longer than ngram_max");
    b = header(1, 1, 2, 1);
    b.u8(1).u32(7).u32(1).u32(9).u32(0);
    expect_fail(b.with_checksum(), "zero count");
    b = header(1, 1, 2, 1);
    b.u8(1).u32(7).u32(2).u32(9).u32(1).u32(9).u32(1);
    expect_fail(b.with_checksum(), "duplicate continuation");
    b = header(1, 1, 2, 2);
    b.u8(1).u32(7).u32(1).u32(9).u32(1);
    b.u8(1).u32(7).u32(1).u32(8).u32(1);
    expect_fail(b.with_checksum(), "duplicate n-gram");
    expect_fail(std::string(), "empty file");
    std::remove(path.c_str());
}

// Uncapped, a cache fed random tokens grows for good (the dynamic cache took a server from 18 to
// 235 MB). Capped, it stays under the cap, its books stay right, and what recurs survives.
TEST(NgramCache, MemoryCapEvictsRareNgramsFirst) {
    const size_t cap = 256 << 10;
    NgramCache   c(1, 4);
    c.set_max_bytes(cap);
    const std::vector<token_id> frequent = {1, 2, 3, 4, 5};
    size_t max_seen = 0;
    for (uint32_t round = 0; round < 200; ++round) {
        std::vector<token_id> toks = random_tokens(500, 512, round + 1);
        toks.insert(toks.end(), frequent.begin(), frequent.end());
        c.update(toks, toks.size());
        max_seen = std::max(max_seen, c.bytes());
    }
    EXPECT_LE(max_seen, cap);
    EXPECT_GT(c.bytes(), cap / 4);  // eviction stops at 3/4 of the cap, it does not empty the cache
    NgramCache uncapped(1, 4);
    for (uint32_t round = 0; round < 200; ++round) {
        std::vector<token_id> toks = random_tokens(500, 512, round + 1);
        toks.insert(toks.end(), frequent.begin(), frequent.end());
        uncapped.update(toks, toks.size());
    }
    EXPECT_GT(uncapped.bytes(), 8 * cap);  // the test has power: uncapped it would be far over
    EXPECT_GT(c.count(ng({1, 2, 3, 4}), 5), 0u);  // seen every round: survives every halving
    // n_pairs() is kept incrementally: it must match a recount (through a save/load round trip)
    const std::string path = temp_path("capped");
    ASSERT_TRUE(c.save(path).is_ok());
    auto back = NgramCache::load(path);
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back.value().n_pairs(), c.n_pairs());
    EXPECT_TRUE(back.value() == c);
    std::remove(path.c_str());
}

// A save killed mid-write leaves `path`.tmp.<pid>: the next save or load removes it, unless its
// process still runs (it may be saving right now).
TEST(NgramCacheFile, StaleTempFilesOfDeadProcessesAreRemoved) {
    const std::string path = temp_path("stale");
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    ASSERT_GT(dead, 0);
    ::waitpid(dead, nullptr, 0);  // reaped: its pid names no process now
    const std::string stale = path + ".tmp." + std::to_string(dead);
    const std::string live  = path + ".tmp." + std::to_string(::getppid());
    write_bytes(stale, "partial");
    write_bytes(live, "partial");
    NgramCache c(1, 2);
    c.update({1, 2, 3}, 3);
    ASSERT_TRUE(c.save(path).is_ok());
    EXPECT_NE(::access(stale.c_str(), F_OK), 0) << "stale temp file left behind";
    EXPECT_EQ(::access(live.c_str(), F_OK), 0) << "a live process's temp file was removed";
    write_bytes(stale, "partial");
    ASSERT_TRUE(NgramCache::load(path).is_ok());
    EXPECT_NE(::access(stale.c_str(), F_OK), 0) << "load left the stale temp file";
    std::remove(live.c_str());
    std::remove(path.c_str());
}

}  // namespace
}  // namespace specrpc
