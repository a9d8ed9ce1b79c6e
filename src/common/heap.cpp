#include "common/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace specrpc {

void heap_configure_for_server() {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 4 << 20);  // a fixed threshold also ends the dynamic trim threshold
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
