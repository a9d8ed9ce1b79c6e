// The ggml devices of llama.cpp `rpc-server` workers, for llama_model_params.devices: a model
// loaded with them has its layers split over the workers (llama.cpp's RPC backend).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/rpc_link.h"
#include "ggml-backend.h"
#include "specrpc/status.h"

namespace specrpc {

// Appends every device of every worker ("host:port") to `out`, reached through fresh local links
// (rpc_link.h), which `links` receives: the model loaded on these devices must keep them. Fresh
// each call: llama.cpp keeps one connection per endpoint name while anything of a model uses it,
// so a model reloaded after a lost worker needs new names to get new connections.
// llama.cpp's RPC client aborts the process on an endpoint it cannot parse or reach, so each one
// is checked here first (an RPC handshake within a few seconds): a bad or unreachable worker is
// an error naming it. Fails too when the loaded llama.cpp has no RPC backend (built without GGML_RPC).
Status rpc_devices(const std::vector<std::string> & endpoints, std::vector<ggml_backend_dev_t> & out,
                   std::shared_ptr<RpcLinks> & links);

}  // namespace specrpc
