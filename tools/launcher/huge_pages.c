/* Huge pages for the tool's large allocations: the launcher executes itself again with glibc's
 * tunable glibc.malloc.hugetlb=1 when that is what makes them huge (docs/design.md §5).
 *
 * Why: a fresh process waits, before its first token, for llama.cpp to zero its KV cache and to
 * write its compute buffers for the first time: tens of MB of fresh anonymous memory, faulted in
 * one 4 KiB page at a time. Under a hypervisor a page fault is dear: on the machine of
 * docs/benchmarks.md, zeroing 26 MB this way took 76 ms, where populating the same memory in one
 * call took 6 ms. A 2 MiB page takes one fault where 4 KiB pages take 512. The kernel gives huge
 * pages to memory advised MADV_HUGEPAGE when transparent huge pages are in "madvise" mode (the
 * usual default), and glibc 2.35 and later advises every block it maps for a large allocation when
 * glibc.malloc.hugetlb is 1. glibc reads its tunables once, from the environment the process
 * starts with, hence the exec: same pid, arguments and descriptors. The launcher does it before
 * the tool's libraries are loaded, so the exec costs a few milliseconds, not the ~20 ms of loading
 * them twice.
 *
 * Not done when it would change nothing: another C library or one older than 2.35, huge pages off
 * ("never") or already given to all memory ("always"), the tunable set by the user (any value; it
 * also ends the loop), SPECRPC_HUGE_PAGES=0, or an ASan build (ASan has its own allocator). */
#define _GNU_SOURCE
#include "huge_pages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#if !defined(__SANITIZE_ADDRESS__)
static const char kTunable[] = "glibc.malloc.hugetlb";

/* Whether this process's C library reads glibc.malloc.hugetlb (glibc 2.35 and later). */
static int libc_has_hugetlb_tunable(void) {
#if defined(__GLIBC__)
    int major = 0, minor = 0;
    if (sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2) return 0;
    return major > 2 || (major == 2 && minor >= 35);
#else
    return 0;
#endif
}

/* Whether transparent huge pages go only to memory advised MADV_HUGEPAGE ("[madvise]" selected). */
static int thp_mode_is_madvise(void) {
    char  line[128] = {0};
    FILE *f         = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    const int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    return ok && strstr(line, "[madvise]") != NULL;
}
#endif

void specrpc_reexec_with_huge_pages(char **argv) {
#if defined(__SANITIZE_ADDRESS__)
    (void) argv;
#else
    const char *opt = getenv("SPECRPC_HUGE_PAGES");
    if (opt && strcmp(opt, "0") == 0) return;
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables && strstr(tunables, kTunable)) return;
    if (!libc_has_hugetlb_tunable() || !thp_mode_is_madvise()) return;
    char *old = tunables ? strdup(tunables) : NULL;
    if (tunables && !old) return;
    char  *value = NULL;
    int    n     = old && *old ? asprintf(&value, "%s:%s=1", old, kTunable) : asprintf(&value, "%s=1", kTunable);
    if (n < 0) { free(old); return; }
    if (setenv("GLIBC_TUNABLES", value, 1) == 0) {
        execv("/proc/self/exe", argv);
        /* Only reached when the exec failed (no /proc, say): run on with 4 KiB pages, as before. */
        if (old) setenv("GLIBC_TUNABLES", old, 1);
        else unsetenv("GLIBC_TUNABLES");
    }
    free(value);
    free(old);
#endif
}
