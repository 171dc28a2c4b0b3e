"""An agent that rewrites its history further back after a restart, against the real llama-server:
Claude Code's ``--resume`` drops what it had added to its history itself, so the history it sends
after a relaunch leaves the saved conversation at ``messages[3]`` (here: the reply it kept then
resent without its first part). llama-server that never stopped rolls back there (from its RAM
checkpoints, or its whole cache with --swa-full); Slotkeeper, relaunched, goes on from the restore
point kept at that request's prompt end, re-reading at most 64 tokens more, with the same answer.
An agent's requests carry its tools (thousands of tokens of prompt): its earlier requests' points are
kept within its whole save's bytes.
"""

from __future__ import annotations

import httpx
import pytest
from e2e_helpers import LONG_FIRST_TURN, USER_TURNS, EventLog, make_engine, wait_until
from test_points_server import never_stopped

from slotkeeper.core import events as ev
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

SLACK = 64
PATH_ONLY = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"name": f"tool_{i}", "input_schema": PATH_ONLY,
          "description": f"Tool {i}: reads or changes the files of the project as its arguments say, and "
                         "reports back what it did in a few plain lines."} for i in range(10)]
SYSTEM = "You are a coding agent. Use the tools you are given to read and change files. " * 4
REMINDER = "<system-reminder>The user opened the file main.py in the IDE.</system-reminder>"


def ask(base: str, messages: list[dict], max_tokens: int = 12) -> dict:
    body = {"model": "m", "system": SYSTEM, "tools": TOOLS, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0}
    r = httpx.post(f"{base}/v1/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(answer: dict) -> str:
    return "".join(b.get("text", "") for b in answer["content"] if b.get("type") == "text") or "Done."


def session(base: str, settle) -> list[dict]:
    """Four requests of an agent; after each, Slotkeeper is left to save it and make its points."""
    messages: list[dict] = []
    for i, words in enumerate((LONG_FIRST_TURN, USER_TURNS[1], USER_TURNS[2], USER_TURNS[3])):
        content = f"{REMINDER}\n{words}" if i == 1 else words  # a message the agent added itself
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": text_of(ask(base, messages))})
        settle(i)
    return messages


def resumed(history: list[dict]) -> list[dict]:
    """What the agent sends after a restart: messages[3], the reply to its second request, without
    what it had added to it (its first part), so the conversation leaves the saved one at
    messages[3]'s start; then a new turn."""
    out = [dict(m) for m in history]
    words = out[3]["content"].split()
    out[3] = {"role": "assistant", "content": " ".join(words[len(words) // 2:]) or "Done."}
    return out + [{"role": "user", "content": "Now run the tests, please."}]


@pytest.mark.parametrize("kind, profile", [("gemma3", {"swa_full": True}), ("qwen35", {})],
                         ids=["gemma3-swa-full", "hybrid"])
def test_a_history_rewritten_early_after_a_relaunch_rereads_no_more_than_a_server_that_never_stopped(
        kind, profile, models_dir, server_bin, port, tmp_path):
    model = models_dir / f"tiny-{kind}.gguf"
    if not model.exists():
        write_model(model, kind)
    engine = make_engine(model, server_bin, port, idle_save=0.2, ctx=8192, **profile)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY

        def settle(i: int) -> None:
            def done():
                found = [s for s in engine.library.store.sessions() if s.sidecar is not None]
                s = engine.board[0]
                return (len(found) == 1 and not s.busy and not s.watch.changed
                        and sum(p.kind == "prompt" for p in found[0].sidecar.points) >= min(i + 1, 2))
            wait_until(done, timeout=60, what=f"request {i + 1}'s save and restore points")

        history = session(engine.base_url, settle)
        [saved] = engine.library.store.sessions()
        prompt_points = sorted(p.n_tokens for p in saved.sidecar.points if p.kind == "prompt")
        assert len(prompt_points) >= 3, saved.sidecar.points  # earlier requests' points are kept
    finally:
        engine.stop()

    request = resumed(history)
    engine = make_engine(model, server_bin, port, idle_save=3600, ctx=8192, **profile)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = ask(engine.base_url, request, max_tokens=4)
    finally:
        engine.stop(save=False)
    assert not events.of(ev.SlotRecomputed), "served from a restore point"

    with never_stopped(server_bin, model, tmp_path, {**profile, "ctx": 8192}) as raw:
        for i in range(1, len(history), 2):
            ask(raw, history[:i])
        want = ask(raw, request, max_tokens=4)
    # llama-server's Messages usage: input_tokens were read now, cache_read_input_tokens came from the cache
    got_u, want_u = got["usage"], want["usage"]
    assert (got_u["input_tokens"] + got_u["cache_read_input_tokens"]
            == want_u["input_tokens"] + want_u["cache_read_input_tokens"])  # the same prompt
    assert got_u["input_tokens"] <= want_u["input_tokens"] + SLACK, (got_u, want_u)
    assert text_of(got) == text_of(want)
