"""The services the GUI and the CLI share: settings (saved vs this run's overrides) and sessions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slotkeeper.core.services.sessions import SessionInUse, SessionsService
from slotkeeper.core.services.settings import SettingsService, field_names, get_field, with_field
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.settings import Settings, SettingsError, load_settings, save_settings

FIXTURE = Path(__file__).parent.parent / "data" / "sidecar_v1.json"


# -- settings ---------------------------------------------------------------------------------
def test_dotted_names_cover_every_setting():
    names = field_names(Settings())
    assert "profile.port" in names and "budget_bytes" in names and "schema_version" not in names
    s = with_field(Settings(), "profile.port", 9001)
    assert get_field(s, "profile.port") == 9001 and s.profile.ctx == Settings().profile.ctx


def test_overrides_apply_to_this_run_only(tmp_path):
    path = tmp_path / "settings.json"
    save_settings(path, Settings(budget_bytes=5 * 1024**3).with_profile(port=8000))
    service = SettingsService(path, {"profile.port": 9000, "idle_save_seconds": 1.0})
    run = service.effective()
    assert run.profile.port == 9000 and run.idle_save_seconds == 1.0 and run.budget_bytes == 5 * 1024**3
    assert "profile.port" in service.overrides and "profile.ctx" not in service.overrides
    assert load_settings(path).profile.port == 8000


def test_saving_keeps_overrides_out_of_the_file_unless_changed_there(tmp_path):
    path = tmp_path / "settings.json"
    save_settings(path, Settings().with_profile(port=8000))
    service = SettingsService(path, {"profile.port": 9000, "profile.ctx": 4096})
    chosen = service.effective().with_profile(flash_attn=True, ctx=16384)  # the user changed ctx, not port
    run = service.save(chosen)
    on_disk = load_settings(path)
    assert on_disk.profile.port == 8000, "an override is never written back"
    assert on_disk.profile.flash_attn is True
    assert on_disk.profile.ctx == 16384, "a value changed in the dialog is the user's choice"
    assert run.profile.port == 9000 and run.profile.ctx == 16384
    assert "profile.ctx" not in service.overrides and "profile.port" in service.overrides


def test_update_and_unknown_names(tmp_path):
    service = SettingsService(tmp_path / "settings.json", {"budget_bytes": 1024**3})
    run = service.update(service.effective(), profile__model_path="/models/a.gguf")
    assert run.profile.model_path == "/models/a.gguf" and run.budget_bytes == 1024**3
    assert load_settings(tmp_path / "settings.json").budget_bytes == Settings().budget_bytes
    with pytest.raises(ValueError, match="unknown settings"):
        SettingsService(tmp_path / "x.json", {"profile.no_such": 1})


def test_an_unreadable_file_is_an_error_for_reading_and_replaced_by_an_explicit_save(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{ not json")
    service = SettingsService(path)
    with pytest.raises(SettingsError):
        service.effective()
    service.save(Settings().with_profile(ctx=4096))
    assert load_settings(path).profile.ctx == 4096


# -- sessions ---------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path) -> SessionStore:
    s = SessionStore(tmp_path / "sessions")
    for sid, used, size in (("aaaaaaaaaaaa", "2026-01-01T00:00:00Z", 1000),
                            ("bbbbbbbbbbbb", "2026-02-01T00:00:00Z", 1000),
                            ("cccccccccccc", "2026-03-01T00:00:00Z", 1000)):
        data = json.loads(FIXTURE.read_text())
        data.update(id=sid, kv_file=f"{sid}.00000000.kv", last_used_at=used, created_at=used, size_bytes=size,
                    pinned=False, parent=None, last_restore=None)
        (s.dir / f"{sid}.json").write_text(json.dumps(data))
        (s.dir / data["kv_file"]).write_bytes(b"\0" * size)
    return s


def test_delete_refuses_a_session_in_a_slot(store):
    in_slots = {"bbbbbbbbbbbb"}
    service = SessionsService(store, in_slots=lambda: in_slots, budget=lambda: 10**9)
    with pytest.raises(SessionInUse, match="loaded in a slot"):
        service.delete("bbbbbbbbbbbb")
    service.delete("aaaaaaaaaaaa")
    assert [e.id for e in service.listing().sessions] == ["cccccccccccc", "bbbbbbbbbbbb"]


def test_prune_takes_the_least_recently_used_but_never_one_in_a_slot(store):
    in_slots = {"aaaaaaaaaaaa"}  # the oldest, but loaded in a slot
    service = SessionsService(store, in_slots=lambda: in_slots, budget=lambda: 2000)
    preview = service.prune(dry_run=True)
    assert [c.id for c in preview.plan.delete] == ["bbbbbbbbbbbb"] and preview.result is None
    assert len(service.listing().sessions) == 3, "a dry run deletes nothing"
    outcome = service.prune()
    assert outcome.result.deleted == ["bbbbbbbbbbbb"]
    assert {e.id for e in service.listing().sessions} == {"aaaaaaaaaaaa", "cccccccccccc"}


def test_prune_checks_the_slots_again_right_before_each_delete(store):
    calls = {"n": 0}

    def in_slots():
        calls["n"] += 1
        return set() if calls["n"] == 1 else {"aaaaaaaaaaaa"}  # restored between plan and delete

    service = SessionsService(store, in_slots=in_slots, budget=lambda: 1500)
    outcome = service.prune()
    assert [sid for sid, _ in outcome.result.failed] == ["aaaaaaaaaaaa"]
    assert "aaaaaaaaaaaa" in {e.id for e in service.listing().sessions}


def test_pin_and_verify_go_through(store):
    service = SessionsService(store, in_slots=set, budget=lambda: 10**9)
    assert service.set_pinned("cccccccccccc", True).changed[0].sidecar.pinned
    entry = service.verify("cccccccccccc")
    assert entry.status == "corrupt" and "hash" in entry.problems[0]  # the fixture's hash is not these bytes
    shutil.rmtree(store.dir)


def test_session_changes_apply_to_a_listing_in_place():
    from slotkeeper.core.services.sessions import SessionChanges
    from slotkeeper.core.sessions.entries import Listing

    class E:
        def __init__(self, id, v):
            self.id, self.v = id, v

    a, b, c = E("a", 1), E("b", 1), E("c", 1)
    listing = Listing([a, b, c], ["x"])
    out = SessionChanges(changed=(E("b", 2),), removed=("c",)).apply(listing)
    assert [(e.id, e.v) for e in out.sessions] == [("a", 1), ("b", 2)] and out.unmanaged == ["x"]
    assert [e.id for e in listing.sessions] == ["a", "b", "c"]  # the listing given is left as it was
    assert SessionChanges(changed=(E("z", 1),)).apply(listing).sessions == [a, b, c]  # not listed: not added
    assert SessionChanges(changed=(E("b", 2),), removed=("c",)).ids == {"b", "c"}
