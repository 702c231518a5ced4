#!/usr/bin/env python3
"""A fake OpenAI-compatible completions server for tests of `moetier bench
--endpoint`: streams max_tokens server-sent events (one token each, DELAY
seconds apart) and a usage event, chunked. Writes its port to PORTFILE.
POST /fail answers 500. Usage: fake_openai.py PORTFILE [DELAY]"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.002


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/fail") or body.get("model") == "fail":
            msg = b'{"error": "no such model"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        n = int(body["max_tokens"])
        prompt = body["prompt"]
        if body.get("stream") is False:
            msg = json.dumps({"choices": [{"text": "".join(" t%d" % i for i in range(n))}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg.encode())
            return
        plen = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(DELAY * 5)  # "prefill"
        for i in range(n):
            ev = {"choices": [{"index": 0, "text": " t%d" % i}]}
            self.chunk("data: %s\n\n" % json.dumps(ev))
            time.sleep(DELAY)
        usage = {"choices": [], "usage": {"prompt_tokens": plen, "completion_tokens": n}}
        self.chunk("data: %s\n\ndata: [DONE]\n\n" % json.dumps(usage))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
