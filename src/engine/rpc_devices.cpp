#include "engine/rpc_devices.h"

#include "common/log.h"
#include "engine/backend.h"

namespace specrpc {

namespace {
constexpr int kHandshakeTimeoutMs = 3000;
}  // namespace

Status rpc_devices(const std::vector<std::string> & endpoints, std::vector<ggml_backend_dev_t> & out,
                   std::shared_ptr<RpcLinks> & links) {
    backend_init();
    for (const std::string & ep : endpoints) {
        std::string host, port;
        if (!rpc_split_endpoint(ep, host, port))
            return invalid_arg("RPC worker '" + ep + "' is not HOST:PORT", "rpc");
        if (std::string why = rpc_hello(ep, kHandshakeTimeoutMs); !why.empty())
            return Status(ErrorCode::LOAD_FAILED, "cannot reach RPC worker " + ep + ": " + why +
                                                      " (is llama.cpp's rpc-server running there?)");
    }
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc)
        return Status(ErrorCode::LOAD_FAILED, "this llama.cpp has no RPC backend (build it with GGML_RPC=ON, "
                                              "as scripts/build_llama.sh does)");
    using AddServer = ggml_backend_reg_t (*)(const char *);
    auto add = reinterpret_cast<AddServer>(ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server"));
    if (!add) return Status(ErrorCode::LOAD_FAILED, "llama.cpp's RPC backend lacks ggml_backend_rpc_add_server");
    auto opened = RpcLinks::open(endpoints);
    if (!opened) return opened.status();
    links = opened.value();
    for (size_t w = 0; w < endpoints.size(); ++w) {
        const std::string & ep = endpoints[w];
        ggml_backend_reg_t reg = add(links->local_endpoints()[w].c_str());
        if (Status st = links->status(); !st) return st;
        const size_t n = reg ? ggml_backend_reg_dev_count(reg) : 0;
        if (n == 0) return Status(ErrorCode::LOAD_FAILED, "RPC worker " + ep + " offers no device");
        for (size_t i = 0; i < n; ++i) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            SPR_LOG_INFO("RPC worker %s (local link %s): device %s", ep.c_str(), links->local_endpoints()[w].c_str(),
                         ggml_backend_dev_name(dev));
            out.push_back(dev);
        }
    }
    return Status::ok();
}

}  // namespace specrpc
