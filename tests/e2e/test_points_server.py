"""Restore points against the real llama-server: after a relaunch, and after the conversation was
pushed out of its slot, a hybrid model (generated qwen35) and a sliding-window model with --swa-full
(generated gemma3) re-read no more than llama-server that never stopped, for the three requests that
roll back into a conversation: a client that re-renders the last reply (reasoning dropped from the
history), Regenerate, and an edited last message; and they answer with the same log-probs. A
full-attention model (the control) needs no points and makes none.

The never-stopped reference is llama-server alone, started with Slotkeeper's own arguments, given
the same requests in the same order."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from e2e_helpers import (
    LONG_FIRST_TURN,
    USER_TURNS,
    EventLog,
    llama_server_as_slotkeeper_runs_it,
    make_engine,
    wait_until,
)

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

SLACK = 4  # tokens: llama-server's own checkpoints sit a few tokens before the prompt's end
TOLERANCE = 1e-5  # log-prob difference allowed (the existing restore tests' bound)
SYSTEM = "You are a helpful assistant for walkers."
CASES = ("reasoning", "regenerate", "edit")
# Flash attention off: llama-server's answers hardly depend on how a prompt was batched, so a
# restore is held to TOLERANCE. Left to auto (the default), Slotkeeper chooses it for exact restores
# where they hang on it (off with --swa-full) and the never-stopped reference runs what Slotkeeper
# chose: held to the same. Only flash attention set on by hand (its CPU kernel's sums move with
# where the cells sit, and so with what the cache held) is held to llama-server's own noise between
# a cold prefill and its checkpoint, measured in each test.
FAMILIES = [("qwen35", "qwen35", {"flash_attn": False}),
            ("gemma3", "gemma3", {"swa_full": True, "flash_attn": False}),
            ("llama", "llama", {"flash_attn": False}),
            ("qwen35-fa-auto", "qwen35", {}),
            ("gemma3-fa-auto", "gemma3", {"swa_full": True}),
            ("llama-fa-auto", "llama", {}),
            ("gemma3-fa-on", "gemma3", {"swa_full": True, "flash_attn": True})]
PUSHED_OUT = [f for f in FAMILIES if f[0] in ("qwen35", "gemma3", "gemma3-fa-auto")]
# A hybrid model's recurrent state comes out of a prompt evaluated in other batches (from a
# checkpoint, from a point, from scratch) a little apart: llama-server alone gives log-probs 8e-5
# apart for the same request from its checkpoint and from an empty slot. A wrong state is O(1) off.
HYBRID_TOLERANCE = 1e-3
TOLERANCES = {"qwen35": HYBRID_TOLERANCE}


def ask(base: str, messages: list[dict], max_tokens: int = 12, **extra) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1, **extra}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def converse(base: str) -> list[dict]:
    """Three turns, the first long (restoring it beats re-reading it); the history with replies."""
    messages = [{"role": "system", "content": SYSTEM}]
    for text in (LONG_FIRST_TURN, USER_TURNS[1], USER_TURNS[2]):
        messages.append({"role": "user", "content": text})
        reply = ask(base, messages)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    return messages


def case_request(history: list[dict], case: str) -> list[dict]:
    if case == "reasoning":  # the reply resent other than generated (its reasoning dropped), a new turn
        last = history[-1]["content"]
        return history[:-1] + [{"role": "assistant", "content": last[len(last) // 2:] or "Well."},
                                {"role": "user", "content": USER_TURNS[3]}]
    if case == "regenerate":  # the same prompt again
        return history[:-1]
    return history[:-2] + [{"role": "user", "content": "Something else entirely, please."}]  # edit


@dataclass(frozen=True)
class Answer:
    prompt_n: int  # prompt tokens evaluated
    tokens: tuple[str, ...]  # the tokens generated (greedy)
    probs: tuple[tuple[float, ...], ...]  # the top log-probs at each


def figures(answer: dict) -> Answer:
    content = answer["choices"][0]["logprobs"]["content"]
    return Answer(answer["timings"]["prompt_n"], tuple(t["token"] for t in content),
                  tuple(tuple(p["logprob"] for p in t["top_logprobs"]) for t in content))


def distance(a: Answer, b: Answer) -> float:
    """How far two answers' log-probs are apart (infinite when their tokens differ)."""
    if a.tokens != b.tokens or [len(p) for p in a.probs] != [len(p) for p in b.probs]:
        return float("inf")
    return max(abs(x - y) for xs, ys in zip(a.probs, b.probs) for x, y in zip(xs, ys))


def never_stopped(server_bin: str, model: Path, folder: Path, profile: dict):
    """llama-server alone with the arguments Slotkeeper gives it."""
    return llama_server_as_slotkeeper_runs_it(server_bin, model, folder, **profile)


