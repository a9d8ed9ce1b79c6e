#include "engine/backend.h"

#include <dirent.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "engine/cost_cache.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

namespace specrpc {

// llama.cpp logs at INFO are chatty (every tensor); only warnings and errors pass at our INFO.
static void llama_log_cb(enum ggml_log_level level, const char * text, void *) {
    // llama.cpp warns about harmless things on every load (unset special tokens, unified KV
    // larger than the training context): its warnings are our debug output, its errors warnings.
    LogLevel lv = level == GGML_LOG_LEVEL_ERROR ? LogLevel::WARN : LogLevel::DEBUG;
    if (static_cast<int>(lv) < static_cast<int>(log_get_level())) return;
    std::string s(text);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    if (!s.empty()) log_printf(lv, "llama: %s", s.c_str());
}

static std::string llama_lib_file() {
    Dl_info info{};
    return dladdr(reinterpret_cast<void *>(&llama_backend_init), &info) && info.dli_fname ? info.dli_fname : "";
}

std::string llama_lib_identity() { return file_identity(llama_lib_file()) + " " + llama_print_system_info(); }

// The directory of the loaded libllama: the CPU variants (libggml-cpu-*.so) live beside it.
static std::string llama_lib_dir() {
    if (std::string p = llama_lib_file(); !p.empty()) {
        auto        slash = p.rfind('/');
        if (slash != std::string::npos) return p.substr(0, slash);
    }
#ifdef SPECRPC_LLAMA_LIB_DIR
    return SPECRPC_LLAMA_LIB_DIR;
#else
    return ".";
#endif
}

void backend_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(llama_log_cb, nullptr);
        std::string dir = llama_lib_dir();
        ggml_backend_load_all_from_path(dir.c_str());
        llama_backend_init();
        SPR_LOG_DEBUG("ggml backends loaded from %s (%zu devices)", dir.c_str(), ggml_backend_dev_count());
    });
}

// The kernel thread ids of this process's threads, sorted.
static std::vector<int> task_ids() {
    std::vector<int> ids;
    if (DIR * d = opendir("/proc/self/task")) {
        while (const dirent * e = readdir(d))
            if (const int id = std::atoi(e->d_name); id > 0) ids.push_back(id);
        closedir(d);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
}

// Called directly (ggml-cpu.h), not through the backend registry: the registry offers
// ggml_threadpool_new and _free but not _pause, and a pool that is never parked polls for work
// beside whatever runs next (another engine in the process, another process).
ggml_threadpool * cpu_threadpool_new(int n_threads, std::vector<int> * workers) {
    if (n_threads < 1) return nullptr;
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    // parked until its first graph: a new pool's workers otherwise poll for work at once, and
    // another engine's start-up check (cpu_cores_free) counted them as a busy process
    tpp.paused = true;
    // ggml starts the workers in ggml_threadpool_new and keeps their ids to itself: they are
    // the threads that appear meanwhile (engines made at once make their pools in turn)
    static std::mutex           making;
    std::lock_guard<std::mutex> lock(making);
    const std::vector<int>      before = workers ? task_ids() : std::vector<int>{};
    ggml_threadpool *           tp     = ggml_threadpool_new(&tpp);
    if (workers) {
        workers->clear();
        const std::vector<int> after = task_ids();
        std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(*workers));
        if (!tp || workers->size() != size_t(n_threads - 1)) workers->clear();
    }
    return tp;
}

void cpu_threadpool_free(ggml_threadpool * tp) {
    if (tp) ggml_threadpool_free(tp);
}

void cpu_threadpool_pause(ggml_threadpool * tp) {
    if (tp) ggml_threadpool_pause(tp);
}

void cpu_threads_apply(llama_context * ctx, llama_context * dft, ggml_threadpool * tp, int n, int n_draft) {
    for (llama_context * c : {ctx, dft}) {
        if (!c) continue;
        if (tp && n > 1) llama_attach_threadpool(c, tp, tp);
        if (tp && n <= 1) llama_detach_threadpool(c);
        llama_set_n_threads(c, c == dft ? n_draft : n, n);
    }
    if (tp && n <= 1) cpu_threadpool_pause(tp);
}

static long procs_running() {
    std::FILE * f = std::fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[256];
    long running = -1;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "procs_running %ld", &running) == 1) break;
    std::fclose(f);
    return running;
}

// `running` threads, this one among them: do the others leave n_threads cores for us?
static bool cores_leave_room(long running, int n_threads) {
    const long cores = static_cast<long>(std::max(1u, std::thread::hardware_concurrency()));
    return running >= 1 && running - 1 <= cores - n_threads;
}

bool cpu_cores_free(int n_threads) {
    // The least of four reads 0.3 ms apart: a process that busies a core is running at every
    // read, one that is only passing through (a shell, a short tool) rarely is, and one read
    // caught one often enough to start a fresh engine on one thread.
    long running = -1;
    for (int i = 0; i < 4; ++i) {
        if (i > 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        const long r = procs_running();
        if (r >= 1 && (running < 0 || r < running)) running = r;
    }
    return cores_leave_room(running, n_threads);
}

bool cpu_cores_free_now(int n_threads) {
    // One read: a process that busies a core is running at any read; a short one caught by it
    // only delays the trial by a few passes.
    const long running = procs_running();
    return running < 1 || cores_leave_room(running, n_threads);
}

double process_cpu_ms() {
    timespec ts{};
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

double cpu_threads_ms(const std::vector<int> & tids) {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return NAN;
    double ms = double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
    for (const int tid : tids) {
        // the CPU clock of thread `tid` (Linux's encoding, the one pthread_getcpuclockid returns:
        // the complemented id shifted by 3, per-thread bit 4, scheduler clock 2); the kernel
        // reads it exactly, a running thread's time included
        const auto clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
        if (clock_gettime(clock, &ts) != 0) return NAN;
        ms += double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
    }
    return ms;
}

}  // namespace specrpc
