"""`slotkeeper serve` on Windows saves when its console is closed (or at logoff, shutdown), not only on
Ctrl+C: the real serve with a real llama-server, in this process, with Windows' console-control
call made through a recorded kernel32 (core/basics/session_end.py)."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

from slotkeeper.cli.commands import main
from slotkeeper.core.basics import session_end
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e


class RecordedKernel32:
    def __init__(self) -> None:
        self.handlers: list = []

    def SetConsoleCtrlHandler(self, callback, add):  # noqa: N802 - the Win32 name
        (self.handlers.append if add else self.handlers.remove)(callback)
        return 1


@pytest.mark.timeout(600)
def test_closing_the_console_saves_the_conversation_before_windows_ends_the_process(
        starter_model, server_bin, port, tmp_path, monkeypatch):
    kernel32 = RecordedKernel32()
    real = session_end.on_console_end
    monkeypatch.setattr(session_end, "on_console_end",
                        lambda request_stop, stopped: real(request_stop, stopped, kernel32=kernel32,
                                                           callback_type=lambda f: f))
    monkeypatch.setattr(session_end, "CONSOLE_END_WAIT_S", 120)  # a slow machine: the save, not the clock
    home = tmp_path / "data"
    outcome: dict = {}

    def windows() -> None:  # Windows' handler thread, once the user has had a conversation
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                threading.Event().wait(0.5)
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
                "max_tokens": 16, "temperature": 0})
            outcome["reply"] = reply.status_code
            outcome["returned"] = kernel32.handlers[0](session_end.CTRL_CLOSE_EVENT)
            saved = SessionStore(home / "sessions").sessions()
            outcome["saved when it returned"] = [s.sidecar.n_tokens for s in saved]
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            outcome["error"] = repr(exc)
            signal.raise_signal(signal.SIGTERM)  # serve must not wait for a close that never comes

    thread = threading.Thread(target=windows, daemon=True)
    thread.start()
    # No idle save: what is saved, the close saved.
    code = main(["--data-dir", str(home), "serve", "--model", str(starter_model), "--server-bin", server_bin,
                 "--port", str(port), "--ctx", "2048", "--idle-save", "3600"])
    thread.join(120)
    assert "error" not in outcome, outcome
    assert code == 0 and outcome["reply"] == 200 and outcome["returned"] is True, outcome
    assert outcome["saved when it returned"] and outcome["saved when it returned"][0] > 10, outcome
    assert kernel32.handlers == []  # undone when serve ended
