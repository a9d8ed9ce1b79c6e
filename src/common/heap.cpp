#include "common/heap.h"

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace specrpc {

void heap_configure() {
#if defined(__GLIBC__)
    static std::once_flag once;
    std::call_once(once, [] { mallopt(M_MMAP_THRESHOLD, 4 << 20); });
#endif
}

void heap_release_after(std::size_t bytes) {
#if defined(__GLIBC__)
    if (bytes >= kHeapTrimAfterBytes) malloc_trim(0);
#else
    (void) bytes;
#endif
}

}  // namespace specrpc
