#!/usr/bin/env python3
"""Serves the dashboard preview: the page (this directory), the dashboard JSON at
/dashboard.json, and Prometheus's HTTP API at /api/v1/* (proxied, so the page needs no CORS).

  server.py --port 8080 --prometheus http://127.0.0.1:9090 --dashboard deploy/grafana/dashboards/onebit.json

Python's standard library only.
"""
import argparse
import http.server
import os
import urllib.error
import urllib.request


def make_handler(root, dashboard, prometheus):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=root, **kwargs)

        def log_message(self, fmt, *args):  # quiet
            pass

        def do_GET(self):
            if self.path == "/dashboard.json":
                with open(dashboard, "rb") as f:
                    body = f.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if self.path.startswith("/api/v1/"):
                try:
                    with urllib.request.urlopen(prometheus + self.path, timeout=30) as r:
                        body, status = r.read(), r.status
                except urllib.error.HTTPError as e:
                    body, status = e.read(), e.code
                except Exception as e:  # Prometheus down: say so to the page
                    body, status = ('{"status":"error","error":"%s"}' % e).encode(), 502
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--dashboard", required=True)
    a = p.parse_args()
    root = os.path.dirname(os.path.abspath(__file__))
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", a.port), make_handler(root, os.path.abspath(a.dashboard), a.prometheus))
    server.serve_forever()


if __name__ == "__main__":
    main()
