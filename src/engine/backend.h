// Process-wide llama.cpp initialisation: loads the ggml backends (best CPU variant) from the
// folder libllama lives in, and routes llama.cpp's log into ours. Idempotent and thread-safe.
#pragma once

#include <string>

struct ggml_threadpool;

namespace specrpc {

void backend_init();

// What identifies the loaded llama.cpp for the cost cache: the library file (path, size, mtime)
// and the CPU features it was built for.
std::string llama_lib_identity();

// A persistent CPU thread pool of n_threads (ggml_threadpool_new of the loaded CPU variant,
// found through the backend registry), or null if the CPU backend does not offer one. Without
// it ggml creates and joins its worker threads on every graph (every llama_decode), a fixed cost
// per pass, and on a busy machine a late-scheduled new thread stalls the pass at a barrier.
// Free with cpu_threadpool_free after every context using it.
ggml_threadpool * cpu_threadpool_new(int n_threads);
void              cpu_threadpool_free(ggml_threadpool * tp);
// Parks the pool's workers (they wait instead of polling for work); the next graph resumes it.
void              cpu_threadpool_pause(ggml_threadpool * tp);

}  // namespace specrpc
