// Process-wide llama.cpp initialisation: loads the ggml backends (best CPU variant) from the
// folder libllama lives in, and routes llama.cpp's log into ours. Idempotent and thread-safe.
#pragma once

namespace specrpc {

void backend_init();

}  // namespace specrpc
