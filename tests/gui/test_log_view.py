"""The log view: appending, following, searching with highlights."""

from __future__ import annotations

import pytest

from slotkeeper.gui.log_view import LogView


@pytest.fixture
def view(qtbot):
    v = LogView(max_lines=100)
    qtbot.addWidget(v)
    v.resize(600, 300)
    v.show()
    return v


def test_append_keeps_at_most_max_lines(view):
    view.append_lines([f"line {i}" for i in range(150)])
    text = view.plain_text().splitlines()
    assert len(text) == 100
    assert text[-1] == "line 149"


def test_follow_keeps_the_end_in_view(view):
    view.append_lines([f"line {i}" for i in range(80)])
    bar = view.text.verticalScrollBar()
    assert bar.value() == bar.maximum()
    view.follow.setChecked(False)
    bar.setValue(0)
    view.append_lines(["more"])
    assert bar.value() == 0


def test_search_counts_highlights_and_wraps(qtbot, view):
    view.append_lines(["srv load_model: loading", "slot 0 | task 1 | prompt", "slot 1 | task 2",
                       "Slot upper case"])
    with qtbot.waitSignal(view.matchesChanged) as blocker:
        view.search.setText("slot")
    assert blocker.args == [3]  # case-insensitive by default
    assert view.count_label.text() == "3 matches"
    assert len(view.text.extraSelections()) == 4  # every match + the current one
    # typing starts from the newest line
    assert view.text.textCursor().block().text() == "Slot upper case"
    assert view.find_previous()
    assert view.text.textCursor().block().text() == "slot 1 | task 2"
    assert view.find_next()
    assert view.find_next()  # wraps to the first
    assert view.text.textCursor().block().text() == "slot 0 | task 1 | prompt"
    assert not view.follow.isChecked()

    view.case.setChecked(True)
    assert view.match_count == 2
    view.search.setText("nothing like this")
    assert view.count_label.text() == "no match"
    assert not view.next_button.isEnabled()
    assert not view.find_next()
    view.search.clear()
    assert view.text.extraSelections() == []


def test_new_lines_are_highlighted_while_searching(view):
    view.search.setText("error")
    assert view.match_count == 0
    view.append_lines(["an error happened"])
    assert view.match_count == 1


def test_the_idle_heartbeat_is_hidden_in_the_view_and_kept_in_the_file(tmp_path, view):
    """llama-server at -lv 4 says "all slots are idle" twice a second: the view shows the rest."""
    from slotkeeper.core.server.logfile import LogTailer

    log = tmp_path / "llama-server.log"
    log.write_text("")
    tailer = LogTailer(log)
    shown: list[str] = []
    tailer.add_listener(shown.append)
    lines = ["0.01.000.001 I srv  load_model: loaded",
             "0.01.500.002 D srv  update_slots: all slots are idle",
             "0.02.000.003 I slot launch_slot_: id  0 | task 5 | processing task",
             "0.02.500.004 D srv  update_slots: all slots are idle"]
    with open(log, "a") as f:
        f.write("\n".join(lines) + "\n")
    assert tailer.poll() and not tailer.poll()  # it grew, then nothing new
    view.append_lines(shown)
    assert view.plain_text().splitlines() == [lines[0], lines[2]]
    view.set_lines(tailer.lines())
    assert "all slots are idle" not in view.plain_text()
    assert log.read_text().count("all slots are idle") == 2  # the file keeps them


def test_long_lines_wrap_instead_of_scrolling_sideways(qtbot, view):
    view.append_lines(["srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200 " + "x" * 400])
    assert view.text.horizontalScrollBar().maximum() == 0, "nothing hidden to the right"


def test_lines_of_an_earlier_run_say_so(view):
    view.set_lines(["old line 1", "old line 2"], note="——— llama-server's earlier run ———")
    assert view.plain_text().splitlines() == ["——— llama-server's earlier run ———", "old line 1",
                                              "old line 2"]
    view.set_lines([], note="——— nothing ———")
    assert view.plain_text() == ""
