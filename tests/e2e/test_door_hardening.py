"""The front door against a real llama-server, tried as a hostile local user or a misbehaving
client would: path spellings, keys, bodies, vanishing clients, a crash mid-conversation. Each test
fails without the rule it names."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time

import httpx
import pytest
from e2e_helpers import (
    LONG_FIRST_TURN,
    USER_TURNS,
    EventLog,
    assert_it_answers,
    converse,
    make_engine,
    wait_until,
)

from slotkeeper.core import events as ev
from slotkeeper.core.engine.door import frontdoor
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

KEY = "door-key-1"


def raw_request(port: int, method: str, target: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with its target sent exactly as written (no client normalises it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if body is not None:
            hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def private(engine) -> httpx.Client:
    url, key = engine.link.upstream()
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


SLOT_ACTION_SPELLINGS = [
    "/slots/0?action={a}", "/./slots/0?action={a}", "/v1/../slots/0?action={a}", "/%2e/slots/0?action={a}",
    "/%2E%2E/slots/0?action={a}", "//slots//0?action={a}", "/x/%2e%2e/slots/%30?action={a}",
    "http://127.0.0.1:1/slots/0?action={a}", "HTTP://evil/./slots/0?action={a}", "/slots%2f0?action={a}",
    "/slots/0/?action={a}", "/slots/7?action={a}",
]


def test_no_spelling_of_the_slot_files_or_lora_reaches_llama_server(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, first = converse(engine.base_url, USER_TURNS[:2], max_tokens=8)
        before = set(os.listdir(engine.library.store.dir))
        for spelling in SLOT_ACTION_SPELLINGS:
            for action, body in (("save", {"filename": "x.kv"}), ("erase", {}),
                                 ("restore", {"filename": "x.kv"})):
                target = spelling.format(a=action)
                status, _h, data = raw_request(port, "POST", target, json.dumps(body).encode())
                assert status in (400, 403), (target, status, data)
                assert json.loads(data)["error"]["code"] == status
        for target in ("/lora-adapters", "/./lora-adapters", "/v1/../lora-adapters", "/%6cora-adapters",
                       "http://h/lora-adapters"):
            status, _h, _d = raw_request(port, "POST", target, b'[{"id": 0, "scale": 0.5}]')
            assert status in (400, 403), target
        assert set(os.listdir(engine.library.store.dir)) == before, "no file written into the sessions folder"
        # Nothing was erased either: the conversation's next turn still comes from its slot.
        history.append({"role": "user", "content": USER_TURNS[2]})
        r = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=60,
                       json={"messages": history, "max_tokens": 4, "temperature": 0}).json()
        assert r["timings"]["cache_n"] >= first["timings"]["cache_n"] + first["timings"]["prompt_n"] - 1
    finally:
        engine.stop(save=False)


def test_generation_on_another_spelling_is_routed_and_saves_what_it_replaces(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, USER_TURNS[:2], max_tokens=8)  # conversation A, unsaved, in slot 0
        body = json.dumps({"prompt": "A different conversation about sailing boats and harbours.",
                           "n_predict": 4}).encode()
        status, _h, data = raw_request(port, "POST", "/./v1/../completion", body)
        assert status == 200, data
        wait_until(lambda: [s for s in events.of(ev.SessionSaved)
                            if s.reason == "before switching conversations"],
                   what="A saved before the request took its slot (its commit follows the request)")
        wait_until(lambda: len(events.of(ev.RequestDone)) == 3, what="the routed request recorded")
    finally:
        engine.stop(save=False)


def test_llama_servers_key_rules_at_the_door(llama_model, server_bin, port, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"# the door's keys\n{KEY}\nsecond-key\n")
    engine = make_engine(llama_model, server_bin, port, idle_save=3600,
                         extra_args=("--api-key-file", str(keyfile)))
    engine.start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert engine.wait_ready(60) is ServerState.READY
        good = {"Authorization": f"Bearer {KEY}"}
        # GET variants of protected paths need the key like the plain ones.
        for method, target in [("GET", "/props"), ("GET", "/./props"), ("GET", "/x/../slots"),
                               ("GET", "/./metrics"), ("HEAD", "/./slots"), ("GET", "/%73lots"),
                               ("GET", "/no/such/path")]:
            status, headers, _d = raw_request(port, method, target)
            assert status == 401, (method, target, status)
            assert "server" not in headers  # no framework banner, as llama-server sends none
        assert raw_request(port, "GET", "/./props", headers=good)[0] == 200
        assert raw_request(port, "GET", "/props", headers={"X-Api-Key": "second-key"})[0] == 200
        assert raw_request(port, "GET", "/props",
                           headers={"Authorization": "Bearer # the door's keys"})[0] == 401
        status, _h, data = raw_request(port, "GET", "/no/such/path", headers=good)
        assert status == 404 and json.loads(data)["error"] == {"code": 404, "message": "File Not Found",
                                                               "type": "not_found_error"}
        # The user did not ask for --metrics: clients get llama-server's own answer; /slots is on.
        assert raw_request(port, "GET", "/metrics", headers=good)[0] == 501
        assert raw_request(port, "GET", "/slots", headers=good)[0] == 200
        assert httpx.get(f"{url}/health").status_code == 200  # public, as upstream
        # A browser's CORS preflight is answered without the key, as llama-server answers it.
        pre = httpx.options(f"{url}/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                                   "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200 and pre.headers.get("access-control-allow-origin")
        # The key file emptied, then gone: the door shuts (503, saying why), never opens.
        keyfile.write_text("")
        r = httpx.get(f"{url}/props", headers=good)
        assert (r.status_code == 503 and "holds no key" in r.json()["error"]["message"]
                and r.headers["retry-after"])
        assert httpx.get(f"{url}/props").status_code == 503
        keyfile.unlink()
        r = httpx.get(f"{url}/props")
        assert r.status_code == 503 and "cannot be read" in r.json()["error"]["message"]
        # Back with a new key: that key works at once, the old one no more.
        keyfile.write_text("rotated\n")
        assert httpx.get(f"{url}/props", headers={"Authorization": "Bearer rotated"}).status_code == 200
        assert httpx.get(f"{url}/props", headers=good).status_code == 401
    finally:
        engine.stop(save=False)


def test_a_comma_list_of_keys_as_in_llama_server_and_no_slots_honoured(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600,
                         extra_args=("--api-key", "k1,k2", "--no-slots", "--metrics"))
    engine.start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for k in ("k1", "k2"):
            assert httpx.get(f"{url}/props", headers={"Authorization": f"Bearer {k}"}).status_code == 200
        assert httpx.get(f"{url}/props", headers={"Authorization": "Bearer k1,k2"}).status_code == 401
        r = httpx.get(f"{url}/slots", headers={"Authorization": "Bearer k1"})
        assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer k1"}).status_code == 200
        with private(engine) as p:
            assert p.get("/slots").status_code == 200  # Slotkeeper's own view stays
    finally:
        engine.stop(save=False)


def test_a_missing_key_file_at_launch_shuts_the_door(llama_model, server_bin, port, tmp_path):
    engine = make_engine(llama_model, server_bin, port, extra_args=("--api-key-file", str(tmp_path / "nope")))
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        r = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 1})
        assert r.status_code == 503 and "cannot be read" in r.json()["error"]["message"]
    finally:
        engine.stop(save=False)


def test_listening_beyond_loopback_without_a_key_is_refused(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, host="0.0.0.0")
    try:
        with pytest.raises(Exception, match="without an API key"):
            engine.start()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "nothing listens"
    finally:
        engine.stop(save=False)


def test_bodies_are_bounded_and_refused_before_they_are_read(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n{" % (frontdoor.MAX_BODY_BYTES + 1))
            s.settimeout(10)
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 413"), head[:100]
        for body, why in [(b'{"prompt": [1, 1099511627776], "n_predict": 1}', "out of range"),
                          (b'{"prompt": "x", "id_slot": NaN}', "NaN"),
                          (b"[" * 100000 + b"]" * 100000, "nested too deeply"), (b"[1, 2]", "JSON object"),
                          (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested too deeply")]:
            status, _h, data = raw_request(port, "POST", "/completion", body)
            assert status == 400 and why in json.loads(data)["error"]["message"], (status, data[:200])
    finally:
        engine.stop(save=False)


def test_a_non_streamed_request_whose_client_leaves_is_stopped(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=8192)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        body = json.dumps({"prompt": "Once upon a time", "n_predict": 6000, "ignore_eos": True}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(1.0)
        left = time.monotonic()
        with private(engine) as p:
            while p.get("/slots").json()[0]["is_processing"]:  # polled slowly: llama-server's own rhythm
                # A bound for a machine under any load; what proves the stop is the count below.
                assert time.monotonic() - left < 240, "still generating for a client that left"
                time.sleep(1.5)
            metrics = p.get("/metrics").text
        # Stopped, not finished: llama-server alone would have generated all 6,000 tokens for nobody.
        [decoded] = [float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("llamacpp:tokens_predicted_total")]
        assert 0 < decoded < 6000, decoded
    finally:
        engine.stop(save=False)


def test_a_request_during_a_restart_after_a_crash_gets_retry_after_then_its_conversation_back(
        llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=0.2)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, before = converse(engine.base_url, USER_TURNS[:2], max_tokens=8)
        wait_until(lambda: events.of(ev.SessionSaved), what="the idle save")
        os.kill(engine.supervisor.pid, signal.SIGKILL)
        wait_until(lambda: engine.state is not ServerState.READY, what="the crash seen")
        history.append({"role": "user", "content": USER_TURNS[2]})
        r = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=60,
                       json={"messages": history, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
        assert "restarted" in r.json()["error"]["message"]
        wait_until(lambda: engine.state is ServerState.READY and engine.snapshot.ready, timeout=60,
                   what="the restart")
        r = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=60,
                       json={"messages": history, "max_tokens": 4, "temperature": 0}).json()
        t, b = r["timings"], before["timings"]
        assert t["cache_n"] >= b["cache_n"] + b["prompt_n"], t  # the whole conversation restored, not re-read
        assert not [w for w in events.of(ev.WarningRaised) if "reuse" in w.message]
    finally:
        engine.stop(save=False)


def test_too_many_requests_at_once_get_retry_after(llama_model, server_bin, port, monkeypatch):
    monkeypatch.setattr(frontdoor, "MAX_IN_FLIGHT", 1)
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        with socket.create_connection(("127.0.0.1", port)) as held:  # a body that arrives slowly
            held.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            wait_until(lambda: engine.front._in_flight == 1, what="the first request held")
            r = httpx.get(f"{engine.base_url}/props")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert httpx.get(f"{engine.base_url}/props").status_code == 200
    finally:
        engine.stop(save=False)


def test_llama_server_killed_during_an_on_demand_restore_gives_a_503_with_the_reason(
        llama_model, server_bin, port, monkeypatch):
    from slotkeeper.core.server.client import LlamaClient

    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        a, _r = converse(engine.base_url, [LONG_FIRST_TURN, USER_TURNS[1]], max_tokens=8)
        converse(engine.base_url, ["A different conversation about ships in the harbour at night."],
                 max_tokens=8)
        wait_until(lambda: events.of(ev.SessionSaved), what="A saved as B took its slot")
        real = LlamaClient.restore_slot

        def killed_first(self, *args, **kwargs):  # llama-server dies while the restore is under way
            os.kill(engine.supervisor.pid, signal.SIGKILL)
            time.sleep(0.3)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(LlamaClient, "restore_slot", killed_first)
        a.append({"role": "user", "content": USER_TURNS[2]})
        r = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=60,
                       json={"messages": a, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
        assert "llama-server" in r.json()["error"]["message"]
    finally:
        engine.stop(save=False)


def test_a_session_whose_slot_went_on_with_another_conversation_can_be_deleted(llama_model, server_bin, port):
    """The in-slot guard keeps what a slot holds; a slot that moved on to another conversation no
    longer holds its old session, which can then be deleted (to free a full disk, say)."""
    from slotkeeper.core.services.sessions import SessionInUse

    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, USER_TURNS[:2], max_tokens=8)
        a = engine.save_slot(0)
        with pytest.raises(SessionInUse):
            engine.sessions.delete(a.id)
        converse(engine.base_url, ["Something else entirely: the price of apples in the autumn market."],
                 max_tokens=8)
        wait_until(lambda: engine.snapshot.slots and engine.snapshot.slots[0].detached,
                   what="the slot moved on")
        engine.sessions.delete(a.id)
        assert not [e for e in engine.sessions.listing().sessions if e.id == a.id]
    finally:
        engine.stop(save=False)


def test_an_answer_http_forbids_is_never_a_bare_500_and_the_door_stays_open(llama_model, server_bin, port):
    """llama-server's MCP proxy relays a 204 No Content with a chunked body, which HTTP forbids.
    Whether the body's terminator reaches the door in the same packet as the headers is up to the
    network stack: if it does, the door's strict parser cannot read the answer and says so (502);
    if not, the 204 is complete without it and is passed on as it is. Never a bare 500, and the
    door goes on answering."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NoContent(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's name is http.server's
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), NoContent)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, extra_args=("--ui-mcp-proxy",))
    engine.start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert engine.wait_ready(60) is ServerState.READY
        r = httpx.post(f"{url}/cors-proxy?url=http://127.0.0.1:{target.server_port}/", json={}, timeout=60)
        assert r.status_code in (204, 502), r.text
        if r.status_code == 502:
            assert "could not be read" in r.json()["error"]["message"]
        else:
            assert r.content == b""
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        assert_it_answers(url)
    finally:
        engine.stop(save=False)
        target.shutdown()
        target.server_close()


