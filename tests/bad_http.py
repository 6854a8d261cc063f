"""A real HTTP server that answers badly, for tests/sinks/test_mlflow_server.py:
``python bad_http.py <port> <mode file>``. Each request reads the mode file:

- ``500``: answers 500 (as a proxy in front of a restarting MLflow);
- ``reset``: reads the request and resets the connection;
- ``hang``: reads the request and never answers;
- ``forward <url>``: forwards the request to ``<url>`` (a real ``mlflow
  server``) and returns its answer: the server is well again.

It prints ``ready`` once it listens, and runs until killed."""

from __future__ import annotations

import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        mode = MODE.read_text().strip()
        if mode == "500":
            self._answer(500, b'{"error_code": "INTERNAL_ERROR", "message": "bad"}')
        elif mode == "reset":
            # SO_LINGER 0: close() sends RST, a "connection reset by peer".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        elif mode == "hang":
            time.sleep(3600)
        else:
            url = mode.split()[1] + self.path
            request = urllib.request.Request(url, data=body or None, method=self.command)
            request.add_header("Content-Type", self.headers.get("Content-Type", "application/json"))
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    self._answer(reply.status, reply.read())
            except urllib.error.HTTPError as err:
                self._answer(err.code, err.read())

    def _answer(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _any


if __name__ == "__main__":
    MODE = Path(sys.argv[2])
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()
