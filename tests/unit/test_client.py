"""LlamaClient against a real HTTP server on the loopback (http.server in a thread), not mocks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slotkeeper.core.server import client as client_module
from slotkeeper.core.server.client import (
    MAX_IDLE_CONNECTIONS,
    LlamaClient,
    ServerError,
    ServerUnavailable,
)

SLOTS = [
    {"id": 0, "n_ctx": 512, "is_processing": False, "id_task": None},
    {"id": 1, "n_ctx": 512, "is_processing": True, "id_task": 7, "n_prompt_tokens": 40,
     "next_token": [{"n_decoded": 3}]},
]
PROPS = {"model_path": "/m/tiny.gguf", "total_slots": 2, "build_info": "b1",
         "default_generation_settings": {"n_ctx": 512}, "chat_template": "{{x}}"}


@dataclass
class Seen:
    connection: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeLlama:
    """What the test server answers, and what it was asked."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, str, bytes]] = {}  # path -> (status, content type, body)
        self.delay = 0.0
        self.drop_requests: set[int] = set()  # the Nth request on a connection (1-based): closed unanswered
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.connections = 0

    def answer(self, seen: Seen) -> tuple[int, str, bytes]:
        path = seen.path.split("?")[0]
        if path in self.answers:
            return self.answers[path]
        if path == "/health":
            return 200, "application/json", b'{"status":"ok"}'
        if path == "/slots":
            return 200, "application/json", json.dumps(SLOTS).encode()
        if path == "/props":
            return 200, "application/json", json.dumps(PROPS).encode()
        if path == "/detokenize":
            tokens = json.loads(seen.body)["tokens"]
            return 200, "application/json", json.dumps({"content": " ".join(map(str, tokens))}).encode()
        if path.startswith("/slots/"):
            slot = int(path.rsplit("/", 1)[1])
            filename = json.loads(seen.body or b"{}").get("filename", "")
            return 200, "application/json", json.dumps({
                "id_slot": slot, "filename": filename, "n_saved": 11, "n_written": 2048, "n_restored": 11,
                "n_read": 2048, "n_erased": 5, "timings": {"save_ms": 1.5, "restore_ms": 2.5}}).encode()
        return 404, "text/plain", b"File Not Found"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go out in two writes
    server: LoopbackServer

    def setup(self) -> None:
        super().setup()
        fake = self.server.fake
        with fake.lock:
            fake.connections += 1
            self.connection_id = fake.connections
        self.requests = 0

    def _serve(self) -> None:
        fake = self.server.fake
        self.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        seen = Seen(self.connection_id, self.command, self.path, dict(self.headers), self.rfile.read(length))
        with fake.lock:
            fake.seen.append(seen)
        if self.requests in fake.drop_requests:
            self.close_connection = True
            return
        if fake.delay:
            time.sleep(fake.delay)
        status, content_type, body = fake.answer(seen)
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up waiting
            self.close_connection = True

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


class IdleClosingHandler(Handler):
    timeout = 1.0  # a keep-alive connection idle this long is closed, as llama-server does after 5 s


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1",
                 handler: type[BaseHTTPRequestHandler] = Handler) -> None:
        self.address_family = family
        super().__init__((host, 0), handler)
        self.fake = FakeLlama()
        netloc = f"[{host}]" if ":" in host else host
        self.url = f"http://{netloc}:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


@pytest.fixture
def server():
    srv = LoopbackServer()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with LlamaClient(server.url, timeout=5.0) as c:
        yield c


# -- answers ----------------------------------------------------------------------------------
def test_endpoints_parse_the_servers_json(client, server):
    assert client.health().ok
    props = client.props()
    assert (props.model_path, props.total_slots, props.n_ctx_slot, props.chat_template) == (
        "/m/tiny.gguf", 2, 512, "{{x}}")
    slots = client.slots()
    assert [(s.id, s.is_processing, s.id_task, s.n_prompt_tokens, s.n_decoded) for s in slots] == [
        (0, False, None, 0, 0), (1, True, 7, 40, 3)]
    assert client.detokenize([1, 2, 3]) == "1 2 3"
    detok = server.fake.seen[-1]
    assert detok.method == "POST" and detok.headers["Content-Type"] == "application/json"
    assert json.loads(detok.body) == {"tokens": [1, 2, 3]}