def test_bodies_passed_through_are_read_first_so_llama_server_survives_them(llama_model, server_bin, port):
    """A body nested 200,000 levels deep overflows the stack of llama-server's recursive JSON parser
    (SIGSEGV: the supervisor restarts it, and after a few such crashes gives up). The door reads
    every body llama-server would parse, token counts included, as it reads a generation body: the
    deep one is 400 at the door, and llama-server runs on under the same pid."""
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        pid = engine.supervisor.pid
        deep = b"[" * 200_000 + b"]" * 200_000
        body = (b'{"model": "local", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], '
                b'"input": "hi", "content": "hi", "metadata": {"user_id": ' + deep + b"}}")
        for _ in range(5):
            for path in ("/v1/messages/count_tokens", "/v1/responses/input_tokens"):
                status, _h, data = raw_request(port, "POST", path, body)
                assert status == 400 and "nested too deeply" in json.loads(data)["error"]["message"], data
        json_paths = [path for (method, path), ep in frontdoor.endpoints.ENDPOINTS.items()
                      if method == "POST" and ep.json_body]
        assert {"/v1/messages/count_tokens", "/v1/responses/input_tokens", "/tokenize"} <= set(json_paths)
        for path in json_paths:
            status, _h, data = raw_request(port, "POST", path, body)
            assert status == 400, (path, status, data[:200])
        for path, bad, why in [("/tokenize", b'{"content": "\\ud800"}', "lone surrogate"),
                               ("/tokenize", b'{"content": "a", "x": 1e400}', "overflows"),
                               ("/v1/messages/count_tokens", b'{"messages": [}', "not valid JSON"),
                               ("/tokenize", b'{"content": "\xff"}', "not valid JSON")]:
            status, _h, data = raw_request(port, "POST", path, bad)
            assert status == 400 and why in json.loads(data)["error"]["message"], (path, data)
        assert engine.supervisor.pid == pid and engine.state is ServerState.READY
        r = httpx.post(f"{engine.base_url}/v1/messages/count_tokens", timeout=60, json={
            "model": "local", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"user_id": [[1]]}})
        assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
        r = httpx.post(f"{engine.base_url}/tokenize", json={"content": "hi"}, timeout=60)
        assert r.status_code == 200, r.text
        assert_it_answers(engine.base_url)
        assert engine.supervisor.pid == pid
    finally:
        engine.stop(save=False)
