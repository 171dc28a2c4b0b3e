"""What drives a desktop scenario: a generator of steps run inside the app's own event loop.

Each step the scenario's ``run()`` yields is ``(condition, timeout, what)``: the stepper waits (a
timer every 50 ms, the app running normally in between) until ``condition()`` is true, then takes
the next step. A step that times out or raises ends the app with exit code 3, the traceback in the
scenario's result (``save()`` writes it).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from slotkeeper.cli.commands import build_parser
from slotkeeper.cli.run import load_run_settings
from slotkeeper.gui.application import SlotkeeperApp, run_gui


class Stepper:
    result: dict
    gen: object  # self.run(), made by the scenario

    def run(self):  # the scenario's steps
        raise NotImplementedError

    def save(self) -> None:
        raise NotImplementedError

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


def run_in_the_app(argv: list[str], result_path: Path,
                   scenario: Callable[[SlotkeeperApp, dict], Stepper]) -> int:
    """The app as users run it (run_gui: its exit path included), started with ``argv`` (the
    command line's options) and driven from inside by ``scenario(app, result)``. The result, with
    whether the app finished and its exit code, goes to ``result_path``."""
    paths, service, settings = load_run_settings(build_parser().parse_args(argv), [])
    result: dict = {"done": False}

    def started(sk: SlotkeeperApp) -> None:
        steps = scenario(sk, result)
        sk.finished.connect(lambda: result.update(done=sk.done))
        QTimer.singleShot(0, steps.start)

    code = run_gui(None, paths, service, settings, start_now=True, first_run=False, on_started=started)
    result["exit_code"] = code
    Path(result_path).write_text(json.dumps(result, indent=2, default=str))
    return code