def reference(base: str, history: list[dict], case: str) -> tuple[Answer, Answer]:
    """The case on llama-server that never stopped (the conversation replayed from an empty slot),
    and the same request on it again from an empty slot (a cold prefill)."""
    httpx.post(f"{base}/slots/0", params={"action": "erase"}, timeout=60).raise_for_status()
    replay = [history[0]]
    for i in range(1, len(history), 2):
        replay.append(history[i])
        reply = ask(base, replay)["choices"][0]["message"]["content"]
        assert reply == history[i + 1]["content"], "the same server gives the same replies"
        replay.append(history[i + 1])
    request = case_request(history, case)
    warm = figures(ask(base, request, max_tokens=4, logprobs=True, top_logprobs=5))
    httpx.post(f"{base}/slots/0", params={"action": "erase"}, timeout=60).raise_for_status()
    return warm, figures(ask(base, request, max_tokens=4, logprobs=True, top_logprobs=5))


def assert_same_answer(got: Answer, never_stopped: Answer, cold: Answer, what: str, kind: str,
                       profile: dict) -> None:
    """The same tokens as llama-server that never stopped, and log-probs within the family's
    tolerance (with flash attention set on, within llama-server's own cold-prefill noise)."""
    noise = distance(never_stopped, cold)
    tolerance = TOLERANCES.get(kind, TOLERANCE)
    if profile.get("flash_attn") is True:
        tolerance = max(tolerance, noise)
    assert distance(got, never_stopped) <= tolerance, (
        f"{what}: {got} differs from never stopped {never_stopped} (its own cold prefill: {noise:.2g})")


