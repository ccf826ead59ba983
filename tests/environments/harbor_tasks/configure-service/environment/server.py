"""A tiny health-check service configured by /app/server.ini ([server] port, token)."""

import configparser
import http.server

config = configparser.ConfigParser()
config.read("/app/server.ini")
port = config.getint("server", "port")
token = config.get("server", "token", fallback="")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/health" and token and self.headers.get("X-Token") == token
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(b"ok" if ok else b"denied")

    def log_message(self, format: str, *args: object) -> None:
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
