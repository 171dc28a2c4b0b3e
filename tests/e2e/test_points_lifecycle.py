"""Restore points through a conversation's whole life, against the real llama-server: a quit while
they are being made waits for the step under way, makes what is owed and stops llama-server without
a kill; a conversation pushed out of its slot before it went idle gets its points as it leaves; a
tampered or damaged sidecar costs only the points it names wrongly, never the conversation."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from e2e_helpers import USER_TURNS, EventLog, make_engine, wait_until
from test_points_server import (
    SLACK,
    ask,
    assert_same_answer,
    case_request,
    converse,
    figures,
    never_stopped,
    reference,
)

from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e

SWA_FULL = {"swa_full": True}


def gemma3(models_dir):
    path = models_dir / "tiny-gemma3.gguf"
    return path if path.exists() else write_model(path, "gemma3")


def relaunched_case(model, server_bin, port, history, case):
    """The case's request after a relaunch (the conversation restored at launch)."""
    engine = make_engine(model, server_bin, port, idle_save=3600, **SWA_FULL)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = figures(ask(engine.base_url, case_request(history, case), max_tokens=4, logprobs=True,
                          top_logprobs=5))
    finally:
        engine.stop(save=False)
    assert not events.of(ev.SlotRecomputed), "served from a point, not recomputed"
    return got


def test_a_quit_while_points_are_made_waits_for_the_step_makes_what_is_owed_and_kills_nothing(
        models_dir, server_bin, port, tmp_path, monkeypatch, caplog):
    model = gemma3(models_dir)
    real = LlamaClient.hold_prefix
    started = threading.Event()

    def slow_hold(self, slot, tokens, timeout=None):  # a big model's step takes this long
        started.set()
        time.sleep(1.5)
        return real(self, slot, tokens, timeout)

    monkeypatch.setattr(LlamaClient, "hold_prefix", slow_hold)
    engine = make_engine(model, server_bin, port, idle_save=0.2, **SWA_FULL)
    events = EventLog(engine)
    engine.start()
    assert engine.wait_ready(60) is ServerState.READY
    history = converse(engine.base_url)
    assert started.wait(30), "the restore points began"
    caplog.set_level(logging.WARNING, logger="slotkeeper.core.server.supervisor")
    began = time.monotonic()
    engine.stop()
    took = time.monotonic() - began
    assert "did not stop within" not in caplog.text, "llama-server was killed"
    assert took < engine.supervisor.stop_grace, f"the quit stalled {took:.1f} s"
    [saved] = SessionStore(app_paths().sessions_dir).sessions()
    assert sorted(p.kind for p in saved.sidecar.points) == ["prompt", "user"], saved.sidecar.points
    said = [e.activity.activity for e in events.of(ev.ActivityChanged)]
    assert "making restore points" in said  # the quit's progress says what it does

    got = relaunched_case(model, server_bin, port, history, "reasoning")
    with never_stopped(server_bin, model, tmp_path, SWA_FULL) as raw:
        want, cold = reference(raw, history, "reasoning")
    assert got.prompt_n <= want.prompt_n + SLACK, (got.prompt_n, want.prompt_n)
    assert_same_answer(got, want, cold, "after a quit during points", "gemma3", SWA_FULL)


def test_a_conversation_pushed_out_before_it_went_idle_gets_its_points_as_it_leaves(
        models_dir, server_bin, port, tmp_path):
    model = gemma3(models_dir)
    engine = make_engine(model, server_bin, port, idle_save=3600, **SWA_FULL)  # never idle long enough
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history = converse(engine.base_url)
        other = [{"role": "system", "content": "You answer questions about trains."},
                 {"role": "user", "content": " ".join(USER_TURNS) * 3}]
        ask(engine.base_url, other)  # takes the only slot: the first conversation leaves it
        first = [s for s in engine.library.store.sessions() if s.sidecar.n_tokens >= 100
                 and s.sidecar.title.startswith("Hello")]
        assert len(first) == 1 and first[0].sidecar.points, "its points were made as it left"
    finally:
        engine.stop(save=False)
    got = relaunched_case(model, server_bin, port, history, "regenerate")
    with never_stopped(server_bin, model, tmp_path, SWA_FULL) as raw:
        want, cold = reference(raw, history, "regenerate")
    assert got.prompt_n <= want.prompt_n + SLACK, (got.prompt_n, want.prompt_n)
    assert_same_answer(got, want, cold, "after it was pushed out", "gemma3", SWA_FULL)


