"""A real HTTP server on loopback answering like an SGLang server, and 0.5.23's own info body.

Shared by the `--sglang-url` tests (tests/sglang/test_server_info.py, test_l3_layout.py).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def write_tiny_model(folder) -> str:
    """A model folder with only a tiny Llama config.json: what SGLang's argument parsing and
    server-info code read (no weights are loaded). Returns its path."""
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))  # fmt: skip
    return str(folder)


def body_0_5_23(argv: list[str], scheduler_info: dict) -> dict:
    """0.5.23's /server_info body for `argv`, as its http_server.py builds it: `build_server_info`
    (the resolved arguments and the scheduler's start-up info) plus the route's own fields, through
    FastAPI's encoder."""
    from fastapi.encoders import jsonable_encoder
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins
    from sglang.version import __version__

    server_args = prepare_server_args(argv)
    server_args.resolve_once()
    scheduler_info = {**scheduler_info, "startup_time": 1.0}
    body = {**build_server_info(server_args, scheduler_info), "startup_time": 1.0, "internal_states": [{}],
            "version": __version__, "frontend": "python"}  # fmt: skip
    return jsonable_encoder(msgspec_to_builtins(redact_watermark_secrets(body)))


class FakeRoutes(BaseHTTPRequestHandler):
    """Answers GET with `server.routes[path]` = (status, content type, body bytes), else 404 HTML."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, kind, body = self.server.routes.get(self.path, (404, "text/html", b"<html>Not Found</html>"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class HttpServer:
    """A real HTTP server on 127.0.0.1 in a thread, serving fixed routes."""

    def __init__(self, routes: dict, handler: type[BaseHTTPRequestHandler] = FakeRoutes):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.routes = routes
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def json_route(body) -> tuple:
    return 200, "application/json", json.dumps(body).encode()
