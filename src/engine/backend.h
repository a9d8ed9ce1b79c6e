// Process-wide llama.cpp initialisation: loads the ggml backends (best CPU variant) from the
// folder libllama lives in, and routes llama.cpp's log into ours. Idempotent and thread-safe.
#pragma once

#include <string>
#include <vector>

struct ggml_threadpool;
struct llama_context;

namespace specrpc {

void backend_init();

// What identifies the loaded llama.cpp for the cost cache: the library file (path, size, mtime)
// and the CPU features it was built for.
std::string llama_lib_identity();

// A persistent CPU thread pool of n_threads (ggml_threadpool_new), parked until its first graph,
// or null for n_threads < 1. Without it ggml creates and joins its worker threads on every graph
// (every llama_decode), a fixed cost per pass, and on a busy machine a late-scheduled new thread
// stalls the pass at a barrier. Free with cpu_threadpool_free after every context using it.
// `workers`, when given, receives the kernel thread ids of the pool's n_threads - 1 workers (the
// threads that appeared in /proc/self/task while it was made), or stays empty when they cannot
// be told apart (another thread was started at the same moment): for cpu_threads_ms.
ggml_threadpool * cpu_threadpool_new(int n_threads, std::vector<int> * workers = nullptr);
void              cpu_threadpool_free(ggml_threadpool * tp);
// Parks the pool's workers (they wait instead of polling for work, which they otherwise do for
// a while after each graph); the next graph resumes it.
void              cpu_threadpool_pause(ggml_threadpool * tp);

// Runs the passes of `ctx` and `dft` (may be null) on n threads (the draft's single passes on
// n_draft, its batches on n). n == 1 detaches the pool and parks it: an attached pool wakes every
// worker for each graph, and an idle worker then polls for the next one beside the process it
// should leave the core to. n > 1 attaches `tp` again.
void cpu_threads_apply(llama_context * ctx, llama_context * dft, ggml_threadpool * tp, int n, int n_draft);

// Whether the processes running now (/proc/stat procs_running, this thread included) leave
// n_threads cores free: a start-up check, so an idle machine's first pass runs on all threads.
bool cpu_cores_free(int n_threads);
// The same from one read (~12 µs, no waiting): asked before trying all threads again while the
// engine runs on one (thread_choice.h). True when the count cannot be read.
bool cpu_cores_free_now(int n_threads);

// CPU time this process has used, in ms (all threads). Coarse for other threads than the
// caller: the kernel adds a running thread's time to the process's only at its scheduler tick
// (4 ms at HZ 250), so over a 1 ms pass of two busy threads it reads a share of 0.5 or 1.5.
double process_cpu_ms();
// CPU time, in ms, of the calling thread and the given threads of this process (kernel thread
// ids), each read exactly (a thread's own CPU clock is brought up to date when read, even while
// it runs on another core): against a pass's wall time, the share of their cores its threads
// got. NaN when a thread's clock cannot be read (it has ended).
double cpu_threads_ms(const std::vector<int> & tids);

}  // namespace specrpc
