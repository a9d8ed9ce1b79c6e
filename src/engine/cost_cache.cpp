// The on-disk cost cache (see cost_cache.h). Format, one item a line:
//   specrpc-costs 1
//   key <the key, newlines replaced by spaces>
//   t1 <ms>
//   c <ratio>
//   draft_threads <n>
//   v <count> <v[0]> ... <v[count-1]>
//   end
#include "engine/cost_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace specrpc {

static constexpr const char * kMagic = "specrpc-costs 1";

std::string cache_key_line(std::string s) {
    for (char & ch : s)
        if (ch == '\n' || ch == '\r') ch = ' ';
    return s;
}

std::string cost_cache_dir() {
    if (const char * d = std::getenv("SPECRPC_CACHE_DIR")) {
        const std::string s = d;
        return s == "off" ? std::string() : s;
    }
    if (const char * x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/specrpc";
    if (const char * h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/specrpc";
    return "";
}

std::string file_identity(const std::string & path) {
    struct stat st{};
    if (path.empty() || ::stat(path.c_str(), &st) != 0) return "";
    char   abs[PATH_MAX];
    const char * p = ::realpath(path.c_str(), abs) ? abs : path.c_str();
    return std::string(p) + " size=" + std::to_string(static_cast<long long>(st.st_size)) +
           " mtime=" + std::to_string(static_cast<long long>(st.st_mtim.tv_sec)) + "." +
           std::to_string(static_cast<long long>(st.st_mtim.tv_nsec));
}

std::string cpu_identity() {
    std::ifstream f("/proc/cpuinfo");
    std::string   line, model;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) {
            model = line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1);
            break;
        }
    return cache_key_line(model) + " cores=" + std::to_string(std::thread::hardware_concurrency());
}

// FNV-1a, 64 bits: names the file; the key inside decides.
static uint64_t fnv1a(const std::string & s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : s) { h ^= ch; h *= 1099511628211ull; }
    return h;
}

std::string cache_file_path(const std::string & dir, const char * prefix, const std::string & key) {
    char name[40];
    std::snprintf(name, sizeof name, "-%016llx.txt", static_cast<unsigned long long>(fnv1a(cache_key_line(key))));
    return dir + "/" + prefix + name;
}

std::string cost_cache_path(const std::string & dir, const std::string & key) {
    return cache_file_path(dir, "costs", key);
}

std::optional<std::ifstream> cache_file_open(const std::string & dir, const std::string & path, const char * magic,
                                             const std::string & key) {
    if (dir.empty()) return std::nullopt;  // no cache (path would name a file in the working directory)
    std::ifstream f(path);
    if (!f) return std::nullopt;
    std::string line;
    if (!std::getline(f, line) || line != magic) return std::nullopt;
    if (!std::getline(f, line) || line != "key " + cache_key_line(key)) return std::nullopt;  // stale: another key
    return f;
}

std::optional<CostRecord> cost_cache_load(const std::string & dir, const std::string & key) {
    std::optional<std::ifstream> file = cache_file_open(dir, cost_cache_path(dir, key), kMagic, key);
    if (!file) return std::nullopt;
    std::ifstream & f = *file;
    std::string line;
    CostRecord r;
    std::string word;
    bool        end = false, have_v = false, have_t1 = false;
    while (!end && std::getline(f, line)) {
        std::istringstream in(line);
        if (!(in >> word)) return std::nullopt;
        if (word == "t1") { if (!(in >> r.t1_ms)) return std::nullopt; have_t1 = true; }
        else if (word == "c") { if (!(in >> r.cost.c)) return std::nullopt; }
        else if (word == "draft_threads") { if (!(in >> r.draft_threads)) return std::nullopt; }
        else if (word == "v") {
            size_t n = 0;
            if (!(in >> n) || n < 2 || n > 257) return std::nullopt;
            r.cost.v.resize(n);
            for (double & x : r.cost.v)
                if (!(in >> x)) return std::nullopt;
            have_v = true;
        } else if (word == "end") end = true;
        else return std::nullopt;
        if (!end && in >> word) return std::nullopt;  // trailing garbage
    }
    // a truncated write has no "end"; numbers must be measurements
    if (!end || !have_v || !have_t1) return std::nullopt;
    if (!(std::isfinite(r.t1_ms) && r.t1_ms > 0) || !(std::isfinite(r.cost.c) && r.cost.c >= 0)) return std::nullopt;
    if (r.draft_threads < 0 || r.draft_threads > 4096) return std::nullopt;
    if (!cost_model_check(r.cost) || std::fabs(r.cost.v[1] - 1.0) > 1e-9) return std::nullopt;
    for (size_t n = 2; n < r.cost.v.size(); ++n)
        if (!(r.cost.v[n] >= 1.0 && r.cost.v[n] <= double(n))) return std::nullopt;
    return r;
}

static bool make_dirs(const std::string & dir) {
    for (size_t i = 1; i <= dir.size(); ++i)
        if (i == dir.size() || dir[i] == '/') {
            const std::string d = dir.substr(0, i);
            if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return false;
        }
    return true;
}

Status cache_file_write(const std::string & dir, const std::string & path, const std::string & text) {
    if (dir.empty()) return Status::ok();
    if (!make_dirs(dir)) return Status(ErrorCode::INTERNAL, "cannot create the cache directory " + dir);
    // unique per writer: two engines of one process may write the same key at once
    static std::atomic<uint64_t> serial{0};
    const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
    {
        std::ofstream f(tmp, std::ios::trunc);
        if (!f) return Status(ErrorCode::INTERNAL, "cannot write " + tmp);
        f << text;
        if (!f.flush()) { std::remove(tmp.c_str()); return Status(ErrorCode::INTERNAL, "cannot write " + tmp); }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        return Status(ErrorCode::INTERNAL, "cannot rename " + tmp);
    }
    return Status::ok();
}

Status cost_cache_save(const std::string & dir, const std::string & key, const CostRecord & rec) {
    if (dir.empty()) return Status::ok();
    std::ostringstream f;
    char buf[64];
    f << kMagic << "\nkey " << cache_key_line(key) << "\n";
    std::snprintf(buf, sizeof buf, "%.17g", rec.t1_ms);
    f << "t1 " << buf << "\n";
    std::snprintf(buf, sizeof buf, "%.17g", rec.cost.c);
    f << "c " << buf << "\ndraft_threads " << rec.draft_threads << "\nv " << rec.cost.v.size();
    for (double x : rec.cost.v) {
        std::snprintf(buf, sizeof buf, " %.17g", x);
        f << buf;
    }
    f << "\nend\n";
    return cache_file_write(dir, cost_cache_path(dir, key), f.str());
}

}  // namespace specrpc
