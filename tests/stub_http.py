"""A quiet local HTTP server for tests that need one small endpoint (a JWKS, a discovery document,
a counting EHR): the JSON answer and the server's thread, written once."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    def send_json(self, data, content_type: str = "application/json", status: int = 200) -> None:
        body = data if isinstance(data, bytes) else json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(handler: type[BaseHTTPRequestHandler], wrap=None) -> ThreadingHTTPServer:
    """The handler served on a free loopback port from a daemon thread; `wrap` may wrap its
    socket (TLS) before it serves."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if wrap is not None:
        server.socket = wrap(server.socket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
