"""Transcripts against a real llama-server: every conversation through the front door is kept in
words with its saved session (0600, the same save), follows it when it goes on, comes back with a
restore, gives the session its title, preview and search text, and never changes what is sent."""

from __future__ import annotations

import os
import stat

import httpx
import pytest
from e2e_helpers import EventLog, make_engine, transcript_check, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.naming import transcript_name

pytestmark = pytest.mark.e2e


def chat(url: str, messages: list[dict], stream: bool = False) -> str:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "seed": 1}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        r.raise_for_status()
        import json

        parts = []
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:]).get("choices", []):
                    parts.append(c.get("delta", {}).get("content") or "")
        return "".join(parts)


def test_a_conversation_is_kept_in_words_and_follows_its_session(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    messages = [{"role": "system", "content": "You know about herons."},
                {"role": "user", "content": "Where do grey herons nest in the spring?"}]
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        messages.append({"role": "assistant", "content": chat(url, messages)})
        messages.append({"role": "user", "content": "And what do they eat near the river?"})
        messages.append({"role": "assistant", "content": chat(url, messages, stream=True)})
        saved = engine.save_slot(0)
        assert saved.kind == "new" and saved.title == "Where do grey herons nest in the spring?"
        entry = engine.sessions.listing().sessions[0]
        t = engine.sessions.transcript(entry.id)
        assert [(m.role, m.content) for m in t.messages] == [(m["role"], m["content"]) for m in messages]
        path = engine.library.store.dir / transcript_name(entry.sidecar.kv_file)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not engine.sessions.listing().unmanaged  # ours, not a stranger's file
        # Found by anything said in it, not only by the title (the tiny model's replies are not words).
        wait_until(lambda: engine.sessions.search("river").hits,
                   what="the search index to hold the conversation")
    finally:
        engine.stop(save=False)

    # After a restart the conversation comes back with its words; a next turn carries them on.
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert events.of(ev.SessionRestored)
        assert engine.board[0].content.transcript == t  # the slot holds it in words too
        messages.append({"role": "user", "content": "Thank you, that helps."})
        messages.append({"role": "assistant", "content": chat(engine.base_url, messages)})
        again = engine.save_slot(0)
        assert again.kind == "update" and again.id == entry.id
        after = engine.sessions.transcript(entry.id)
        assert after.turns == 3 and [m.content for m in after.messages] == [m["content"] for m in messages]
        files = os.listdir(engine.library.store.dir)
        assert [f for f in files if f.endswith(".chat")] == [transcript_name(
            engine.sessions.listing().sessions[0].sidecar.kv_file)]  # the old version's is gone
    finally:
        engine.stop(save=False)


def test_a_request_the_door_cannot_read_as_a_conversation_leaves_no_stale_transcript(llama_model, server_bin,
                                                                                     port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        chat(url, [{"role": "user", "content": "Tell me about snow."}])
        wait_until(lambda: engine.board[0].content.transcript is not None, what="the slot's transcript")
        tokens = httpx.post(f"{url}/tokenize", json={"content": "a text given as tokens"}).json()["tokens"]
        assert httpx.post(f"{url}/completion", json={"prompt": tokens, "n_predict": 4},
                          timeout=60).status_code == 200
        wait_until(lambda: engine.board[0].content.transcript is None, what="the slot's transcript dropped")
        saved = engine.save_slot(0)
        assert engine.sessions.transcript(saved.id) is None  # saved without one: its title from the tokens
    finally:
        engine.stop(save=False)


def test_a_transcript_is_checked_against_its_kv_file_with_the_models_template(llama_model, server_bin, port):
    from dataclasses import replace

    from slotkeeper.core.services.transcript_check import MISMATCH, OK
    from slotkeeper.core.sessions.transcripts import Message

    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        messages = [{"role": "user", "content": "Is the path over the pass open in winter?"}]
        messages.append({"role": "assistant", "content": chat(engine.base_url, messages)})
        messages.append({"role": "user", "content": "What about the hut at the top?"})
        chat(engine.base_url, messages)
        saved = engine.save_slot(0)
        check = transcript_check(engine.base_url, saved.id)
        assert check.verdict == OK, check.words
        # A transcript edited behind Slotkeeper's back no longer says what the file holds.
        entry = engine.library.store.get(saved.id)
        t = engine.library.store.transcript(entry)
        edited = replace(t, messages=(Message("user", "Something else entirely."), *t.messages[1:]))
        (engine.library.store.dir / transcript_name(entry.sidecar.kv_file)).write_bytes(edited.to_bytes())
        check = transcript_check(engine.base_url, saved.id)
        assert check.verdict == MISMATCH and "not what the saved conversation begins with" in check.words
    finally:
        engine.stop(save=False)


def test_sessions_verify_checks_the_transcript_while_slotkeeper_serves_its_model(llama_model, server_bin,
                                                                                 port, isolated_home):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "slotkeeper"]
    proc = subprocess.Popen([*cmd, "serve", "--model", str(llama_model), "--server-bin", server_bin, "--port",
                             str(port), "--ctx", "2048", "--data-dir", str(isolated_home), "--idle-save",
                             "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().split()[1]
        chat(url, [{"role": "user", "content": "Is there snow on the ridge today?"}])
        sessions = isolated_home / "sessions"
        wait_until(lambda: list(sessions.glob("*.chat")), what="the idle save with its transcript")
        r = subprocess.run([*cmd, "sessions", "--data-dir", str(isolated_home), "verify"],
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode == 0
                and "transcript: the transcript matches the saved conversation" in r.stdout), r
    finally:
        proc.terminate()
        proc.wait(60)
    r = subprocess.run([*cmd, "sessions", "--data-dir", str(isolated_home), "verify"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "its transcript was not checked" in r.stdout, r


def test_sessions_verify_asks_the_running_door_with_its_key(llama_model, server_bin, port, isolated_home):
    """`sessions verify` asks the running Slotkeeper through its front door, as any client, with the
    key the environment gives (LLAMA_API_KEY here; the settings' --api-key too): without it the door
    refuses, and verify says why the transcript was not checked. The door's own question answers
    what it cannot check in words."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "slotkeeper"]
    keyed = {**os.environ, "LLAMA_API_KEY": "door-key-for-verify"}
    unkeyed = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
    proc = subprocess.Popen([*cmd, "serve", "--model", str(llama_model), "--server-bin", server_bin, "--port",
                             str(port), "--ctx", "2048", "--data-dir", str(isolated_home), "--idle-save",
                             "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=keyed)
    headers = {"Authorization": "Bearer door-key-for-verify"}
    try:
        url = proc.stdout.readline().split()[1]
        asked = {"messages": [{"role": "user", "content": "Is the river high?"}], "max_tokens": 8}
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=120, json=asked)
        assert r.status_code == 200, r.text
        sessions = isolated_home / "sessions"
        # (a save writes its transcript first, then the sidecar that makes it exist)
        wait_until(lambda: list(sessions.glob("*.chat")) and list(sessions.glob("*.json")),
                   what="the idle save with its transcript")
        [sid] = [p.stem for p in sessions.glob("*.json")]
        verify = [*cmd, "sessions", "--data-dir", str(isolated_home), "verify"]
        r = subprocess.run(verify, capture_output=True, text=True, timeout=60, env=keyed)
        assert r.returncode == 0 and "transcript: the transcript matches the saved" in r.stdout, r
        r = subprocess.run(verify, capture_output=True, text=True, timeout=60, env=unkeyed)
        assert r.returncode == 0 and "wants its API key" in r.stdout, r
        check = f"{url}/slotkeeper/transcript-check"
        assert httpx.post(check, json={"id": sid}, timeout=60).status_code == 401
        answer = httpx.post(check, json={"id": sid}, headers=headers, timeout=60)
        assert answer.status_code == 200 and answer.json()["verdict"] == "ok", answer.text
        other = "0" * 12 if sid != "0" * 12 else "1" * 12
        for body, status in (({"id": other}, 404), ({"id": "../x"}, 400), ([sid], 400)):
            r = httpx.post(check, json=body, headers=headers, timeout=60)
            assert r.status_code == status and r.json()["error"]["message"], (body, r.text)
        assert (isolated_home / "state" / "door.json").exists()
    finally:
        proc.terminate()
        proc.wait(60)
    assert not (isolated_home / "state" / "door.json").exists()  # no door, no record of one
