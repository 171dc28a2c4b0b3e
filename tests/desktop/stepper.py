"""What drives a desktop scenario: a generator of steps run inside the app's own event loop.

Each step the scenario's ``run()`` yields is ``(condition, timeout, what)``: the stepper waits (a
timer every 50 ms, the app running normally in between) until ``condition()`` is true, then takes
the next step. A step that times out or raises ends the app with exit code 3, the traceback in the
scenario's result (``save()`` writes it).
"""

from __future__ import annotations

import time
import traceback

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication


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
