"""JSON-RPC 2.0 clients for `specrpc serve`: HTTP (POST /rpc, SSE) and stdio (child process).

Both offer call(method, params) -> result (raises RpcError), notify(), batch(), and
stream(method, params) -> Stream: iterate it for the `completion.chunk` data objects; its
`result` holds the final response once iteration ends (or raises the final RpcError).
"""

import http.client
import itertools
import json
import queue
import subprocess
import threading
import urllib.parse


class RpcError(Exception):
    """A JSON-RPC error response: code, message and the optional data object."""

    def __init__(self, code, message, data=None, http_status=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status

    @classmethod
    def from_error(cls, err, http_status=None):
        return cls(err.get("code"), err.get("message"), err.get("data"), http_status)


def json_lines(stream, on_bad=None):
    """The JSON messages of a newline-delimited JSON stream (a `serve --stdio` child's stdout),
    in order, until EOF; blank lines are skipped, a line that is not JSON goes to on_bad(text)."""
    for line in stream:
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except ValueError:
            if on_bad is not None:
                on_bad(line.decode("utf-8", "replace") if isinstance(line, bytes) else line)


def _unwrap(resp):
    if resp is None:
        return None
    if "error" in resp:
        raise RpcError.from_error(resp["error"])
    return resp.get("result")


class Stream:
    """Iterator over streamed chunk data; `result` is the final answer after iteration.

    `close()` stops early: over HTTP it drops the connection, over stdio it sends
    $/cancelRequest; the server cancels the request either way.
    """

    def __init__(self, events, closer=None):
        self._events = events  # generator of ("chunk", data) / ("response", dict)
        self._closer = closer
        self.response = None
        self.chunks = []

    def __iter__(self):
        for kind, payload in self._events:
            if kind == "chunk":
                self.chunks.append(payload)
                yield payload
            else:
                self.response = payload
                return

    @property
    def result(self):
        if self.response is None:
            for _ in self:
                pass
        return _unwrap(self.response)

    def close(self):
        if self._closer:
            self._closer()


class HttpClient:
    """JSON-RPC over HTTP to `specrpc serve` (or REST calls to its llama-server routes)."""

    def __init__(self, url="http://127.0.0.1:8080", api_key=None, timeout=600):
        u = urllib.parse.urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.api_key = api_key
        self.timeout = timeout
        self._ids = itertools.count(1)

    # -- plumbing ------------------------------------------------------------------------------
    def _conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _headers(self, accept="application/json"):
        h = {"Content-Type": "application/json", "Accept": accept}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def request(self, method, path, body=None, headers=None):
        """Plain HTTP request. Returns (status, headers dict, body bytes)."""
        conn = self._conn()
        try:
            data = body if isinstance(body, (bytes, type(None))) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
            conn.request(method, path, body=data, headers=headers if headers is not None else self._headers())
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def _sse(self, path, body, accept="text/event-stream"):
        """Yields the `data:` payloads (strings) of an SSE response; raises RpcError on HTTP errors."""
        conn = self._conn()
        conn.request("POST", path, body=json.dumps(body).encode(), headers=self._headers(accept))
        r = conn.getresponse()
        state = {"conn": conn}

        def events():
            try:
                if r.status != 200 or "text/event-stream" not in (r.getheader("Content-Type") or ""):
                    raw = r.read()
                    try:
                        j = json.loads(raw)
                    except ValueError:
                        raise RpcError(-32603, f"HTTP {r.status}: {raw[:200]!r}", http_status=r.status)
                    if "error" in j:
                        err = j["error"]
                        raise RpcError(err.get("rpc_code", err.get("code")), err.get("message"), err,
                                       http_status=r.status)
                    yield json.dumps(j)
                    return
                while True:
                    line = r.readline()
                    if not line:
                        return
                    line = line.decode("utf-8").rstrip("\r\n")
                    if line.startswith("data:"):
                        yield line[5:].lstrip()
            finally:
                if state["conn"]:
                    state["conn"].close()

        def close():
            c, state["conn"] = state["conn"], None
            if c:
                c.sock and c.sock.close()
                c.close()

        return events(), close

    # -- JSON-RPC --------------------------------------------------------------------------------
    def rpc_raw(self, payload):
        """Sends a request object, batch list or raw string to /rpc; returns the parsed response or None."""
        status, _, body = self.request("POST", "/rpc", payload)
        if status == 204 or not body:
            return None
        return json.loads(body)

    def call(self, method, params=None):
        req = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            req["params"] = params
        return _unwrap(self.rpc_raw(req))

    def notify(self, method, params=None):
        req = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            req["params"] = params
        self.rpc_raw(req)

    def batch(self, calls):
        """calls: [(method, params)] -> list of responses (dicts), in request order."""
        reqs = [{"jsonrpc": "2.0", "id": next(self._ids), "method": m, "params": p} for m, p in calls]
        resp = self.rpc_raw(reqs) or []
        by_id = {r.get("id"): r for r in resp}
        return [by_id.get(r["id"]) for r in reqs]

    def stream(self, method, params):
        """JSON-RPC call with SSE: chunks are the `completion.chunk` notifications' data."""
        params = dict(params, stream=True)
        req = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}
        lines, close = self._sse("/rpc", req)

        def events():
            for data in lines:
                msg = json.loads(data)
                if "method" in msg:
                    yield "chunk", msg.get("params", {}).get("data")
                else:
                    yield "response", msg
                    return

        return Stream(events(), close)

    # -- REST (llama-server compatible) ------------------------------------------------------------
    def rest(self, path, body=None):
        """GET (body None) or POST a REST route; returns parsed JSON (or text); raises RpcError."""
        status, headers, raw = self.request("GET" if body is None else "POST", path, body)
        ctype = headers.get("content-type", "")
        data = json.loads(raw) if "json" in ctype else raw.decode("utf-8")
        if status >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise RpcError(err.get("rpc_code", status), err.get("message", str(data)), err, http_status=status)
        return data

    def rest_stream(self, path, body):
        """POST with stream: true; yields each SSE data object; stops at [DONE]."""
        lines, close = self._sse(path, dict(body, stream=True))
        try:
            for data in lines:
                if data == "[DONE]":
                    return
                yield json.loads(data)
        finally:
            close()

    def health(self):
        return self.rest("/health")

    def completion(self, prompt, **kw):
        return self.call("completion", dict(kw, prompt=prompt))