def test_slot_actions_send_the_action_in_the_query_and_the_file_in_the_body(client, server):
    saved = client.save_slot(1, "a b&c.bin")
    assert (saved.slot, saved.filename, saved.n_saved, saved.n_written, saved.save_ms) == (
        1, "a b&c.bin", 11, 2048, 1.5)
    restored = client.restore_slot(0, "x.bin")
    assert (restored.slot, restored.n_restored, restored.n_read, restored.restore_ms) == (0, 11, 2048, 2.5)
    assert client.erase_slot(3) == 5
    seen = server.fake.seen
    assert [(s.method, s.path) for s in seen] == [
        ("POST", "/slots/1?action=save"), ("POST", "/slots/0?action=restore"),
        ("POST", "/slots/3?action=erase")]
    assert [json.loads(s.body) for s in seen] == [{"filename": "a b&c.bin"}, {"filename": "x.bin"}, {}]
    with pytest.raises(ValueError):
        client.erase_slot(-1)
    assert len(seen) == 3


def test_the_api_key_is_sent_as_a_bearer_token(server):
    with LlamaClient(server.url, api_key="s3cret") as c:
        c.slots()
        c.save_slot(0, "f.bin")
    with LlamaClient(server.url) as c:
        c.slots()
    assert [s.headers.get("Authorization")
            for s in server.fake.seen] == ["Bearer s3cret", "Bearer s3cret", None]


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("status, content_type, body, message, error_type", [
    (500, "application/json", b'{"error": {"code": 500, "message": "boom", "type": "server_error"}}',
     "boom", "server_error"),
    (400, "application/json", b'{"error": {"code": 400, "type": "invalid_request_error"}}',
     "Bad Request", "invalid_request_error"),
    (400, "application/json", b'{"error": "slot id out of range"}', "slot id out of range", None),
    (404, "application/json", b'{"detail": "nope"}', '{"detail": "nope"}', None),
    (404, "text/plain", b"File Not Found\n", "File Not Found", None),
    (502, "text/plain", b"", "Bad Gateway", None),
])
def test_error_answers_carry_the_servers_words(client, server, status, content_type, body, message,
                                                error_type):
    server.fake.answers["/slots"] = (status, content_type, body)
    with pytest.raises(ServerError) as caught:
        client.slots()
    assert (caught.value.status, caught.value.message,
            caught.value.error_type) == (status, message, error_type)
    assert str(caught.value) == f"llama-server answered {status}: {message}"
    assert client.props().total_slots == 2  # the connection stays usable after an error


def test_health_tells_loading_from_failing(client, server):
    server.fake.answers["/health"] = (503, "application/json",
                                      b'{"error": {"code": 503, "message": "Loading model", "type": '
                                      b'"unavailable_error"}}')
    health = client.health()
    assert (health.ok, health.loading, health.message) == (False, True, "Loading model")
    server.fake.answers["/health"] = (500, "text/plain", b"broken")
    health = client.health()
    assert (health.ok, health.loading, health.message) == (False, False, "broken")


def test_invalid_json_in_a_success_is_a_server_error(client, server):
    server.fake.answers["/props"] = (200, "application/json", b"{not json")
    with pytest.raises(ServerError, match="invalid JSON from /props"):
        client.props()


def test_nothing_listening_is_unavailable(port):
    with LlamaClient(f"http://127.0.0.1:{port}", timeout=2.0) as c:
        with pytest.raises(ServerUnavailable, match="not answering"):
            c.slots()
        with pytest.raises(ServerUnavailable):  # health() too: the supervisor tells "not up yet" by it
            c.health()


def test_a_slow_answer_times_out_and_is_not_retried(client, server):
    client.slots()  # a pooled connection: a timeout on it must not be taken for a stale one
    server.fake.delay = 1.0
    with LlamaClient(server.url, timeout=0.2, slot_action_timeout=0.3) as quick:
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="timed out"):
            quick.slots()
        with pytest.raises(ServerUnavailable, match="timed out"):
            quick.save_slot(0, "f.bin")  # slot_action_timeout
        assert time.monotonic() - started < 1.8  # not the 2 s the two answers would have taken
    with pytest.raises(ServerUnavailable, match="timed out"):
        client.erase_slot(0, timeout=0.2)  # the call's own timeout
    assert len(server.fake.seen) == 4, "each timed-out request was sent once"
    server.fake.delay = 0.0
    assert client.slots()[1].id_task == 7


def test_a_long_slot_action_waits_past_the_default_timeout(server):
    server.fake.delay = 0.5
    with LlamaClient(server.url, timeout=0.2, slot_action_timeout=5.0) as c:
        assert c.save_slot(0, "f.bin").n_saved == 11


