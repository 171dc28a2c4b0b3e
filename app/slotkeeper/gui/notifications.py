"""What a person should be told, decided from the bridge's signals.

The tray shows these as balloon messages; without a tray the main window shows them in its
status bar (and errors in a message box). Kept apart from both so it is tested offscreen.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from slotkeeper.core.server.supervisor import ServerState
from slotkeeper.core.units import human_bytes
from slotkeeper.gui.bridge import EngineBridge

INFO, WARNING, ERROR = "info", "warning", "error"


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


class Notifier(QObject):
    notify = Signal(str, str, str)  # title, message, level (info / warning / error)

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._crash_message: str | None = None
        self._restarting = False
        self._said: set[str] = set()
        bridge.engineReady.connect(self._on_ready)
        bridge.serverStateChanged.connect(self._on_state)
        bridge.restoreReuse.connect(self._on_reuse)
        bridge.sessionsPruned.connect(self._on_pruned)
        bridge.resumeFinished.connect(self._on_resumed)
        bridge.sessionRefused.connect(self._on_refused)
        bridge.saveFailed.connect(self._on_save_failed)
        bridge.warningRaised.connect(self._on_warning)
        bridge.noticeRaised.connect(self._on_notice)
        bridge.errorOccurred.connect(self._on_error)

    def _title_of(self, session_id: str | None) -> str:
        listing = self.bridge.listing
        if listing is not None and session_id:
            for e in listing.sessions:
                if e.id == session_id and e.sidecar is not None:
                    return e.sidecar.title
        return session_id or "a conversation"

    def _on_ready(self, url: str, restored: list) -> None:
        if restored:
            tokens = sum(int(r.get("n_restored", 0)) for r in restored)
            ms = sum(float(r.get("ms", 0.0)) for r in restored)
            titles = ", ".join(f"“{r.get('title') or r.get('id')}”" for r in restored[:3])
            more = f" and {len(restored) - 3} more" if len(restored) > 3 else ""
            self.notify.emit(
                "Conversations restored",
                f"{_plural(len(restored), 'conversation')} ({tokens:,} tokens) restored in "
                f"{_seconds(ms)}: {titles}{more}. The server is ready at {url}.",
                INFO,
            )
        elif self._restarting:
            self.notify.emit("llama-server restarted", f"It is ready again at {url}.", INFO)
        self._restarting = False

    def _on_state(self, state: ServerState, data: dict) -> None:
        message = str(data.get("message", ""))
        if state is ServerState.CRASHED:
            self._crash_message = message
        elif state is ServerState.RESTARTING:
            self._restarting = True
            self.notify.emit(
                "llama-server crashed",
                f"{self._crash_message or 'It stopped unexpectedly'}. Restarting it automatically "
                f"({message}); conversations saved before the crash are restored.",
                WARNING,
            )
        elif state is ServerState.FAILED and not self.bridge.quitting:
            self._restarting = False
            self.notify.emit("llama-server stopped", message or "It could not be started.", ERROR)

    def _on_reuse(self, data: dict) -> None:
        if data.get("effective"):
            return
        title = self._title_of(data.get("id"))
        self.notify.emit(
            "A restore gave no reuse",
            f"“{title}” was restored into slot {data.get('slot')}, but the next request reused "
            f"{int(data.get('cache_n', 0)):,} of {int(data.get('n_restored', 0)):,} tokens: "
            f"{data.get('reason') or 'the cache was not used'}.",
            WARNING,
        )

    def _on_pruned(self, data: dict) -> None:
        ids = list(data.get("ids") or [])
        if not ids:
            return
        self.notify.emit(
            "Old conversations deleted",
            f"{_plural(len(ids), 'saved conversation')} deleted to stay within the disk budget "
            f"({human_bytes(int(data.get('bytes_freed', 0)))} freed). Pin a conversation to keep it.",
            INFO,
        )

    def _on_resumed(self, session_id: str, summary) -> None:
        if not summary:
            return  # refused or failed: said by _on_refused / _on_error
        if summary.get("already_loaded"):
            self.notify.emit(
                "Conversation ready",
                f"“{summary.get('title') or self._title_of(session_id)}” is already in slot "
                f"{summary.get('slot')}. Continue it from your chat client.",
                INFO,
            )
            return
        self.notify.emit(
            "Conversation ready",
            f"“{summary.get('title') or self._title_of(session_id)}” is loaded in slot "
            f"{summary.get('slot')} ({int(summary.get('n_restored', 0)):,} tokens in "
            f"{_seconds(float(summary.get('ms', 0.0)))}). Continue it from your chat client.",
            INFO,
        )

    def _on_refused(self, data: dict) -> None:
        reasons = data.get("reasons") or []
        self.notify.emit(
            "Conversation not restored",
            f"“{self._title_of(data.get('id'))}”: " + "; ".join(reasons),
            WARNING,
        )

    def _on_save_failed(self, data: dict) -> None:
        self.notify.emit(f"Saving slot {data.get('slot')} failed", str(data.get("message", "")), ERROR)

    def _once(self, message: str) -> bool:
        if message in self._said:
            return False
        self._said.add(message)
        return True

    def _on_warning(self, message: str) -> None:
        if message and self._once(message):
            self.notify.emit("Slotkeeper", message, WARNING)

    def _on_notice(self, message: str) -> None:
        if message and self._once(message):
            self.notify.emit("Slotkeeper", message, INFO)

    def _on_error(self, what: str, why: str) -> None:
        self.notify.emit(f"{what} failed" if what else "Something failed", why, ERROR)
