// The on-disk cache of measured costs (the cost curve v(n), the draft cost ratio c, t(1) and the
// draft's thread count), so that a process starts with what an earlier one measured on this
// machine instead of timing passes before it can speculate. One small text file per key; a
// missing, corrupt or differently keyed file is ignored (the engine then probes, briefly).
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "common/status.h"
#include "speculative/draft_length.h"

namespace specrpc {

struct CostRecord {
    CostModel cost;               // v (v[1] = 1) and c; o is not kept (re-estimated every round)
    double    t1_ms         = 0;  // a 1-token target pass
    int32_t   draft_threads = 0;  // threads a drafted token runs on (0: no draft model)
};

// The cache directory: $SPECRPC_CACHE_DIR if set ("" or "off" disables the cache), else
// $XDG_CACHE_HOME/specrpc, else $HOME/.cache/specrpc; "" = disabled.
std::string cost_cache_dir();

// What identifies a model file for the key: absolute path, size and modification time; "" when
// it cannot be stat'ed.
std::string file_identity(const std::string & path);
// The CPU's model name (/proc/cpuinfo) and core count: a cache copied to another machine misses.
std::string cpu_identity();

// Shared with the caches kept beside this one (learned_cache.h): the file `prefix`-<hash of key>.txt
// in dir; the key on one line (newlines replaced by spaces); a text written to path atomically (a
// temporary file renamed over the old one), creating dir ("" = no cache: nothing written).
std::string cache_file_path(const std::string & dir, const char * prefix, const std::string & key);
std::string cache_key_line(std::string s);
Status      cache_file_write(const std::string & dir, const std::string & path, const std::string & text);
// The file at path in dir, read past its two header lines ("<magic>", "key <key>"); nullopt when
// there is no cache (dir ""), or the file is missing, of another format, or written for another
// key (stale).
std::optional<std::ifstream> cache_file_open(const std::string & dir, const std::string & path, const char * magic,
                                             const std::string & key);

// The file a key is kept in, in dir: a hash of the key names it, the key itself is its second line.
std::string cost_cache_path(const std::string & dir, const std::string & key);
// The record kept for `key` in dir; nullopt when there is none, the file is corrupt or
// implausible, or it was written for another key.
std::optional<CostRecord> cost_cache_load(const std::string & dir, const std::string & key);
// Writes the record (creating dir; atomically: a temporary file renamed over the old one).
Status cost_cache_save(const std::string & dir, const std::string & key, const CostRecord & rec);

}  // namespace specrpc
