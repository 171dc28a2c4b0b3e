"""What a person should be told, decided from the engine's events (through the bridge).

The tray shows these as balloon messages; without a tray the main window shows them in its
status bar (and errors in a message box). Kept apart from both so it is tested offscreen.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.views import ServerState
from slotkeeper.gui.bridge import EngineBridge

INFO, WARNING, ERROR = "info", "warning", "error"
# The Server tab has the button (gui.swa_fix); a click on the notification opens that tab.
SWA_FIX_HINT = " The Server tab turns on --swa-full in one click."


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
        bridge.on(ev.EngineReady, self._on_ready)
        bridge.on(ev.ServerStateChanged, self._on_state)
        bridge.on(ev.RestoreReused, self._on_reuse)
        bridge.on(ev.SessionsPruned, self._on_pruned)
        bridge.on(ev.SessionRefused, self._on_refused)
        bridge.on(ev.SaveFailed, self._on_save_failed)
        bridge.on(ev.WarningRaised, self._on_warning)
        bridge.on(ev.NoticeRaised, self._on_notice)
        bridge.errorOccurred.connect(self._on_error)

    def _title_of(self, session_id: str | None) -> str:
        listing = self.bridge.listing
        if listing is not None and session_id:
            for e in listing.sessions:
                if e.id == session_id and e.sidecar is not None:
                    return e.sidecar.title
        return session_id or "a conversation"

    def _on_ready(self, event: ev.EngineReady) -> None:
        restored, url = event.restored, event.url
        if restored:
            tokens = sum(r.n_restored for r in restored)
            ms = sum(r.ms for r in restored)
            titles = ", ".join(f"“{r.title or r.id}”" for r in restored[:3])
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
        self._crash_message = None

    def _on_state(self, event: ev.ServerStateChanged) -> None:
        state, message = event.state, event.message
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
            ran = self._restarting or self._crash_message is not None
            self._restarting = False
            self._crash_message = None
            self.notify.emit("llama-server stopped" if ran else "llama-server could not start",
                             message or "It could not be started.", ERROR)

    def _on_reuse(self, event: ev.RestoreReused) -> None:
        if event.effective is not False:  # reused, or not judged (another conversation, a recompute)
            return
        title = self._title_of(event.id)
        # A reason that says what was reused ("the next request reused 9 of the 5,176 ...") is the
        # sentence itself; any other reason explains the figures.
        reason = event.reason or ""
        if reason.startswith("the next request"):
            why = reason
        else:
            why = f"the next request reused {event.cache_n:,} of its {event.n_restored:,} tokens"
            why += f": {reason}" if reason else ""
        self.notify.emit(
            "A restore gave no reuse",
            f"“{title}” was restored into slot {event.slot}, but {why}."
            + (SWA_FIX_HINT if "--swa-full" in why else ""),
            WARNING,
        )

    def _on_pruned(self, event: ev.SessionsPruned) -> None:
        ids = event.ids
        if not ids:
            return
        self.notify.emit(
            "Old conversations deleted",
            f"{_plural(len(ids), 'saved conversation')} deleted to stay within the disk budget "
            f"({human_bytes(event.bytes_freed)} freed). Pin a conversation to keep it.",
            INFO,
        )

    def _on_refused(self, event: ev.SessionRefused) -> None:
        self.notify.emit(
            "Conversation not restored",
            f"“{self._title_of(event.id)}”: " + "; ".join(event.reasons),
            WARNING,
        )

    def _on_save_failed(self, event: ev.SaveFailed) -> None:
        self.notify.emit(f"Saving slot {event.slot} failed", event.message, ERROR)

    def _once(self, message: str) -> bool:
        if message in self._said:
            return False
        self._said.add(message)
        return True

    def _on_warning(self, event: ev.WarningRaised) -> None:
        message = event.message
        if message and self._once(message):
            if "without --swa-full" in message or "Turning on --swa-full" in message:
                message += SWA_FIX_HINT
            self.notify.emit("Slotkeeper", message, WARNING)

    def _on_notice(self, event: ev.NoticeRaised) -> None:
        message = event.message
        if message and self._once(message):
            self.notify.emit("Slotkeeper", message, INFO)

    def _on_error(self, what: str, why: str) -> None:
        self.notify.emit(f"{what} failed" if what else "Something failed", why, ERROR)
