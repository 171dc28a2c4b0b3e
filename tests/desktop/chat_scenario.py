"""The chat window under X11 with the starter model answering (a real small instruct model).

Run by tests/desktop/test_chat_window_desktop.py in its own process (Qt's platform is fixed per
process):

    python chat_scenario.py RESULT.json SHOTS_DIR -- <slotkeeper options>

The app starts the server on the model given, "New chat" opens the chat window, a system prompt
and two questions are typed and sent with Enter; each reply streams in; then the window is
photographed with ImageMagick's `import` (chat-window.png). Results go to RESULT.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from stepper import Stepper, run_in_the_app

from slotkeeper.gui.application import SlotkeeperApp

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTIONS = ["How do I reverse a list in Python? Show a short code example.",
             "And how do I sort it from the largest to the smallest?"]
OPTIONS = {"max_tokens": 160, "temperature": 0, "seed": 1}  # short, and the same every time


class Scenario(Stepper):
    def __init__(self, result_path: Path, shots: Path, sk: SlotkeeperApp, result: dict) -> None:
        self.result_path, self.shots, self.sk, self.result = result_path, shots, sk, result
        result["steps"] = []
        self.gen = self.run()

    def save(self) -> None:
        self.result_path.write_text(json.dumps(self.result, indent=2, default=str))

    def note(self, step: str, **data) -> None:
        self.result["steps"].append(step)
        self.result.update(data)
        self.save()

    @staticmethod
    def pause(seconds: float):
        until = time.monotonic() + seconds
        return (lambda: time.monotonic() >= until, seconds + 5, f"{seconds} s")

    def shot(self, window, name: str) -> None:
        """The window with its frame (the window manager's title bar), as the screen shows it."""
        QApplication.processEvents()
        subprocess.run(["import", "-frame", "-window", str(int(window.winId())), str(self.shots / name)],
                       check=True, timeout=30)

    def run(self):
        sk = self.sk
        yield (lambda: sk.bridge.facts is not None, 300, "the server to be ready")
        sk.new_chat()
        (w,) = sk.chats.windows
        w.resize(860, 770)
        w.show_transcript(replace(w.transcript, options=OPTIONS))
        yield self.pause(0.5)
        w.move(200, 0)  # the frame at the top of the screen, now the window manager has framed it
        yield self.pause(0.3)
        w.system_edit.setPlainText(SYSTEM)
        replies = []
        for question in QUESTIONS:
            done: list = []
            w.replyFinished.connect(done.append)
            QTest.keyClicks(w.composer, question)
            QTest.keyClick(w.composer, Qt.Key.Key_Return)
            yield (lambda done=done: bool(done), 600, "the reply")
            w.replyFinished.disconnect(done.append)
            result = done[0]
            if result.error:
                raise RuntimeError(result.error)
            replies.append({"text": result.message.content, "figures": result.figures.line()})
        self.note("chatted", replies=replies, footer=w.view.widgets[-1].footer.text(),
                  roles=[m.role for m in w.transcript.messages])
        w.view.scroll_to_bottom()
        yield self.pause(0.5)
        w.activateWindow()
        yield self.pause(0.3)
        self.shot(w, "chat-window.png")
        self.note("shot")
        sk.request_quit()


def main() -> int:
    result_path, shots = Path(sys.argv[1]), Path(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1:]
    return run_in_the_app(argv, result_path, lambda sk, result: Scenario(result_path, shots, sk, result))


if __name__ == "__main__":
    raise SystemExit(main())
