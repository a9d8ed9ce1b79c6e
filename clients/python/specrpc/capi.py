"""ctypes bindings of libspecrpc (specrpc.h): the existing rpcserver library's functions (exported
as specrpc_init, specrpc_tokenize, ...; librpcserver has them under their old names) and the
JSON-RPC entry point. The legacy functions keep the existing rpcserver library's conventions: init()
returns 0 on success and 1 on failure, poll_system_status()'s "init_success" is 1 / 0 / -1,
tokenize() returns the pieces as strings. Every string the library returns is malloc'd and the
caller's: it is copied into Python and released at once with free() (specrpc_free is the same).
"""

import ctypes
import json
import os
import queue
import threading

from .client import RpcError, Stream, _unwrap

_NOTIFY = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)


def _arg(x):
    if x is None:
        return None
    if isinstance(x, (dict, list)):
        x = json.dumps(x)
    return x.encode("utf-8") if isinstance(x, str) else x


class Library:
    """One loaded libspecrpc (one engine per process, shared by every Library on the same file)."""

    def __init__(self, path=None):
        path = path or os.environ.get("SPECRPC_LIB") or "libspecrpc.so"
        self._lib = lib = ctypes.CDLL(path)
        # the existing library's functions, exported by libspecrpc as specrpc_<name>
        self._legacy = legacy = {}
        for name, args, res in (("poll_system_status", [], ctypes.c_void_p),
                                ("tokenize", [ctypes.c_char_p], ctypes.c_void_p),
                                ("get_completion", [ctypes.c_char_p], ctypes.c_void_p),
                                ("async_completion_init", [ctypes.c_char_p], ctypes.c_void_p),
                                ("async_completion_poll", [ctypes.c_char_p], ctypes.c_void_p),
                                ("async_completion_cancel", [ctypes.c_char_p], ctypes.c_void_p),
                                ("init", [ctypes.c_char_p], ctypes.c_int),
                                ("init_async", [ctypes.c_char_p], None),
                                ("deinit", [], None)):
            fn = getattr(lib, "specrpc_" + name)
            fn.argtypes, fn.restype = args, res
            legacy[name] = fn
        lib.specrpc_rpc.argtypes = [ctypes.c_char_p]
        lib.specrpc_rpc.restype = ctypes.c_void_p
        lib.specrpc_rpc_stream.argtypes = [ctypes.c_char_p, _NOTIFY, ctypes.c_void_p]
        lib.specrpc_rpc_stream.restype = ctypes.c_void_p
        lib.specrpc_free.argtypes = [ctypes.c_void_p]
        lib.specrpc_free.restype = None
        lib.specrpc_version.argtypes = []
        lib.specrpc_version.restype = ctypes.c_char_p
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()

    def _take(self, ptr):
        """Copies a returned string and releases it; None for NULL."""
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8")
        finally:
            self._lib.specrpc_free(ptr)

    def _json(self, ptr):
        s = self._take(ptr)
        return None if s is None else json.loads(s)

    # -- legacy ABI --------------------------------------------------------------------------------
    def version(self):
        return self._lib.specrpc_version().decode()

    def init(self, cmd):
        """cmd: a command line ("-m PATH -c 512 ...") or a dict/JSON with the same keys.
        Returns the library's code: 0 on success, 1 on failure (why: poll_system_status()["error"])."""
        return self._legacy["init"](_arg(cmd))

    def wait_loaded(self, timeout=60.0, interval=0.01):
        """After init_async: polls poll_system_status until init_success is 1 (True) or -1 (False)."""
        import time

        deadline = time.time() + timeout
        while True:
            st = self.poll_system_status()
            if st["init_success"] != 0 or time.time() > deadline:
                return st["init_success"] == 1
            time.sleep(interval)

    def init_async(self, cmd):
        self._legacy["init_async"](_arg(cmd))

    def poll_system_status(self):
        return self._json(self._legacy["poll_system_status"]())

    def tokenize(self, text_or_req):
        """{"tokens": [piece, ...] (BOS included), "ids": [id, ...], "length": N, "success": True}"""
        req = {"text": text_or_req} if isinstance(text_or_req, str) else text_or_req
        return self._json(self._legacy["tokenize"](_arg(req)))

    def get_completion(self, req):
        return self._json(self._legacy["get_completion"](_arg(req)))

    def async_completion_init(self, req):
        return self._json(self._legacy["async_completion_init"](_arg(req)))

    def async_completion_poll(self, request_id=None):
        return self._json(self._legacy["async_completion_poll"](_arg({} if request_id is None else {"request_id": request_id})))

    def async_completion_cancel(self, request_id=None):
        return self._json(self._legacy["async_completion_cancel"](_arg({} if request_id is None else {"request_id": request_id})))

    def deinit(self):
        self._legacy["deinit"]()

    def raw(self, fn_name, arg):
        """Calls a legacy function with raw bytes/str (tests: malformed input). Returns the text."""
        return self._take(self._legacy[fn_name](_arg(arg)))

    # -- JSON-RPC ABI ------------------------------------------------------------------------------
    def rpc_raw(self, request):
        """One request/batch (dict, list or raw string); returns the parsed response or None."""
        return self._json(self._lib.specrpc_rpc(_arg(request)))

    def _next_id(self):
        with self._id_lock:
            return next(self._ids)

    def call(self, method, params=None):
        req = {"jsonrpc": "2.0", "id": self._next_id(), "method": method}
        if params is not None:
            req["params"] = params
        return _unwrap(self.rpc_raw(req))

    def rpc_stream_raw(self, request, on_notification):
        """specrpc_rpc_stream: on_notification(dict) runs on the calling thread."""
        cb = _NOTIFY(lambda s, _user: on_notification(json.loads(s.decode("utf-8"))))
        return self._json(self._lib.specrpc_rpc_stream(_arg(request), cb, None))

    def stream(self, method, params):
        """Streams a call: iterate for the chunk data; `.result` is the final answer. The call runs on
        a helper thread; `close()` cancels it with $/cancelRequest."""
        rid = "capi-%d" % self._next_id()
        q = queue.Queue()
        req = {"jsonrpc": "2.0", "id": rid, "method": method, "params": dict(params, stream=True)}

        def run():
            try:
                resp = self.rpc_stream_raw(req, lambda n: q.put(("chunk", n.get("params", {}).get("data"))))
            except Exception as e:  # noqa: BLE001 - forwarded to the reader
                resp = {"error": {"code": -32603, "message": str(e)}}
            q.put(("response", resp))

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def events():
            while True:
                kind, payload = q.get()
                yield kind, payload
                if kind == "response":
                    t.join()
                    return

        return Stream(events(), lambda: self.call("$/cancelRequest", {"id": rid}))


__all__ = ["Library", "RpcError"]
