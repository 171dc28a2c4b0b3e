"""One launch of the real desktop app under X11 with a real tray host and llama-server.

Run by tests/desktop/test_desktop.py in its own process (Qt's platform is fixed per process):

    python desktop_scenario.py PHASE RESULT.json SHOTS_DIR -- <slotkeeper options>

PHASE "first": chat, watch the gauge move, open the tray menu with a real right click, take
screenshots, then Quit from the tray menu (which saves). PHASE "second": the relaunch restores
the session; the same chat plus one message must show the cache hit in the gauge. Results go to
RESULT.json for the test to assert on; screenshots are taken with ImageMagick's `import`.

A newcomer's path runs the app as the `slotkeeper` command does (its entry point: no model on
the command line, the head start and prelaunch included): PHASE "newcomer": a fresh data folder, the
first run's chooser (a model found in llama.cpp's cache, "Use this model"), two conversations,
Quit. PHASE "newcomer-again": the relaunch serves without being asked, the tray's Resume lists both
conversations, one conversation continues and replaces the other in the slot, then the window
opens for the first time and must agree with the tray on where each is and how old; History keeps
both launches. PHASE "port-busy": another program holds the port: a failure with its reason in
the window and a red tray icon.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon
from stepper import Stepper, run_in_the_app

from slotkeeper.gui.application import SlotkeeperApp

TURNS = [
    "Hello there, I would like to talk about the weather in the mountains this week.",
    "What should I pack for a long walk in the hills if it rains in the afternoon?",
]
OTHER_TURNS = [
    "Tell me about the herons that nest by the river near the old mill.",
    "When do their chicks usually leave the nest?",
]
NEWCOMER_PHASES = ("newcomer", "newcomer-again", "port-busy")


def chat(url: str, messages: list[dict], max_tokens: int = 16) -> dict:
    import httpx

    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()


def conversation(url: str, turns: list[str] = TURNS) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant for walkers."}]
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = chat(url, messages)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    return messages


class Scenario(Stepper):
    def __init__(self, phase: str, result_path: Path, shots: Path, sk: SlotkeeperApp, result: dict) -> None:
        self.phase, self.result_path, self.shots, self.sk = phase, result_path, shots, sk
        self.result = result
        result.update(phase=phase, steps=[])
        self.gen = self.run()

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
        if self.phase in NEWCOMER_PHASES:
            yield from getattr(self, self.phase.replace("-", "_"))()
            return
        sk, engine = self.sk, self.sk.engine
        tray = sk.tray
        self.note("launched", tray_available=QSystemTrayIcon.isSystemTrayAvailable(),
                  has_tray=tray is not None)
        if tray is None:
            raise RuntimeError("no system tray: is the tray host running?")
        yield (lambda: tray.tray.isVisible() and tray.tray.geometry().width() > 0, 20, "the tray icon")
        t_ready = time.monotonic()
        yield (lambda: engine.snapshot.ready, 120, "the engine to be ready")
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
            yield (lambda: not dialog.disk_tab.preview_title.text().startswith("Working out"), 20,
                   "the prune preview")
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
            subprocess.run(["xdotool", "mousemove", str(int(at.x() * dpr)), str(int(at.y() * dpr))],
                           check=True)
            yield (lambda: tray.model_menu.isVisible(), 10, "the Model menu")
            yield self.pause(0.4)
            self.shot("tray-model-menu.png")
            self.note("model-menu",
                      model_menu_items=[a.text() for a in tray.model_menu.actions() if a.text()],
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


    # -- a newcomer's path ------------------------------------------------------------------
    def tray_ready(self):
        tray = self.sk.tray
        self.note("launched", tray_available=QSystemTrayIcon.isSystemTrayAvailable(),
                  has_tray=tray is not None)
        if tray is None:
            raise RuntimeError("no system tray: is the tray host running?")
        yield (lambda: tray.tray.isVisible() and tray.tray.geometry().width() > 0, 20, "the tray icon")
        yield self.pause(1.0)  # the icon embeds in the tray host

    def right_click_tray(self):
        """A real right click on the icon (again, should the first come before the icon embedded)."""
        tray = self.sk.tray
        dpr = QApplication.primaryScreen().devicePixelRatio()  # xdotool works in device pixels
        for _attempt in range(3):
            g = tray.tray.geometry()
            cx, cy = int((g.x() + g.width() / 2) * dpr), int((g.y() + g.height() / 2) * dpr)
            subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "3"], check=True)
            until = time.monotonic() + 3
            yield (lambda until=until: tray.menu.isVisible() or time.monotonic() > until, 5, "the tray menu")
            if tray.menu.isVisible():
                return
        raise TimeoutError("the tray menu did not open on a right click")

    def hover(self, menu, action):
        dpr = QApplication.primaryScreen().devicePixelRatio()
        at = menu.mapToGlobal(menu.actionGeometry(action).center())
        subprocess.run(["xdotool", "mousemove", str(int(at.x() * dpr)), str(int(at.y() * dpr))], check=True)

    def newcomer(self):
        """The first run chose the model (see main): the server starts on it; two conversations."""
        sk, engine = self.sk, self.sk.engine
        yield from self.tray_ready()
        yield (lambda: engine.snapshot.ready, 120, "the server on the model chosen")
        self.note("serving", chosen=sk.bridge.settings.profile.model_path)
        # One slot: the second conversation takes it over from the first.
        for n, (name, turns) in enumerate((("a", TURNS), ("b", OTHER_TURNS)), start=1):
            box = self.in_thread(lambda turns=turns: conversation(engine.base_url, turns))
            yield (lambda box=box: "value" in box or "error" in box, 120, "a conversation")
            if "error" in box:
                raise box["error"]
            (self.shots.parent / f"conversation-{name}.json").write_text(json.dumps(box["value"]))
            yield (lambda n=n: len(engine.sessions.listing().sessions) == n, 60, f"save number {n}")
        self.note("saved", menu_items=[a.text() for a in sk.tray.menu.actions() if a.text()])
        sk.tray.quit_action.trigger()

    def newcomer_again(self):
        """The relaunch serves at once; Resume lists both; the window agrees with the tray."""
        sk, engine, bridge = self.sk, self.sk.engine, self.sk.bridge
        tray = sk.tray
        self.note("first-run-shown", first_run_shown=sk.chooser is not None)
        yield from self.tray_ready()
        yield (lambda: engine.snapshot.ready, 120, "the server, started with the app")
        import httpx

        url = engine.base_url
        self.note("serving", url=url, health=httpx.get(f"{url}/health", timeout=10).status_code,
                  window_built=sk._window is not None)
        # Resume, opened for real: both conversations, the one in the slot first.
        yield (lambda: bridge.listing is not None and len(bridge.listing.sessions) == 2, 20, "the listing")
        yield from self.right_click_tray()
        self.hover(tray.menu, tray.resume_menu.menuAction())
        yield (lambda: tray.resume_menu.isVisible(), 10, "the Resume menu")
        yield self.pause(0.4)
        self.shot("tray-resume-menu.png")
        self.note("resume", resume_items=[a.text() for a in tray.resume_menu.actions()],
                  resume_ids=[a.data() for a in tray.resume_menu.actions()])
        tray.resume_menu.hide()
        tray.menu.hide()
        # The first conversation goes on: it is brought back into the slot the other one holds.
        a_id = next(e.id for e in bridge.listing.sessions if e.sidecar
                    and e.sidecar.title.startswith("Hello there"))
        messages = json.loads((self.shots.parent / "conversation-a.json").read_text())
        messages.append({"role": "user", "content": "And which boots would you take?"})
        saved_before = bridge.saved_at.get(a_id, 0.0)
        box = self.in_thread(lambda: chat(url, messages))
        yield (lambda: "value" in box or "error" in box, 120, "the first conversation going on")
        if "error" in box:
            raise box["error"]
        yield (lambda: [v.session_id for v in bridge.slots] == [a_id], 30, "the first conversation in slot 0")
        yield (lambda: bridge.saved_at.get(a_id, 0.0) > saved_before
               and all(not v.running for v in bridge.slots), 60, "its save")
        yield self.pause(0.5)
        # The window, opened for the first time now, and the tray: one answer.
        tray.rebuild_resume_menu()
        tray_where = {}
        tray_age = {}
        for action in tray.resume_menu.actions():
            label = action.text()
            tray_where[action.data()] = (label.rsplit("(in slot ", 1)[1].rstrip(")") if "(in slot " in label
                                         else "")
            tray_age[action.data()] = label.rsplit("(", 1)[1].rstrip(")") if "(in slot " not in label else ""
        sk.show_window("conversations")
        window = sk.window
        yield (lambda: window.isVisible() and window.sessions_page.sessions_model.rowCount() == 2, 20,
               "the Conversations tab")
        yield self.pause(0.3)
        model = window.sessions_page.sessions_model
        from slotkeeper.gui.sessions_model import COLUMN

        table_where, table_age = {}, {}
        for row in range(model.rowCount()):
            sid = model.entry(row).id
            cell = model.index(row, COLUMN["in_slot"]).data()
            table_where[sid] = cell.removeprefix("slot ")
            table_age[sid] = "" if cell else model.index(row, COLUMN["last_used"]).data()
        self.shot("main-window-conversations.png")
        window.show_tab("history")
        yield self.pause(0.4)
        plot = window.history_page.history_plot
        self.shot("main-window-history-relaunch.png")
        window.show_tab("server")
        yield self.pause(0.3)
        log = window.server_page.log_view
        self.note("agree", a_id=a_id, tray_where=tray_where, table_where=table_where, tray_age=tray_age,
                  table_age=table_age, launches=len(plot.launches),
                  launch_markers=sum(1 for kind, _ in plot.markers if kind == "launch"),
                  sources=[pt.source for pt in plot.points],
                  log_sideways=log.text.horizontalScrollBar().maximum(),
                  help_menu=[a.text() for a in window.menuBar().actions()],
                  tray_about=tray.about_action.text())
        window.resize(window.minimumSizeHint())
        yield self.pause(0.4)
        page = window.server_page
        self.note("smallest", search_widths={
            "log": [page.log_view.search.width(),
                    page.log_view.search.fontMetrics().horizontalAdvance("Search the log")],
            "activity": [page.activity_view.search.width(),
                         page.activity_view.search.fontMetrics().horizontalAdvance("Search: saved")]})
        tray.quit_action.trigger()

    def port_busy(self):
        """Another program listens on the port: the start fails, and says why."""
        sk, bridge = self.sk, self.sk.bridge
        yield from self.tray_ready()
        from slotkeeper.core.views import ServerState

        yield (lambda: bridge.state is ServerState.FAILED, 60, "the start to fail")
        sk.show_window("server")
        window = sk.window
        yield (lambda: window.isVisible(), 10, "the main window")
        page = window.server_page
        yield (lambda: "llama-server failed: Port" in page.log_view.plain_text(), 10, "the log")
        yield self.pause(0.4)
        self.shot("main-window-port-in-use.png")
        self.note("failed", icon_state=sk.tray.icon_state, state_label=page.state_label.text(),
                  state_message=page.state_message.text(),
                  log_last=page.log_view.plain_text().splitlines()[-1])
        sk.tray.quit_action.trigger()


def run_as_the_command(phase: str, result_path: Path, shots: Path, argv: list[str], result: dict) -> int:
    """The `slotkeeper` command's own entry point (``slotkeeper.__main__.main``: the head start,
    the command line, prelaunch), with the scenario hooked into run_gui (and, on the first run, a
    hand that picks the model in the chooser)."""
    import gc

    from slotkeeper import __main__ as command
    from slotkeeper.gui import application

    real_run_gui = application.run_gui

    def run_gui(*args, **kwargs):
        app = QApplication.instance() or QApplication(sys.argv[:1])
        if phase == "newcomer":
            pick_the_model_on_first_run(shots, result)

        def started(sk: SlotkeeperApp) -> None:
            scenario = Scenario(phase, result_path, shots, sk, result)
            sk.finished.connect(lambda: result.update(done=sk.done))
            QTimer.singleShot(0, scenario.start)

        code = real_run_gui(*args, on_started=started, **kwargs)
        gc.collect()
        app.shutdown()
        gc.collect()
        return code

    application.run_gui = run_gui
    sys.argv = ["slotkeeper", *argv]
    return command.main()


def pick_the_model_on_first_run(shots: Path, result: dict) -> None:
    """The chooser opens before the app is built (a modal dialog): pick the model it found."""
    from slotkeeper.gui.first_run import FirstRunDialog

    def look() -> None:
        dialogs = [w for w in QApplication.topLevelWidgets() if isinstance(w, FirstRunDialog)
                   and w.isVisible()]
        if not dialogs or dialogs[0].searching:
            QTimer.singleShot(100, look)
            return
        d = dialogs[0]
        items = [d.tree.topLevelItem(i) for i in range(d.tree.topLevelItemCount())]
        ours = [i for i in items if i.text(4).endswith("tiny-llama.gguf")]
        if not ours:
            QTimer.singleShot(100, look)
            return
        d.tree.setCurrentItem(ours[0])
        QApplication.processEvents()
        subprocess.run(["import", "-window", "root", str(shots / "first-run.png")], check=True, timeout=30)
        result["first_run"] = {"title": d.windowTitle(), "models": [i.text(0) for i in items]}
        d.use_button.click()

    QTimer.singleShot(100, look)


def main() -> int:
    phase, result_path, shots = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    argv = sys.argv[sys.argv.index("--") + 1:]
    if phase in NEWCOMER_PHASES:
        result: dict = {"done": False}
        code = run_as_the_command(phase, result_path, shots, argv, result)
        result["exit_code"] = code
        Path(result_path).write_text(json.dumps(result, indent=2, default=str))
        return code
    return run_in_the_app(argv, result_path,
                          lambda sk, result: Scenario(phase, result_path, shots, sk, result))


if __name__ == "__main__":
    raise SystemExit(main())
