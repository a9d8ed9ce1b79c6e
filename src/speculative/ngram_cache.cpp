#include "speculative/ngram_cache.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

// File layout (version 1), all integers little-endian:
//
//   offset  size  field
//   0       8     magic "SPRNGRAM"
//   8       4     u32 version = 1
//   12      4     u32 ngram_min   in [1, NGRAM_MAX_LEN]
//   16      4     u32 ngram_max   in [ngram_min, NGRAM_MAX_LEN]
//   20      8     u64 n_entries   number of distinct n-grams
//   28      ...   n_entries x entry, sorted by (n, tokens) ascending, no duplicates:
//                   u8 n in [ngram_min, ngram_max]; i32 tokens[n];
//                   u32 n_next >= 1; n_next x (i32 token, u32 count >= 1), tokens ascending
//   end-8   8     u64 FNV-1a-64 of every preceding byte
//
// The file ends right after the checksum.

namespace specrpc {

namespace {

constexpr char     FILE_MAGIC[8]  = {'S', 'P', 'R', 'N', 'G', 'R', 'A', 'M'};
constexpr uint32_t FILE_VERSION   = 1;
constexpr size_t   HEADER_BYTES   = 8 + 4 + 4 + 4 + 8;
constexpr size_t   CHECKSUM_BYTES = 8;
constexpr size_t   IO_CHUNK       = 1 << 20;  // buffered I/O chunk, bytes
constexpr uint64_t FNV_OFFSET     = 14695981039346656037ull;
constexpr uint64_t FNV_PRIME      = 1099511628211ull;

// Final mixer of splitmix64: a cheap bijection with good avalanche.
uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint32_t add_saturating(uint32_t a, uint32_t b) {
    return a > std::numeric_limits<uint32_t>::max() - b ? std::numeric_limits<uint32_t>::max() : a + b;
}

bool ngram_less(const Ngram & a, const Ngram & b) {
    if (a.n != b.n) return a.n < b.n;
    return a.tokens < b.tokens;
}

// Buffered little-endian writer that checksums what it writes. Errors are sticky.
class FileWriter {
  public:
    explicit FileWriter(std::FILE * f) : f_(f) { buf_.reserve(IO_CHUNK); }

    void bytes(const void * p, size_t n) {
        const auto * b = static_cast<const uint8_t *>(p);
        for (size_t i = 0; i < n; ++i) {
            hash_ = (hash_ ^ b[i]) * FNV_PRIME;
        }
        buf_.insert(buf_.end(), b, b + n);
        if (buf_.size() >= IO_CHUNK) flush();
    }
    void u8(uint8_t v) { bytes(&v, 1); }
    void u32(uint32_t v) {
        uint8_t b[4];
        for (int i = 0; i < 4; ++i) b[i] = uint8_t(v >> (8 * i));
        bytes(b, 4);
    }
    void i32(int32_t v) { u32(uint32_t(v)); }
    void u64(uint64_t v) {
        uint8_t b[8];
        for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
        bytes(b, 8);
    }
    uint64_t checksum() const { return hash_; }
    // Writes out the buffer; false if any write so far failed.
    bool flush() {
        if (ok_ && !buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) ok_ = false;
        buf_.clear();
        return ok_;
    }

  private:
    std::FILE *          f_;
    std::vector<uint8_t> buf_;
    uint64_t             hash_ = FNV_OFFSET;
    bool                 ok_   = true;
};

// Buffered little-endian reader over a file of known size that checksums what it reads.
// Every read fails (returns false) instead of running past the end of the file.
class FileReader {
  public:
    FileReader(std::FILE * f, uint64_t size) : f_(f), size_(size) {}

    uint64_t remaining() const { return size_ - pos_; }  // bytes not yet consumed
    uint64_t pos() const { return pos_; }                // bytes consumed
    uint64_t checksum() const { return hash_; }          // FNV-1a of the bytes consumed

