#include "engine/rpc_devices.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "engine/backend.h"

namespace specrpc {

namespace {

constexpr int kConnectTimeoutMs = 3000;

// "host:port" as llama.cpp's RPC client splits it (at the first ':').
bool split_endpoint(const std::string & ep, std::string & host, std::string & port) {
    const size_t colon = ep.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= ep.size()) return false;
    host = ep.substr(0, colon);
    port = ep.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
    const long n = std::strtol(port.c_str(), nullptr, 10);
    return n >= 1 && n <= 65535;
}

// Empty when a TCP connection to host:port opens within the timeout, else why not.
std::string try_connect(const std::string & host, const std::string & port) {
    addrinfo hints{};
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res    = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) return gai_strerror(rc);
    std::string why = "no address";
    for (addrinfo * a = res; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            why = std::strerror(errno);
            continue;
        }
        int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            const int n = ::poll(&p, 1, kConnectTimeoutMs);
            socklen_t len = sizeof err;
            if (n == 0) err = ETIMEDOUT;
            else if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        ::close(fd);
        if (err == 0) {
            ::freeaddrinfo(res);
            return "";
        }
        why = std::strerror(err);
    }
    ::freeaddrinfo(res);
    return why;
}

}  // namespace

Status rpc_devices(const std::vector<std::string> & endpoints, std::vector<ggml_backend_dev_t> & out) {
    backend_init();
    for (const std::string & ep : endpoints) {
        std::string host, port;
        if (!split_endpoint(ep, host, port))
            return invalid_arg("RPC worker '" + ep + "' is not HOST:PORT", "rpc");
        if (std::string why = try_connect(host, port); !why.empty())
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
    for (const std::string & ep : endpoints) {
        ggml_backend_reg_t reg = add(ep.c_str());
        const size_t n = reg ? ggml_backend_reg_dev_count(reg) : 0;
        if (n == 0) return Status(ErrorCode::LOAD_FAILED, "RPC worker " + ep + " offers no device");
        for (size_t i = 0; i < n; ++i) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            SPR_LOG_INFO("RPC worker %s: device %s (%s)", ep.c_str(), ggml_backend_dev_name(dev),
                         ggml_backend_dev_description(dev));
            out.push_back(dev);
        }
    }
    return Status::ok();
}

}  // namespace specrpc
