// Huge pages for the tool's large allocations: the tool executes itself again with glibc's tunable
// glibc.malloc.hugetlb=1 when that is what makes them huge (docs/design.md, "Start-up").
//
// Why: a fresh process waits, before its first token, for llama.cpp to zero its KV cache and to
// write its compute buffers for the first time: tens of MB of fresh anonymous memory, faulted in
// one 4 KiB page at a time. Under a hypervisor a page fault is dear: on the machine of
// docs/benchmarks.md, zeroing 26 MB this way took 76 ms, where populating the same memory in one
// call took 6 ms. A 2 MiB page takes one fault where 4 KiB pages take 512. The kernel gives huge
// pages to memory advised MADV_HUGEPAGE when transparent huge pages are in "madvise" mode (the
// usual default), and glibc 2.35 and later advises every block it maps for a large allocation when
// glibc.malloc.hugetlb is 1. glibc reads its tunables once, from the environment the process
// starts with, hence the exec: same pid, arguments and descriptors, before anything is read.
//
// Not done when it would change nothing: another C library or one older than 2.35, huge pages off
// ("never") or already given to all memory ("always"), the tunable set by the user (any value; it
// also ends the loop), SPECRPC_HUGE_PAGES=0, or an ASan build (ASan has its own allocator).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <unistd.h>

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include "tools.h"

namespace specrpc::cli {

namespace {

constexpr const char * kTunable = "glibc.malloc.hugetlb";

// Whether this process's C library reads glibc.malloc.hugetlb (glibc 2.35 and later).
bool libc_has_hugetlb_tunable() {
#if defined(__GLIBC__)
    int major = 0, minor = 0;
    if (std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2) return false;
    return major > 2 || (major == 2 && minor >= 35);
#else
    return false;
#endif
}

// Whether transparent huge pages go only to memory advised MADV_HUGEPAGE ("[madvise]" selected).
bool thp_mode_is_madvise() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    return std::getline(f, line) && line.find("[madvise]") != std::string::npos;
}

}  // namespace

void reexec_with_huge_pages(char ** argv) {
#if defined(__SANITIZE_ADDRESS__)
    (void) argv;
#else
    const char * opt = std::getenv("SPECRPC_HUGE_PAGES");
    if (opt && std::strcmp(opt, "0") == 0) return;
    const char * tunables = std::getenv("GLIBC_TUNABLES");
    if (tunables && std::strstr(tunables, kTunable)) return;
    if (!libc_has_hugetlb_tunable() || !thp_mode_is_madvise()) return;
    std::string value = std::string(kTunable) + "=1";
    if (tunables && *tunables) value = std::string(tunables) + ":" + value;
    if (setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
    execv("/proc/self/exe", argv);
    // Only reached when the exec failed (no /proc, say): run on with 4 KiB pages, as before.
    if (tunables) setenv("GLIBC_TUNABLES", tunables, 1);
    else unsetenv("GLIBC_TUNABLES");
#endif
}

}  // namespace specrpc::cli
