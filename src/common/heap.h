// Heap hygiene for a long-running process (the server, an embedder of the C ABI): memory a large
// request used goes back to the OS.
//
// glibc maps blocks of 128 KiB and more with mmap and unmaps them on free, but each time it frees
// such a block it raises that threshold to the block's size (up to 32 MiB). After one large
// request (an 8 MiB body, a 3 MiB prompt) every later block up to that size comes from a
// thread's arena instead, and an arena keeps what it frees. Every I/O thread then holds its
// largest request's memory for good (measured in CHANGELOG.md). The server and the C ABI call
// them. Trimming alone does not do it: malloc_trim releases a thread arena's free chunks but not
// its top, where a large call's memory ends up; the fixed threshold keeps large blocks out of
// the arenas.
// On other C libraries both do nothing. Thread-safe.
#pragma once

#include <cstddef>

namespace specrpc {

// Requests that move at least this many bytes (body + answer) are followed by a trim.
inline constexpr std::size_t kHeapTrimAfterBytes = std::size_t{1} << 20;

// Fixes glibc's mmap threshold at 4 MiB, so that larger blocks are always unmapped when freed and
// an arena's free top above 128 KiB is returned (the fixed threshold ends the dynamic trim
// threshold too). Blocks below it (a 128k-vocabulary candidate array is 1.5 MB) stay in the
// arenas, where the engine reuses them every token. The first call sets it (mallopt), later
// calls do nothing: an embedding process that wants its own setting calls mallopt afterwards.
void heap_configure();

// After a request that moved `bytes`: from kHeapTrimAfterBytes on, returns the free pages of
// every arena to the OS (malloc_trim; about a millisecond); below it, nothing.
void heap_release_after(std::size_t bytes);

}  // namespace specrpc
