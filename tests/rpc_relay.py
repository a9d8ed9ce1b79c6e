"""A TCP relay that adds latency, for llama.cpp RPC workers on loopback where `tc netem` is not
available: every chunk is forwarded `delay_ms / 2` after it arrived, in each direction, so a round
trip costs `delay_ms` more while bandwidth is unchanged. Used by tests/test_rpc.py and
bench/rpc_bench.sh (`python3 tests/rpc_relay.py LISTEN_PORT TARGET_PORT DELAY_MS`)."""

import collections
import socket
import sys
import threading
import time


class Relay:
    def __init__(self, target_port, delay_ms, listen_port=0):
        self.target_port = target_port
        self.half = delay_ms / 2000.0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                c.close()
                continue
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns += [c, u]
            self._pipe(c, u)
            self._pipe(u, c)

    def _pipe(self, src, dst):
        q = collections.deque()
        cv = threading.Condition()

        def read():
            while True:
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    data = b""
                with cv:
                    q.append((time.monotonic() + self.half, data))
                    cv.notify()
                if not data:
                    return

        def write():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    for s in (dst, src):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self):
        self.sock.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


if __name__ == "__main__":
    r = Relay(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[1]))
    print("relay 127.0.0.1:%d -> %s, +%s ms round trip" % (r.port, sys.argv[2], sys.argv[3]), file=sys.stderr, flush=True)
    threading.Event().wait()