    bool bytes(void * p, size_t n) {
        if (n > remaining()) return false;
        auto * out = static_cast<uint8_t *>(p);
        while (n > 0) {
            if (head_ == buf_.size()) {
                buf_.resize(size_t(std::min<uint64_t>(IO_CHUNK, remaining())));
                if (std::fread(buf_.data(), 1, buf_.size(), f_) != buf_.size()) return false;
                head_ = 0;
            }
            const size_t take = std::min(n, buf_.size() - head_);
            for (size_t i = 0; i < take; ++i) {
                hash_ = (hash_ ^ buf_[head_ + i]) * FNV_PRIME;
            }
            std::memcpy(out, buf_.data() + head_, take);
            head_ += take;
            pos_ += take;
            out += take;
            n -= take;
        }
        return true;
    }
    bool u8(uint8_t & v) { return bytes(&v, 1); }
    bool u32(uint32_t & v) {
        uint8_t b[4];
        if (!bytes(b, 4)) return false;
        v = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
        return true;
    }
    bool i32(int32_t & v) {
        uint32_t u;
        if (!u32(u)) return false;
        v = int32_t(u);
        return true;
    }
    bool u64(uint64_t & v) {
        uint8_t b[8];
        if (!bytes(b, 8)) return false;
        v = 0;
        for (int i = 7; i >= 0; --i) v = v << 8 | b[i];
        return true;
    }