class StdioClient:
    """JSON-RPC over the stdin/stdout of a child process (newline-delimited JSON)."""

    def __init__(self, cmd, env=None, stderr=None):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                                     bufsize=0)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending = {}  # id -> Queue of ("chunk", data) / ("response", msg)
        self.notifications = queue.Queue()  # notifications nobody waits for
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for msg in json_lines(self.proc.stdout):
            for m in msg if isinstance(msg, list) else [msg]:
                self._route(m)
        with self._lock:  # EOF: wake every waiter
            for q in self._pending.values():
                q.put(("response", {"error": {"code": -32000, "message": "server exited"}}))

    def _route(self, m):
        if "method" in m:
            rid = (m.get("params") or {}).get("id")
            with self._lock:
                q = self._pending.get(json.dumps(rid))
            if q is not None:
                q.put(("chunk", m["params"].get("data")))
            else:
                self.notifications.put(m)
            return
        with self._lock:
            q = self._pending.get(json.dumps(m.get("id")))
        if q is not None:
            q.put(("response", m))
        else:
            self.notifications.put(m)  # e.g. an answer with id null

    def send_raw(self, text):
        """Writes one line as it is (e.g. malformed JSON for tests)."""
        with self._lock:
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()

    def _register(self, rid):
        q = queue.Queue()
        with self._lock:
            self._pending[json.dumps(rid)] = q
        return q

    def _unregister(self, rid):
        with self._lock:
            self._pending.pop(json.dumps(rid), None)

    def request(self, req, timeout=None):
        """Sends a request object; returns the response message (dict)."""
        q = self._register(req["id"])
        try:
            self.send_raw(json.dumps(req))
            while True:
                kind, payload = q.get(timeout=timeout)
                if kind == "response":
                    return payload
        finally:
            self._unregister(req["id"])

    def call(self, method, params=None, timeout=None):
        req = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            req["params"] = params
        return _unwrap(self.request(req, timeout))

    def notify(self, method, params=None):
        req = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            req["params"] = params
        self.send_raw(json.dumps(req))

    def cancel(self, request_id):
        self.notify("$/cancelRequest", {"id": request_id})

    def stream(self, method, params, timeout=None):
        rid = next(self._ids)
        q = self._register(rid)
        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": dict(params, stream=True)}))

        def events():
            try:
                while True:
                    kind, payload = q.get(timeout=timeout)
                    yield kind, payload
                    if kind == "response":
                        return
            finally:
                self._unregister(rid)

        s = Stream(events(), lambda: self.cancel(rid))
        s.id = rid
        return s

    def close(self, timeout=30):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(5)
        self.proc.stdout.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