@pytest.mark.parametrize("name, kind, profile", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_rollbacks_after_a_relaunch_reread_no_more_than_a_server_that_never_stopped(
        name, kind, profile, models_dir, server_bin, port, tmp_path):
    model = write_model(models_dir / f"tiny-{kind}.gguf", kind)
    engine = make_engine(model, server_bin, port, idle_save=0.2, **profile)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history = converse(engine.base_url)

        def saved_with_points():
            sessions = engine.library.store.sessions()
            if len(sessions) != 1 or engine.board[0].busy or engine.board[0].watch.changed:
                return None
            return sessions[0].sidecar if (sessions[0].sidecar.points or kind == "llama") else None

        sc = wait_until(saved_with_points, what="the idle save and its restore points")
    finally:
        engine.stop()
    exact_only = kind != "llama"
    if exact_only:
        kinds = sorted(p.kind for p in sc.points)
        assert kinds == ["prompt", "user"], sc.points
        assert sc.size_bytes > 0 and all(p.size_bytes > 0 for p in sc.points)
    else:
        assert sc.points == ()  # any prefix of a full-attention save is usable: no extra files

    with never_stopped(server_bin, model, tmp_path, profile) as raw:
        expected = {case: reference(raw, history, case) for case in CASES}

    for case in CASES:
        engine = make_engine(model, server_bin, port, idle_save=3600, **profile)
        events = EventLog(engine)
        engine.start()
        try:
            assert engine.wait_ready(60) is ServerState.READY
            assert events.of(ev.SessionRestored), "the launch restored the conversation"
            got = figures(ask(engine.base_url, case_request(history, case), max_tokens=4, logprobs=True,
                              top_logprobs=5))
        finally:
            engine.stop(save=False)
        want, cold = expected[case]
        assert got.prompt_n <= want.prompt_n + SLACK, (
            f"{kind} {case}: {got.prompt_n} tokens re-read, never stopped {want.prompt_n}")
        assert_same_answer(got, want, cold, f"{name} {case}", kind, profile)
        if exact_only:
            assert not events.of(ev.SlotRecomputed), f"{kind} {case}: recomputed instead of a point"


@pytest.mark.parametrize("name, kind, profile", PUSHED_OUT, ids=[f[0] for f in PUSHED_OUT])
def test_a_conversation_pushed_out_of_its_slot_comes_back_from_its_restore_point(
        name, kind, profile, models_dir, server_bin, port, tmp_path):
    model = write_model(models_dir / f"tiny-{kind}.gguf", kind)
    engine = make_engine(model, server_bin, port, idle_save=0.2, **profile)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history = converse(engine.base_url)
        wait_until(lambda: [s for s in engine.library.store.sessions() if len(s.sidecar.points) == 2],
                   what="the restore points")
        # Another conversation takes the only slot, then the first one comes back: Regenerate.
        other = [{"role": "system", "content": "You answer questions about trains."},
                 {"role": "user", "content": " ".join(USER_TURNS) * 3}]
        ask(engine.base_url, other)
        got = figures(ask(engine.base_url, case_request(history, "regenerate"), max_tokens=4, logprobs=True,
                          top_logprobs=5))
        restored = [r for r in events.of(ev.SessionRestored) if r.slot == 0]
        assert restored, "the conversation came back by a restore"
    finally:
        engine.stop(save=False)
    with never_stopped(server_bin, model, tmp_path, profile) as raw:
        want, cold = reference(raw, history, "regenerate")
    assert got.prompt_n <= want.prompt_n + SLACK
    assert_same_answer(got, want, cold, f"{name} after another conversation", kind, profile)


def test_an_edit_further_back_restores_from_an_earlier_user_message_point(models_dir, server_bin, port,
                                                                          tmp_path, monkeypatch):
    """With points at earlier user messages kept (spaced by the setting, here closer than its
    default for a short test conversation), editing an earlier message after a relaunch re-reads
    from that message, as llama-server that never stopped does from its RAM checkpoint there."""
    from slotkeeper.core.engine.slots import points

    # The tiny hybrid's recurrent state, which each point holds whole, is a large part of a short
    # save: here a chat's earlier points may cost more than its share.
    monkeypatch.setattr(points, "POINTS_SHARE", 4.0)
    model = write_model(models_dir / "tiny-qwen35.gguf", "qwen35")
    engine = make_engine(model, server_bin, port, idle_save=0.2)
    engine._settings = replace(engine._settings, point_spacing_tokens=64)
    engine.library.point_spacing = 64
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        messages = [{"role": "system", "content": SYSTEM}]
        turns = (LONG_FIRST_TURN, *(" ".join([t] * 4) for t in USER_TURNS[1:4]))  # ~90 tokens apart
        for i, text in enumerate(turns):  # a pause after each turn
            messages.append({"role": "user", "content": text})
            messages.append({"role": "assistant", "content": ask(engine.base_url, messages)["choices"][0][
                "message"]["content"]})
            wait_until(lambda i=i: [s for s in engine.library.store.sessions()
                                    if sum(p.kind == "user" for p in s.sidecar.points) >= min(i, 2)
                                    and not engine.board[0].busy and not engine.board[0].watch.changed],
                       what=f"turn {i + 1}'s restore points")
        [saved] = engine.library.store.sessions()
        users = sorted(p.n_tokens for p in saved.sidecar.points if p.kind == "user")
        assert len(users) >= 2, saved.sidecar.points
    finally:
        engine.stop()
    # Turn 3's message edited (turn 4 and its reply dropped): it starts at the earlier user point.
    edited = messages[:5] + [{"role": "user", "content": "Something else entirely, please."}]
    engine = make_engine(model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = figures(ask(engine.base_url, edited, max_tokens=4, logprobs=True, top_logprobs=5))
    finally:
        engine.stop(save=False)
    with never_stopped(server_bin, model, tmp_path, {}) as raw:
        for i in range(1, len(messages), 2):
            ask(raw, messages[:i + 1])
        want = figures(ask(raw, edited, max_tokens=4, logprobs=True, top_logprobs=5))
    assert got.prompt_n <= want.prompt_n + SLACK, (got.prompt_n, want.prompt_n)
    assert distance(got, want) <= HYBRID_TOLERANCE


def test_a_request_that_comes_while_points_are_made_stops_them_at_the_next_step(
        models_dir, server_bin, port, monkeypatch):
    """Restore points are made while the slot is idle; a request for that slot arriving meanwhile
    waits only for the point being made (each step is slowed here, as a big model's would be),
    then goes on from what the slot holds, and gets its answer."""
    import threading
    import time

    from slotkeeper.core.server.client import LlamaClient

    real = LlamaClient.hold_prefix
    started = threading.Event()

    def slow_hold(self, slot, tokens, timeout=None):
        started.set()
        time.sleep(1.5)
        return real(self, slot, tokens, timeout)

    monkeypatch.setattr(LlamaClient, "hold_prefix", slow_hold)
    model = write_model(models_dir / "tiny-qwen35.gguf", "qwen35")
    engine = make_engine(model, server_bin, port, idle_save=0.2)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history = converse(engine.base_url)
        assert started.wait(30), "the restore points began"
        update_settings(engine, replace(engine.settings, idle_save_seconds=3600))  # no idle save after it
        answer = ask(engine.base_url, [*history, {"role": "user", "content": USER_TURNS[3]}])
        assert answer["choices"][0]["message"]["content"] is not None
        assert answer["timings"]["cache_n"] > 0  # it went on from what the slot held
        wait_until(lambda: not engine.board[0].busy, what="the slot free")
        [saved] = [s for s in engine.library.store.sessions() if s.sidecar.points]
        assert len(saved.sidecar.points) == 1, "the second point waited for the request"
    finally:
        engine.stop(save=False)
