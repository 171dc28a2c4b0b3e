"""States llama-server wrote, kept whole in the staging folder (memory) after they are committed: the
next launch restores the conversation from that file without assembling it from its pieces, and
one that no longer matches its hash is assembled as before."""

from __future__ import annotations

import os

import pytest
from e2e_helpers import USER_TURNS, converse, make_engine

from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions import staging
from slotkeeper.core.sessions.states import States

pytestmark = pytest.mark.e2e


def _relaunch(model, server_bin, port, history, monkeypatch):
    assembled = []
    real = States.materialize
    monkeypatch.setattr(States, "materialize",
                        lambda self, kv, out: assembled.append(kv) or real(self, kv, out))
    engine = make_engine(model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        users = [m["content"] for m in history if m["role"] == "user"]
        _h, answer = converse(engine.base_url, [*users, "more"])
        staged = engine.link.staging
    finally:
        engine.stop(save=False)
    return assembled, answer["timings"], staged


def _saved_conversation(model, server_bin, port):
    """A two-turn conversation, saved at shutdown (its state kept whole in the staging folder):
    its history and that folder."""
    engine = make_engine(model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, _ = converse(engine.base_url, USER_TURNS[:2])
        folder = engine.link.staging
        if not staging.in_memory(folder):
            pytest.skip("no memory file system for the staging folder here")
    finally:
        engine.stop()
    return history, folder


def test_the_next_launch_restores_the_whole_state_kept_in_memory(llama_model, server_bin, port,
                                                                  isolated_home, monkeypatch):
    history, folder = _saved_conversation(llama_model, server_bin, port)
    assert [n for n in os.listdir(folder) if n.startswith(staging.CACHE_PREFIX)]
    assembled, timings, _ = _relaunch(llama_model, server_bin, port, history, monkeypatch)
    assert assembled == []  # restored from the whole file
    assert timings["cache_n"] > 50
    # A kept file that no longer matches its hash is never read: the state is assembled instead.
    for name in os.listdir(folder):
        if name.startswith(staging.CACHE_PREFIX):
            data = bytearray((folder / name).read_bytes())
            data[len(data) // 2] ^= 1
            (folder / name).write_bytes(bytes(data))
    assembled, timings, _ = _relaunch(llama_model, server_bin, port, history, monkeypatch)
    assert assembled and timings["cache_n"] > 50


def test_after_a_restart_of_the_machine_the_launch_assembles_while_the_model_loads(
        llama_model, server_bin, port, isolated_home, monkeypatch):
    """The cache in memory is gone after a reboot: the launch assembles the conversations it will
    restore while llama-server loads the model, and the restore reads the whole file."""
    from slotkeeper.core.engine.slots import actions as actions_module

    history, folder = _saved_conversation(llama_model, server_bin, port)
    for name in os.listdir(folder):  # what a restart of the machine empties
        if name.startswith(staging.CACHE_PREFIX):
            os.unlink(folder / name)
    found = []
    real_lookup = actions_module.cached_state
    monkeypatch.setattr(actions_module, "cached_state",
                        lambda where, key: found.append(real_lookup(where, key)) or found[-1])
    assembled, timings, _ = _relaunch(llama_model, server_bin, port, history, monkeypatch)
    assert assembled and len(assembled) == len(set(assembled))  # each once, ahead of the restore
    assert found and found[0] is not None  # the launch's restore read it whole
    assert timings["cache_n"] > 50
