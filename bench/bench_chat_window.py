"""The chat window's first screen for a long conversation, measured.

    .venv/bin/python bench/bench_chat_window.py [--messages 2000] [--runs 7]

Builds a transcript of N messages (questions, and answers in Markdown with a code block), then for
each run opens a new chat window (shown, 820x760) and measures from ``show_transcript`` until the
window has been drawn (events processed, the window rendered): the target is 0.3 s. Beside it,
the cost of drawing messages one by one (200 of them, eagerly), scaled to N: what drawing the whole
conversation at once would take. Runs offscreen unless QT_QPA_PLATFORM says otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

TARGET_S = 0.3
ANSWER = ("Use **slicing** or `reversed()`:\n\n```python\nitems = [1, 2, 3]\nprint(items[::-1])\n```\n\n"
          "Slicing makes a new list; `reversed()` gives an iterator.")


def transcript(n: int):
    from slotkeeper.core.sessions.transcripts import CHAT, Message, Transcript

    msgs = [Message("system", "You are a helpful assistant.")]
    for i in range((n - 1) // 2):
        msgs.append(Message("user",
                            f"Question {i}: how do I reverse a list in Python, and which way is faster?"))
        msgs.append(Message("assistant", f"Answer {i}. {ANSWER}"))
    return Transcript(CHAT, tuple(msgs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="slotkeeper-bench-") as home:
        os.environ["SLOTKEEPER_HOME"] = home
        from PySide6.QtWidgets import QApplication

        app = QApplication([])
        from slotkeeper.core.basics.paths import app_paths
        from slotkeeper.core.engine import Engine
        from slotkeeper.core.settings import Settings
        from slotkeeper.gui.bridge import EngineBridge
        from slotkeeper.gui.chat.chat_window import ChatWindow

        engine = Engine(app_paths(), Settings())
        bridge = EngineBridge(engine, watch_sessions=False)
        t = transcript(args.messages + 1)
        times, drawn = [], []
        for _ in range(args.runs):
            w = ChatWindow(bridge)
            w.resize(820, 760)
            w.show()
            app.processEvents()
            start = time.perf_counter()
            w.show_transcript(t)
            app.processEvents()
            w.grab()  # the window drawn, as it is now
            times.append(time.perf_counter() - start)
            drawn.append(w.view.rendered)
            w.close()
            w.deleteLater()
            app.processEvents()

        # Eagerly: 200 messages drawn one after the other, scaled to the whole conversation.
        w = ChatWindow(bridge)
        w.resize(820, 760)
        w.show()
        w.show_transcript(t)
        app.processEvents()
        before = w.view.rendered
        start = time.perf_counter()
        w.view.draw_earlier(200)
        app.processEvents()
        w.grab()
        per_message = (time.perf_counter() - start) / (w.view.rendered - before)
        w.close()
        bridge.close()
        engine.close(save=False)

    n = len(t.messages)
    median, worst = statistics.median(times), max(times)
    print(f"chat window, {n:,} messages, {args.runs} runs ({os.environ['QT_QPA_PLATFORM']}):")
    print(f"  first screen: median {median * 1000:.0f} ms, worst {worst * 1000:.0f} ms "
          f"(the first run includes loading fonts), {statistics.median(drawn):.0f} messages drawn; "
          f"target {TARGET_S * 1000:.0f} ms: {'met' if worst < TARGET_S else 'MISSED'}")
    print(f"  drawing every message at once: {per_message * 1000:.1f} ms each, ~{per_message * n:.1f} s for "
          f"all {n:,} ({per_message * n / median:.0f}x the lazy first screen)")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
