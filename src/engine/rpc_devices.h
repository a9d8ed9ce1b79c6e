// The ggml devices of llama.cpp `rpc-server` workers, for llama_model_params.devices: a model
// loaded with them has its layers split over the workers (llama.cpp's RPC backend).
#pragma once

#include <string>
#include <vector>

#include "ggml-backend.h"
#include "specrpc/status.h"

namespace specrpc {

// Appends every device of every worker ("host:port") to `out`. llama.cpp's RPC client aborts
// the process on an endpoint it cannot parse or reach, so each one is checked here first (a TCP
// connection within a few seconds): a bad or unreachable worker is an error naming it. Fails too
// when the loaded llama.cpp has no RPC backend (built without GGML_RPC).
Status rpc_devices(const std::vector<std::string> & endpoints, std::vector<ggml_backend_dev_t> & out);

}  // namespace specrpc
