"""The sessions table model and its filter."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gui_helpers import OTHER_SHA, base_sidecar, facts_for, make_session
from PySide6.QtCore import Qt

from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.gui.sessions_model import (
    COLUMN,
    ENTRY_ROLE,
    RESTORABLE_ROLE,
    SORT_ROLE,
    SessionsFilterProxy,
    SessionsTableModel,
    relative_time,
    swa_mode,
)

D = Qt.ItemDataRole.DisplayRole
T = Qt.ItemDataRole.ToolTipRole


@pytest.fixture
def store(tmp_path):
    d = tmp_path / "sessions"
    make_session(d, "aaaaaaaaaaaa", title="Rust borrow checker", age_hours=2, size=4096,
                 flash_attn=True, cache_type_k="q8_0", cache_type_v="q8_0")
    make_session(d, "bbbbbbbbbbbb", title="Gemma chat", age_hours=30, size=8192, pinned=True,
                 swa=True, swa_full=True, model_path="/m/gemma-2-9b.gguf", arch="gemma2",
                 restore_mode="exact")
    make_session(d, "cccccccccccc", title="Old Gemma chat", age_hours=0.01, size=1024,
                 swa=True, swa_full=False, model_sha256=OTHER_SHA, model_path="C:\\models\\other.gguf",
                 restore_mode="never")
    (d / "dddddddddddd.json").write_text("{not json")
    return SessionStore(d)


def cell(model, row, key, role=D):
    return model.data(model.index(row, COLUMN[key]), role)


def test_rows_and_columns(qtbot, store):
    model = SessionsTableModel()
    model.set_listing(store.listing(), None)
    assert model.rowCount() == 4
    assert model.columnCount() == 10
    assert model.headerData(1, Qt.Orientation.Horizontal, D) == "In slot"
    assert model.headerData(0, Qt.Orientation.Horizontal, D) == "Title"
    rows = {model.entry(r).id: r for r in range(model.rowCount())}
    a, b, c, d = (rows[k] for k in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd"))
    assert cell(model, a, "title") == "Rust borrow checker"
    assert cell(model, a, "model") == "Qwen3-8B-Q4_K_M.gguf"
    assert cell(model, c, "model") == "other.gguf"  # a Windows path from another machine
    assert cell(model, a, "tokens") == "5,012"
    assert cell(model, a, "size") == "4.0 KiB"
    assert "flash attention on, cache q8_0" in cell(model, a, "model", T)
    assert "full attention" in cell(model, a, "model", T)
    assert "sliding window + swa-full" in cell(model, b, "model", T)
    assert "re-reads the whole conversation" in cell(model, c, "model", T)
    assert cell(model, a, "restore") == "works"
    assert cell(model, b, "restore") == "exact continuation only"
    assert cell(model, c, "restore") == "never helps"
    assert "computed from scratch" in cell(model, b, "restore", T)
    assert cell(model, a, "last_used") == "2 h ago"
    assert cell(model, c, "last_used") == "just now"
    assert cell(model, b, "pinned") == "pinned"
    assert cell(model, a, "pinned") == ""
    assert cell(model, a, "status") == "ok"
    assert cell(model, d, "status") == "damaged"
    assert "unreadable sidecar" in cell(model, d, "status", T)
    # no server: compatibility unknown, except for a damaged one
    assert cell(model, a, "compat") == "—"
    assert "Start the server" in cell(model, a, "compat", T)
    assert cell(model, d, "compat") == "no"
    assert cell(model, a, "size", SORT_ROLE) == 4096
    assert cell(model, a, "title", ENTRY_ROLE).id == "aaaaaaaaaaaa"


def test_compatibility_with_the_running_server(qtbot, store):
    model = SessionsTableModel()
    facts = facts_for(base_sidecar())
    model.set_listing(store.listing(), facts)
    rows = {model.entry(r).id: r for r in range(model.rowCount())}
    a, b, c = rows["aaaaaaaaaaaa"], rows["bbbbbbbbbbbb"], rows["cccccccccccc"]
    assert cell(model, a, "compat") == "yes"
    assert cell(model, a, "title", RESTORABLE_ROLE) is True
    # b was saved with --swa-full; the server runs without it
    assert cell(model, b, "compat") == "no"
    assert "--swa-full" in cell(model, b, "compat", T)
    assert "different model" in cell(model, c, "compat", T)
    assert cell(model, c, "compat") == "other model"  # resumed by switching to its model
    assert cell(model, c, "title", RESTORABLE_ROLE) is False

    changed = []
    model.dataChanged.connect(lambda *_: changed.append(1))
    model.set_facts(replace(facts, cache_type_k="f16"))
    assert changed
    assert "K cache type q8_0; the server uses f16" in cell(model, a, "compat", T)
    # the other flash attention is no reason: the save is carried over to its V layout when restored
    model.set_facts(replace(facts, flash_attn=not facts.flash_attn))
    assert cell(model, a, "compat") == "yes"


def test_filter_matches_every_word_in_title_model_or_id(qtbot, store):
    model = SessionsTableModel()
    model.set_listing(store.listing(), None)
    proxy = SessionsFilterProxy()
    proxy.setSourceModel(model)
    proxy.set_filter_text("gemma")
    assert proxy.rowCount() == 2
    proxy.set_filter_text("GEMMA old")
    assert proxy.rowCount() == 1
    assert proxy.index(0, 0).data(ENTRY_ROLE).id == "cccccccccccc"
    proxy.set_filter_text("other.gguf")
    assert proxy.rowCount() == 1
    proxy.set_filter_text("aaaaaaaa")
    assert proxy.rowCount() == 1
    proxy.set_filter_text("")
    assert proxy.rowCount() == 4


def test_sorting_uses_raw_values(qtbot, store):
    model = SessionsTableModel()
    model.set_listing(store.listing(), None)
    proxy = SessionsFilterProxy()
    proxy.setSourceModel(model)
    proxy.sort(COLUMN["size"], Qt.SortOrder.DescendingOrder)
    sizes = [proxy.index(r, COLUMN["size"]).data(SORT_ROLE) for r in range(proxy.rowCount())]
    assert sizes == sorted(sizes, reverse=True)
    proxy.sort(COLUMN["last_used"], Qt.SortOrder.DescendingOrder)
    assert proxy.index(0, 0).data(ENTRY_ROLE).id == "cccccccccccc"


def test_helpers():
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 11, 4, 12, tzinfo=timezone.utc)
    ts = now.timestamp()
    assert relative_time((now - timedelta(seconds=5)).timestamp(), ts) == "just now"
    assert relative_time((now - timedelta(minutes=7)).timestamp(), ts) == "7 min ago"
    assert relative_time((now - timedelta(days=1, hours=2)).timestamp(), ts) == "yesterday"
    assert relative_time((now - timedelta(days=12)).timestamp(), ts) == "12 days ago"
    assert relative_time((now - timedelta(days=90)).timestamp(), ts).count("-") == 2
    sc = base_sidecar()
    assert swa_mode(sc) == "full attention"


def test_conversations_group_continuations_and_put_forks_under_their_parent(qtbot, tmp_path):
    d = tmp_path / "sessions"
    make_session(d, "aaaaaaaaaaaa", title="Rivers", age_hours=3, pinned=True, n_tokens=100)
    # written before the "continues" key: the longer save of a pinned parent with its title
    make_session(d, "bbbbbbbbbbbb", title="Rivers", age_hours=2, parent="aaaaaaaaaaaa", n_tokens=200)
    make_session(d, "cccccccccccc", title="Rivers", age_hours=1, parent="bbbbbbbbbbbb", n_tokens=150)
    make_session(d, "dddddddddddd", title="Lakes", age_hours=1, parent="eeeeeeeeeeee")  # parent gone
    model = SessionsTableModel()
    model.set_listing(SessionStore(d).listing(), None)
    assert model.rowCount() == 2
    rivers = model.row_of("aaaaaaaaaaaa")
    assert model.row_of("bbbbbbbbbbbb") == rivers == model.row_of("cccccccccccc")
    assert model.entry(rivers).id == "bbbbbbbbbbbb"
    assert cell(model, rivers, "tokens") == "200" and cell(model, rivers, "size") == "8.0 KiB"
    top = model.index(rivers, 0)
    assert model.rowCount(top) == 1 and model.index(0, 0, top).data(ENTRY_ROLE).id == "cccccccccccc"
    assert model.parent(model.index(0, 0, top)) == top
    assert "A branch" in model.index(0, 0, top).data(T)
    proxy = SessionsFilterProxy()
    proxy.setSourceModel(model)
    proxy.set_filter_text("cccccccccccc")
    assert proxy.rowCount() == 1 and proxy.rowCount(proxy.index(0,
                                                                0)) == 1, "a matching branch keeps its parent"


def test_a_conversation_found_by_content_in_any_of_its_saves_stays_listed(qtbot, tmp_path):
    d = tmp_path / "sessions"
    make_session(d, "aaaaaaaaaaaa", title="Rivers", age_hours=3, pinned=True, n_tokens=100)
    make_session(d, "bbbbbbbbbbbb", title="Rivers", age_hours=2, parent="aaaaaaaaaaaa", n_tokens=200,
                 continues=True, pinned=True)
    make_session(d, "cccccccccccc", title="Lakes", age_hours=1)
    model = SessionsTableModel()
    model.set_listing(SessionStore(d).listing(), None)
    proxy = SessionsFilterProxy()
    proxy.setSourceModel(model)
    proxy.set_filter_text("kingfisher")  # said in the snapshot; no title or id holds it
    assert proxy.rowCount() == 0
    proxy.set_found_ids(["aaaaaaaaaaaa"])  # the search by content found the older save
    assert proxy.rowCount() == 1
    assert proxy.index(0, 0).data(ENTRY_ROLE).id == "bbbbbbbbbbbb"  # the row of its conversation