@pytest.fixture
def saved_with_points(models_dir, server_bin, port):
    """A conversation saved with its two restore points, the server stopped; (model, history)."""
    model = gemma3(models_dir)
    engine = make_engine(model, server_bin, port, idle_save=0.2, **SWA_FULL)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history = converse(engine.base_url)
        wait_until(lambda: [s for s in engine.library.store.sessions() if len(s.sidecar.points) == 2
                            and not engine.board[0].busy], what="the restore points")
    finally:
        engine.stop()
    return model, history


def sidecar_file():
    [path] = [p for p in app_paths().sessions_dir.glob("*.json")]
    return path


def test_a_tampered_points_entry_costs_that_point_only(saved_with_points, server_bin, port, tmp_path):
    model, history = saved_with_points
    path = sidecar_file()
    data = json.loads(path.read_text())
    main = data["kv_file"]
    good = data["points"]
    data["points"] = [
        {**good[0], "kv_file": main},  # the conversation's own save named as a point
        {**good[0], "n_tokens": -5},  # a negative count
        {k: v for k, v in good[1].items() if k != "content_hash"},  # a field missing
        {**good[0], "kv_file": "../../elsewhere.kv"},  # outside the folder
        *good,
        *({**good[1], "kv_file": f"{data['id']}.{i:08x}.kv"} for i in range(10_000)),  # too many
    ]
    path.write_text(json.dumps(data))
    store = SessionStore(app_paths().sessions_dir)
    [entry] = store.sessions()
    assert not entry.problems and entry.sidecar.kv_file == main
    assert [p.kv_file for p in entry.sidecar.points][:2] == [p["kv_file"] for p in good]
    store.verify(entry.id)
    store.points.drop(entry.id, [main])  # a name the sidecar uses otherwise is never removed
    assert (app_paths().sessions_dir / main).exists()
    got = relaunched_case(model, server_bin, port, history, "reasoning")  # the save and its points serve
    with never_stopped(server_bin, model, tmp_path, SWA_FULL) as raw:
        want, _cold = reference(raw, history, "reasoning")
    assert got.prompt_n <= want.prompt_n + SLACK


def test_a_point_that_restores_another_count_is_refused_and_dropped(saved_with_points, server_bin, port):
    model, history = saved_with_points
    path = sidecar_file()
    data = json.loads(path.read_text())
    a, b = sorted(data["points"], key=lambda p: p["n_tokens"])
    # The longer point's entry now names a copy of the shorter point's file (its size and hash match
    # that file, so only the count llama-server reports tells them apart).
    folder = path.parent
    copy = f"{data['id']}.0badc0de.kvm"
    (folder / copy).write_bytes((folder / a["kv_file"]).read_bytes())
    (folder / copy).chmod(0o600)
    swapped = {**b, "kv_file": copy, "size_bytes": a["size_bytes"], "content_hash": a["content_hash"],
               "verified": None}
    data["points"] = [swapped, a]
    path.write_text(json.dumps(data))
    engine = make_engine(model, server_bin, port, idle_save=3600, **SWA_FULL)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        answer = ask(engine.base_url, case_request(history, "reasoning"), max_tokens=4)
        assert answer["choices"][0]["message"]["content"] is not None
        refused = events.of(ev.SessionRefused)
        assert any("gave llama-server" in " ".join(r.reasons) for r in refused), refused
        [entry] = engine.library.store.sessions()
        assert [p.n_tokens for p in entry.sidecar.points] == [a["n_tokens"]], "the wrong point dropped"
    finally:
        engine.stop(save=False)
    assert not (folder / copy).exists() and (folder / a["kv_file"]).exists()
