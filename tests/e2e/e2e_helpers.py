"""Helpers for end-to-end tests: talking to llama-server like a chat client would."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.settings import ServerProfile, Settings

USER_TURNS = [
    "Hello there, I would like to talk about the weather in the mountains this week.",
    "What should I pack for a long walk in the hills if it rains in the afternoon?",
    "And what about food and water for a day out on the trail with two friends?",
    "Thanks. Could you also say something about maps and how to read them well?",
]
# A first turn long enough that restoring its conversation beats re-reading it however fast the
# tiny test model prefills (the front desk re-reads a conversation shorter than its break-even).
LONG_FIRST_TURN = USER_TURNS[0] + " The trail winds up past the lake and the old stone hut." * 40


def chat(base_url: str, messages: list[dict], max_tokens: int = 16, **extra) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1, **extra}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def assert_it_answers(base_url: str) -> None:
    """A short completion through ``base_url`` comes back answered (the door still serves)."""
    r = httpx.post(f"{base_url}/completion", json={"prompt": "Hello", "n_predict": 2}, timeout=60)
    assert r.status_code == 200, r.text


def converse(base_url: str, turns: list[str], max_tokens: int = 16) -> tuple[list[dict], dict]:
    """A multi-turn chat; returns the history (with replies) and the last response."""
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant for walkers."}]
    resp: dict = {}
    for text in turns:
        messages.append({"role": "user", "content": text})
        resp = chat(base_url, messages, max_tokens)
        messages.append({"role": "assistant", "content": resp["choices"][0]["message"]["content"]})
    return messages, resp


def transcript_check(base_url: str, session_id: str, key: str | None = None):
    """What `sessions verify` asks the running Slotkeeper: its transcript check of a session (the
    door's own question), as a ``TranscriptCheck``; None when it cannot check (409)."""
    from slotkeeper.core.services.running import ask_transcript_check

    return ask_transcript_check(base_url, key, session_id, timeout=60)


def make_settings(model, server_bin, port, idle_save=0.2, **profile) -> Settings:
    profile.setdefault("ctx", 2048)
    return Settings(
        profile=ServerProfile(model_path=str(model), server_bin=server_bin, port=port, **profile),
        idle_save_seconds=idle_save,
    )


def make_engine(model, server_bin, port, idle_save=0.2, **profile) -> Engine:
    return Engine(app_paths(), make_settings(model, server_bin, port, idle_save, **profile))


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class EventLog:
    """Every event the engine emits; ``of(SessionSaved)`` gives those of one type (a save or restore
    event's summary rather than the event)."""

    def __init__(self, engine: Engine) -> None:
        self.events = []
        engine.events.subscribe(self.events.append)

    def of(self, event_type) -> list:
        return [getattr(e, "summary", e) for e in list(self.events) if isinstance(e, event_type)]


def free_port() -> int:
    """A port nobody listens on right now (loopback only)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HEALTH_TIMEOUT_S = 60.0


def log_tail(log_file: Path, chars: int = 4000) -> str:
    return log_file.read_text(errors="replace")[-chars:]


@contextmanager
def bare_llama_server(argv: Sequence[str], log_file: Path) -> Iterator[str]:
    """llama-server started straight from ``argv`` (no --host/--port: a free loopback port is
    added), its output in ``log_file``; yields its base URL once /health answers, stops it after.
    A server that exits or never gets healthy fails the test with the end of its log."""
    port = free_port()
    with log_file.open("wb") as log:
        proc = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n{log_tail(log_file)}")
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not healthy after {HEALTH_TIMEOUT_S} s:\n{log_tail(log_file)}")
            try:
                if httpx.get(f"{base}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def resolve_auto_as_slotkeeper(binary_path: str, argv: list[str], model: Path, profile: ServerProfile,
                               flags: frozenset[str], home: Path | None = None) -> bool:
    """``argv`` made to pass the flash attention Slotkeeper's launch in the data folder ``home``
    (default: this test's) resolves "auto" to (what it probed and measured there); returns it."""
    from slotkeeper.core.engine.lifecycle.launching import binary_facts_cache, resolve_flash_attn
    from slotkeeper.core.engine.lifecycle.model_facts import model_facts_cache, resolve_model

    paths = app_paths(home).ensure()
    model_facts = model_facts_cache(paths.model_facts_file)
    choice = resolve_flash_attn(binary_path, argv, resolve_model(str(model), paths.models_dir, model_facts),
                                profile, flags, binary_facts_cache(paths.binary_facts_file), model_facts)
    return choice.value


@contextmanager
def llama_server_as_slotkeeper_runs_it(server_bin: str, model: Path, folder: Path,
                                       **profile) -> Iterator[str]:
    """llama-server alone, started with the arguments Slotkeeper gives it for ``profile`` (the
    baseline of side-by-side tests); yields its base URL."""
    from slotkeeper.core.server.command import build_argv
    from slotkeeper.core.server.locate import locate_server, probe_flags

    profile.setdefault("ctx", 2048)
    binary = locate_server(server_bin)
    prof = ServerProfile(model_path=str(model), server_bin=server_bin, port=1, **profile)
    flags = probe_flags(binary)
    argv = list(build_argv(binary.argv_prefix, prof, model, folder, flags))
    if prof.flash_attn is None:  # "auto": the value Slotkeeper's launch resolves it to
        resolve_auto_as_slotkeeper(binary.path, argv, model, prof, flags)
    for flag in ("--host", "--port"):  # bare_llama_server adds its own loopback address and port
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    with bare_llama_server(argv, folder / "llama-server-alone.log") as base:
        yield base