# -- connections ------------------------------------------------------------------------------
def test_requests_reuse_one_keep_alive_connection(client, server):
    for _ in range(5):
        client.slots()
    client.save_slot(0, "f.bin")
    client.detokenize([1])
    assert len(server.fake.seen) == 7
    assert {s.connection for s in server.fake.seen} == {1}


@pytest.mark.parametrize("retry", [True, False], ids=["with-retry", "seen-before-use"])
def test_a_connection_the_server_closed_while_idle_is_replaced(retry, monkeypatch):
    if not retry:  # the closed connection is found out before anything is sent on it
        monkeypatch.setattr(client_module, "_STALE", ())
    idle_closing = LoopbackServer(handler=IdleClosingHandler)
    try:
        with LlamaClient(idle_closing.url, timeout=5.0) as c:
            assert c.slots()
            time.sleep(2.0)  # well past the server's idle close
            assert c.slots()
            assert c.save_slot(0, "f.bin").n_saved == 11
        seen = idle_closing.fake.seen
        assert len(seen) == 3, "nothing was sent on the closed connection"
        assert [s.connection for s in seen] == [1, 2, 2]
    finally:
        idle_closing.stop()


def test_an_idle_connection_is_not_kept_past_the_keep_alive_expiry(client, server, monkeypatch):
    monkeypatch.setattr(client_module, "KEEPALIVE_EXPIRY", 1.0)  # back-to-back calls stay well within
    client.slots()
    time.sleep(1.5)
    client.slots()
    client.slots()
    assert [s.connection for s in server.fake.seen] == [1, 2, 2]


def test_a_reused_connection_closed_as_the_request_went_out_is_retried_once_on_a_new_one(client, server):
    client.slots()
    server.fake.drop_requests = {2}  # the server closes the connection on its 2nd request, unanswered
    assert client.save_slot(0, "f.bin").n_saved == 11
    assert [(s.connection, s.path) for s in server.fake.seen] == [
        (1, "/slots"), (1, "/slots/0?action=save"), (2, "/slots/0?action=save")]


def test_a_new_connection_closed_unanswered_is_not_retried(client, server):
    server.fake.drop_requests = {1}
    with pytest.raises(ServerUnavailable, match="not answering"):
        client.slots()
    assert len(server.fake.seen) == 1


def test_a_server_that_closes_after_each_answer(server):
    class OneShot(Handler):
        protocol_version = "HTTP/1.0"

    one_shot = LoopbackServer(handler=OneShot)
    try:
        with LlamaClient(one_shot.url) as c:
            for _ in range(3):
                assert c.slots()
        assert [s.connection for s in one_shot.fake.seen] == [1, 2, 3]
    finally:
        one_shot.stop()


def test_eight_threads_share_one_client(client, server):
    server.fake.delay = 0.002
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        try:
            start.wait()
            for i in range(25):
                assert client.detokenize([n, i]) == f"{n} {i}"
                assert len(client.slots()) == 2
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(server.fake.seen) == 8 * 50
    connections = {s.connection for s in server.fake.seen}
    assert 1 < len(connections) <= 8 * 50 // 2, "connections were used concurrently, and reused"
    assert len(client._idle) <= MAX_IDLE_CONNECTIONS


def test_ipv6_loopback_url():
    try:
        v6 = LoopbackServer(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        with LlamaClient(v6.url) as c:
            assert v6.url.startswith("http://[::1]:")
            assert c.props().total_slots == 2
        assert v6.fake.seen[0].headers["Host"] == f"[::1]:{v6.server_address[1]}"
    finally:
        v6.stop()


def test_close_drops_the_idle_connections_and_later_requests_still_work(server):
    c = LlamaClient(server.url)
    c.slots()
    c.close()
    assert c.slots()  # on a connection of its own
    assert {s.connection for s in server.fake.seen} == {1, 2}
    assert not c._idle


# -- import cost ------------------------------------------------------------------------------
def test_the_client_and_the_engine_do_not_import_httpx():
    """httpx (and what it drags in: click, rich, pygments in a dev install) costs megabytes and a
    noticeable part of start-up; only the Hub download (imported when one starts) uses it."""
    code = ("import sys, slotkeeper.core.server.client, slotkeeper.core.engine.engine, "
            "slotkeeper.cli.commands, slotkeeper.cli.run, "
            "slotkeeper.cli.models; "
            "print(sorted(m for m in ('httpx', 'httpx2', 'huggingface_hub', "
            "'slotkeeper.core.model.hub_download') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
