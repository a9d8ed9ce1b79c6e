"""specrpc Python client (standard library only).

- specrpc.capi.Library: ctypes bindings of libspecrpc (the legacy C ABI and specrpc_rpc).
- specrpc.client.HttpClient: JSON-RPC 2.0 over HTTP (POST /rpc, SSE streaming) and the REST routes.
- specrpc.client.StdioClient: JSON-RPC 2.0 with a `specrpc serve --stdio` child process.
"""

from .client import HttpClient, RpcError, StdioClient, Stream

__all__ = ["HttpClient", "StdioClient", "Stream", "RpcError", "Library"]
__version__ = "0.1.0"


def __getattr__(name):  # Library loads ctypes lazily
    if name == "Library":
        from .capi import Library

        return Library
    raise AttributeError(name)
