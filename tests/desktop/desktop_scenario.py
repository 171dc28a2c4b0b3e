"""One launch of the real desktop app under X11 with a real tray host and llama-server.

Run by tests/desktop/test_desktop.py in its own process (Qt's platform is fixed per process):

    python desktop_scenario.py PHASE RESULT.json SHOTS_DIR -- <slotkeeper options>

PHASE "first": chat, watch the gauge move, open the tray menu with a real right click, take
screenshots, then Quit from the tray menu (which saves). PHASE "second": the relaunch restores
the session; the same chat plus one message must show the cache hit in the gauge. Results go to
RESULT.json for the test to assert on; screenshots are taken with ImageMagick's `import`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from slotkeeper.cli import build_parser, load_run_settings
from slotkeeper.gui.application import SlotkeeperApp, run_gui

TURNS = [
    "Hello there, I would like to talk about the weather in the mountains this week.",
    "What should I pack for a long walk in the hills if it rains in the afternoon?",
]


def chat(url: str, messages: list[dict], max_tokens: int = 16) -> dict:
    import httpx

    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()


def conversation(url: str) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant for walkers."}]
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        reply = chat(url, messages)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    return messages


class Scenario:
    def __init__(self, phase: str, result_path: Path, shots: Path, sk: SlotkeeperApp, result: dict) -> None:
        self.phase, self.result_path, self.shots, self.sk = phase, result_path, shots, sk
        self.result = result
        result.update(phase=phase, steps=[])
        self.gen = self.run()

    # A generator drives the scenario: each `yield condition` waits (in the event loop) until
    # condition() is true, so the app keeps running normally between steps.
    def start(self) -> None:
        self._advance()

    def _advance(self, waiting=None, deadline=0.0, what="") -> None:
        try:
            if waiting is not None and not waiting():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {what}")
                QTimer.singleShot(50, lambda: self._advance(waiting, deadline, what))
                return
            step = next(self.gen)
        except StopIteration:
            return
        except Exception:
            self.result["error"] = traceback.format_exc()
            self.save()
            QApplication.instance().exit(3)
            return
        cond, timeout, what = step
        self._advance(cond, time.monotonic() + timeout, what)

    def note(self, step: str, **data) -> None:
        self.result["steps"].append(step)
        self.result.update(data)
        self.save()

    def save(self) -> None:
        self.result_path.write_text(json.dumps(self.result, indent=2, default=str))

    def shot(self, name: str) -> None:
        QApplication.processEvents()
        subprocess.run(["import", "-window", "root", str(self.shots / name)], check=True, timeout=30)

    @staticmethod
    def pause(seconds: float):
        """A wait step that keeps the event loop running (repaints, job callbacks)."""
        until = time.monotonic() + seconds
        return (lambda: time.monotonic() >= until, seconds + 5, f"{seconds} s")

    def gauge(self):
        gauges = self.sk.window.slots_page.slots_panel.gauges
        return gauges[0].figures if gauges else None

    def in_thread(self, fn):
        box: dict = {}

        def run():
            try:
                box["value"] = fn()
            except Exception as exc:  # reported by the waiting step
                box["error"] = exc

        threading.Thread(target=run, daemon=True).start()
        return box

    def run(self):
        sk, engine = self.sk, self.sk.engine
        tray = sk.tray
        self.note("launched", tray_available=QSystemTrayIcon.isSystemTrayAvailable(), has_tray=tray is not None)
        if tray is None:
            raise RuntimeError("no system tray: is the tray host running?")
        yield (lambda: tray.tray.isVisible() and tray.tray.geometry().width() > 0, 20, "the tray icon")
        t_ready = time.monotonic()
        yield (lambda: engine.ready.is_set(), 120, "the engine to be ready")
        g = tray.tray.geometry()
        self.note("tray", tray_geometry=[g.x(), g.y(), g.width(), g.height()],
                  tooltip=tray.tray.toolTip(), icon_state=tray.icon_state,
                  ready_after_s=round(time.monotonic() - t_ready, 2))
        url = engine.base_url
        if self.phase == "first":
            box = self.in_thread(lambda: conversation(url))
            yield (lambda: "value" in box or "error" in box, 120, "the chat")
            if "error" in box:
                raise box["error"]
            (self.shots.parent / "conversation.json").write_text(json.dumps(box["value"]))
            yield (lambda: self.gauge() is not None and self.gauge().n_prompt > 0, 30, "the gauge to move")
            f = self.gauge()
            self.note("gauge-moved", first_gauge={"n_prompt": f.n_prompt, "cache_n": f.cache_n,
                                                   "prompt_n": f.prompt_n, "state": f.state})
            yield (lambda: len(engine.sessions.listing().sessions) == 1, 60, "the idle save")
            sk.show_window("Slots")
            yield (lambda: sk.window.isVisible(), 10, "the main window")
            yield self.pause(0.3)
            self.shot("main-window-slots.png")
            sk.window.show_tab("Sessions")
            yield (lambda: sk.window.sessions_page.sessions_model.rowCount() == 1, 20, "the sessions table")
            self.shot("main-window-sessions.png")
            sk.open_settings()
            yield (lambda: sk.settings_dialog is not None and sk.settings_dialog.isVisible(), 10, "settings")
            dialog = sk.settings_dialog
            dialog.tabs.setCurrentIndex(2)  # "Disk budget": usage and what a prune would delete
            yield (lambda: not dialog.disk_tab.preview_title.text().startswith("Working out"), 20, "the prune preview")
            yield self.pause(0.3)
            self.shot("settings.png")
            dialog.reject()
            sk.window.hide()
            # A real right click on the tray icon opens the menu.
            dpr = QApplication.primaryScreen().devicePixelRatio()  # xdotool works in device pixels
            cx, cy = int((g.x() + g.width() / 2) * dpr), int((g.y() + g.height() / 2) * dpr)
            subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "3"], check=True)
            yield (lambda: tray.menu.isVisible(), 10, "the tray menu")
            yield self.pause(0.3)
            self.shot("tray-menu.png")
            self.note("menu", menu_items=[a.text() for a in tray.menu.actions() if a.text()])
            # Hovering "Model" opens the Model submenu: recent and found models, the current one checked.
            yield (lambda: tray.bridge.found_models is not None, 20, "the models found")
            geo = tray.menu.actionGeometry(tray.model_menu.menuAction())
            at = tray.menu.mapToGlobal(geo.center())
            subprocess.run(["xdotool", "mousemove", str(int(at.x() * dpr)), str(int(at.y() * dpr))], check=True)
            yield (lambda: tray.model_menu.isVisible(), 10, "the Model menu")
            yield self.pause(0.4)
            self.shot("tray-model-menu.png")
            self.note("model-menu", model_menu_items=[a.text() for a in tray.model_menu.actions() if a.text()],
                      model_menu_checked=[a.text() for a in tray.model_menu.model_actions() if a.isChecked()])
            tray.model_menu.hide()
            tray.menu.hide()
            tray.quit_action.trigger()
            return
        # second phase: the restored conversation continues from the cache
        restored = [e for e in engine.sessions.listing().sessions if e.sidecar.last_restore]
        self.note("restored", restored=len(restored))
        messages = json.loads((self.shots.parent / "conversation.json").read_text())
        messages.append({"role": "user", "content": "And one more thing: which boots?"})
        box = self.in_thread(lambda: chat(url, messages))
        yield (lambda: "value" in box or "error" in box, 120, "the chat after the restore")
        if "error" in box:
            raise box["error"]
        timings = box["value"]["timings"]
        yield (lambda: self.gauge() is not None and self.gauge().cache_n > 0, 30, "the gauge to show the hit")
        f = self.gauge()
        self.note("cache-hit", timings=timings, second_gauge={"n_prompt": f.n_prompt, "cache_n": f.cache_n,
                                                               "prompt_n": f.prompt_n})
        sk.show_window("Slots")
        yield (lambda: sk.window.isVisible(), 10, "the main window")
        yield self.pause(0.3)
        self.shot("main-window-cache-hit.png")
        sk.window.show_tab("History")
        yield self.pause(0.3)
        self.shot("main-window-history.png")
        tray.quit_action.trigger()


def main() -> int:
    phase, result_path, shots = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    argv = sys.argv[sys.argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    paths, service, settings = load_run_settings(args, [])
    result: dict = {"done": False}

    def started(sk: SlotkeeperApp) -> None:
        # The app as users run it (run_gui: its exit path included), driven from inside.
        scenario = Scenario(phase, result_path, shots, sk, result)
        sk.finished.connect(lambda: result.update(done=sk.done))
        QTimer.singleShot(0, scenario.start)

    code = run_gui(None, paths, service, settings, start_now=True, first_run=False, on_started=started)
    result["exit_code"] = code
    Path(result_path).write_text(json.dumps(result, indent=2, default=str))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