  private:
    std::FILE *          f_;
    uint64_t             size_;
    uint64_t             pos_ = 0;
    std::vector<uint8_t> buf_;
    size_t               head_ = 0;
    uint64_t             hash_ = FNV_OFFSET;
};

struct FileCloser {
    void operator()(std::FILE * f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

Status corrupt(const std::string & path, uint64_t pos, const std::string & what) {
    return Status(ErrorCode::LOAD_FAILED,
                  "ngram cache '" + path + "': " + what + " (at byte " + std::to_string(pos) + ")", "path");
}

Status write_error(const std::string & path, const std::string & what) {
    return Status(ErrorCode::INTERNAL, "ngram cache '" + path + "': " + what + ": " + std::strerror(errno), "path");
}

}  // namespace

Ngram Ngram::of(const token_id * first, int n) {
    Ngram g;
    g.n = uint8_t(n);
    for (int i = 0; i < n; ++i) g.tokens[i] = first[i];
    return g;
}

size_t NgramHash::operator()(const Ngram & g) const noexcept {
    const uint64_t a = uint64_t(uint32_t(g.tokens[0])) << 32 | uint32_t(g.tokens[1]);
    const uint64_t b = uint64_t(uint32_t(g.tokens[2])) << 32 | uint32_t(g.tokens[3]);
    return size_t(mix64(a ^ mix64(b ^ (uint64_t(g.n) * 0x9e3779b97f4a7c15ull))));
}

NgramCache::NgramCache(int ngram_min, int ngram_max) {
    ngram_min_ = std::clamp(ngram_min, 1, NGRAM_MAX_LEN);
    ngram_max_ = std::clamp(ngram_max, ngram_min_, NGRAM_MAX_LEN);
}

void NgramCache::add(const Ngram & key, token_id next, uint32_t count) {
    TokenCounts & counts = map_[key];
    auto it = std::lower_bound(counts.begin(), counts.end(), next,
                               [](const TokenCount & tc, token_id t) { return tc.token < t; });
    if (it != counts.end() && it->token == next) {
        it->count = add_saturating(it->count, count);
    } else {
        counts.insert(it, TokenCount{next, count});
        ++n_pairs_;
        if (max_bytes_ > 0 && bytes() > max_bytes_) evict(max_bytes_ / 4 * 3);
    }
}

void NgramCache::set_max_bytes(size_t max_bytes) {
    max_bytes_ = max_bytes;
    if (max_bytes_ > 0 && bytes() > max_bytes_) evict(max_bytes_ / 4 * 3);
}

void NgramCache::evict(size_t target) {
    while (!map_.empty() && bytes() > target) {
        for (auto it = map_.begin(); it != map_.end();) {
            TokenCounts & counts = it->second;
            size_t kept = 0;
            for (TokenCount & tc : counts)
                if ((tc.count /= 2) > 0) counts[kept++] = tc;
            n_pairs_ -= counts.size() - kept;
            counts.resize(kept);
            if (kept == 0) it = map_.erase(it);
            else ++it;
        }
    }
}

// Removes `path`.tmp.<pid> files whose process is gone: what a save killed mid-write leaves.
// A live pid's file may be a save in progress (another process sharing the file), so it stays.
static void remove_stale_tmp(const std::string & path) {
    const size_t slash = path.find_last_of('/');
    const std::string dir    = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
    DIR * d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent * e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string pid_s = name.substr(prefix.size());
        if (pid_s.size() > 9 || pid_s.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t pid = static_cast<pid_t>(std::stol(pid_s));
        if (pid <= 0 || pid == ::getpid()) continue;  // our own is rewritten by this save
        if (::kill(pid, 0) != 0 && errno == ESRCH) std::remove((dir + "/" + name).c_str());
    }
    ::closedir(d);
}

void NgramCache::update(const std::vector<token_id> & tokens, size_t n_new) {
    const size_t len   = tokens.size();
    const size_t first = len - std::min(n_new, len);  // index of the first new token
    for (size_t i = first; i < len; ++i) {
        for (int n = ngram_min_; n <= ngram_max_ && size_t(n) <= i; ++n) {
            add(Ngram::of(&tokens[i - n], n), tokens[i], 1);
        }
    }
}

void NgramCache::merge(const NgramCache & other) {
    ngram_min_ = std::min(ngram_min_, other.ngram_min_);
    ngram_max_ = std::max(ngram_max_, other.ngram_max_);
    for (const auto & [key, counts] : other.map_) {
        for (const TokenCount & tc : counts) add(key, tc.token, tc.count);
    }
}

const TokenCounts * NgramCache::find(const Ngram & key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
}

uint32_t NgramCache::count(const Ngram & key, token_id next) const {
    const TokenCounts * counts = find(key);
    if (counts == nullptr) return 0;
    auto it = std::lower_bound(counts->begin(), counts->end(), next,
                               [](const TokenCount & tc, token_id t) { return tc.token < t; });
    return it != counts->end() && it->token == next ? it->count : 0;
}

bool NgramCache::operator==(const NgramCache & other) const {
    return ngram_min_ == other.ngram_min_ && ngram_max_ == other.ngram_max_ && map_ == other.map_;
}

Status NgramCache::save(const std::string & path) const {
    // 1. Sort the entries so that the file is reproducible.
    std::vector<const std::pair<const Ngram, TokenCounts> *> entries;
    entries.reserve(map_.size());
    for (const auto & kv : map_) entries.push_back(&kv);
    std::sort(entries.begin(), entries.end(), [](auto * a, auto * b) { return ngram_less(a->first, b->first); });

    // 2. Write everything to a temp file next to the destination.
    remove_stale_tmp(path);
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    FilePtr           f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return write_error(path, "cannot create '" + tmp + "'");
    FileWriter w(f.get());
    w.bytes(FILE_MAGIC, sizeof(FILE_MAGIC));
    w.u32(FILE_VERSION);
    w.u32(uint32_t(ngram_min_));
    w.u32(uint32_t(ngram_max_));
    w.u64(entries.size());
    for (const auto * e : entries) {
        w.u8(e->first.n);
        for (int i = 0; i < e->first.n; ++i) w.i32(e->first.tokens[i]);
        w.u32(uint32_t(e->second.size()));
        for (const TokenCount & tc : e->second) {
            w.i32(tc.token);
            w.u32(tc.count);
        }
    }
    w.u64(w.checksum());

    // 3. Make it durable, then atomically replace the destination.
    const bool ok = w.flush() && std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0;
    const bool closed = std::fclose(f.release()) == 0;
    if (!ok || !closed) {
        Status st = write_error(path, "write failed");
        std::remove(tmp.c_str());
        return st;
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        Status st = write_error(path, "rename failed");
        std::remove(tmp.c_str());
        return st;
    }
    return Status::ok();
}

Result<NgramCache> NgramCache::load(const std::string & path) {
    // 1. Open and size the file.
    remove_stale_tmp(path);
    struct stat sb {};
    if (::stat(path.c_str(), &sb) != 0) {
        return Status(ErrorCode::NOT_FOUND, "ngram cache '" + path + "': " + std::strerror(errno), "path");
    }
    if (!S_ISREG(sb.st_mode)) return corrupt(path, 0, "not a regular file");
    FilePtr f(std::fopen(path.c_str(), "rb"));
    if (!f) {
        return Status(ErrorCode::LOAD_FAILED, "ngram cache '" + path + "': " + std::strerror(errno), "path");
    }
    const uint64_t size = uint64_t(sb.st_size);
    if (size < HEADER_BYTES + CHECKSUM_BYTES) return corrupt(path, 0, "file too short");
    FileReader r(f.get(), size - CHECKSUM_BYTES);  // the checksum is read separately below

    // 2. Header.
    char     magic[8];
    uint32_t version = 0, nmin = 0, nmax = 0;
    uint64_t n_entries = 0;
    if (!r.bytes(magic, 8) || std::memcmp(magic, FILE_MAGIC, 8) != 0) return corrupt(path, 0, "bad magic");
    if (!r.u32(version) || version != FILE_VERSION) {
        return corrupt(path, 8, "unsupported version " + std::to_string(version));
    }
    if (!r.u32(nmin) || !r.u32(nmax) || nmin < 1 || nmin > nmax || nmax > uint32_t(NGRAM_MAX_LEN)) {
        return corrupt(path, 12, "bad n-gram range");
    }
    if (!r.u64(n_entries)) return corrupt(path, r.pos(), "truncated header");
    // Smallest entry: u8 n, i32 tokens[nmin], u32 n_next, one (token, count) pair.
    const uint64_t min_entry_bytes = 1 + 4ull * nmin + 4 + 8;
    if (n_entries > r.remaining() / min_entry_bytes) return corrupt(path, 20, "entry count exceeds file size");

    // 3. Entries, checking every invariant the in-memory cache relies on.
    NgramCache cache(static_cast<int>(nmin), static_cast<int>(nmax));
    cache.map_.reserve(size_t(n_entries));
    Ngram prev;
    for (uint64_t e = 0; e < n_entries; ++e) {
        const uint64_t at = r.pos();
        Ngram          key;
        if (!r.u8(key.n)) return corrupt(path, at, "truncated entry");
        if (key.n < nmin || key.n > nmax) return corrupt(path, at, "n-gram length out of range");
        for (int i = 0; i < key.n; ++i) {
            if (!r.i32(key.tokens[i])) return corrupt(path, at, "truncated entry");
        }
        if (e > 0 && !ngram_less(prev, key)) return corrupt(path, at, "entries unsorted or duplicated");
        prev = key;
        uint32_t n_next = 0;
        if (!r.u32(n_next)) return corrupt(path, at, "truncated entry");
        if (n_next == 0 || n_next > r.remaining() / 8) return corrupt(path, at, "bad continuation count");
        TokenCounts counts(n_next);
        for (uint32_t j = 0; j < n_next; ++j) {
            if (!r.i32(counts[j].token) || !r.u32(counts[j].count)) return corrupt(path, at, "truncated entry");
            if (counts[j].count == 0) return corrupt(path, at, "zero count");
            if (j > 0 && counts[j - 1].token >= counts[j].token) {
                return corrupt(path, at, "continuations unsorted or duplicated");
            }
        }
        cache.n_pairs_ += counts.size();
        cache.map_.emplace(key, std::move(counts));
    }
    if (r.remaining() != 0) return corrupt(path, r.pos(), "trailing bytes after the entries");

    // 4. Checksum (read raw: it is not part of what it covers).
    const uint64_t expected = r.checksum();
    FileReader     tail(f.get(), CHECKSUM_BYTES);
    uint64_t       stored = 0;
    if (!tail.u64(stored)) return corrupt(path, size - CHECKSUM_BYTES, "truncated checksum");
    if (stored != expected) return corrupt(path, size - CHECKSUM_BYTES, "checksum mismatch");
    return cache;
}

}  // namespace specrpc
