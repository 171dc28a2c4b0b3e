"""The sidecar schema: validation, migrations, atomic files, compatibility rules."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import struct
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import xxhash

from slotkeeper.core.sessions import sidecar as sidecar_module
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.sidecar import (
    MIGRATIONS,
    OPTIONAL_DEFAULTS,
    SCHEMA_VERSION,
    RestoreRecord,
    Sidecar,
    SidecarError,
    content_hash_file,
    format_utc,
    load_sidecar,
    migrate,
    new_session_id,
    parse_utc,
    tokens_digest,
    write_sidecar_atomic,
)

DATA = Path(__file__).resolve().parent.parent / "data"
SHA_A = "1a2b3c4d" + "a" * 56
SHA_B = "5e6f7a8b" + "b" * 56


def make_sidecar(**changes: Any) -> Sidecar:
    base = Sidecar(
        id="0123456789ab",
        kv_file="0123456789ab.kv",
        title="A chat",
        preview="Hello there",
        model_path="/models/model.gguf",
        model_sha256=SHA_A,
        arch="llama",
        swa=False,
        swa_full=False,
        flash_attn=True,
        cache_type_k="f16",
        cache_type_v="f16",
        n_parallel=1,
        kv_unified=False,
        n_ctx_slot=4096,
        n_tokens=1001,
        tokens_digest="0123456789abcdef",
        size_bytes=1_000_000,
        content_hash="xxh3_128:" + "f" * 32,
        llama_build="b11434",
        created_at="2026-11-01T10:00:00Z",
        last_used_at="2026-11-02T10:00:00.250000Z",
    )
    return dataclasses.replace(base, **changes)


def make_facts(**changes: Any) -> ServerFacts:
    base = ServerFacts(
        model_sha256=SHA_A,
        model_path="/other/place/model.gguf",
        flash_attn=True,
        cache_type_k="f16",
        cache_type_v="f16",
        swa_full=False,
        n_parallel=1,
        n_ctx_slot=4096,
        swa=False,
    )
    return dataclasses.replace(base, **changes)


def valid_json(**changes: Any) -> dict[str, Any]:
    d = make_sidecar().to_json()
    d.update(changes)
    return d


# --- round trips -------------------------------------------------------------


def test_json_round_trip() -> None:
    original = make_sidecar(
        pinned=True,
        parent="fedcba987654",
        last_restore=RestoreRecord(
            at="2026-11-02T10:00:01Z", slot=0, n_restored=1001, cache_n=None, prompt_n=None
        ),
        corrupt={"at": "2026-11-03T00:00:00Z", "reason": "content hash mismatch"},
    )
    assert Sidecar.from_json(original.to_json()) == original


def test_to_json_is_plain_json_with_schema_version_first() -> None:
    d = make_sidecar().to_json()
    assert next(iter(d)) == "schema_version"
    assert d["schema_version"] == SCHEMA_VERSION
    assert json.loads(json.dumps(d)) == d


def test_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "0123456789ab.json"
    original = make_sidecar(title="Ünïcode ✓")
    write_sidecar_atomic(path, original)
    assert load_sidecar(path) == original
    assert "Ünïcode ✓" in path.read_text(encoding="utf-8")  # readable, not \u-escaped


# --- the stored old-version files: must load forever ----------------------------


def test_loads_stored_v1_file() -> None:
    loaded = load_sidecar(DATA / "sidecar_v1.json")
    assert loaded.id == "3f9c2a7b1e04"
    assert loaded.kv_file == "3f9c2a7b1e04.kv"
    assert loaded.model_sha256.startswith("1a2b3c4d")
    assert (loaded.flash_attn, loaded.cache_type_k, loaded.n_parallel) == (True, "q8_0", 2)
    assert loaded.n_tokens == 5012
    assert loaded.tokens_digest == tokens_digest(list(range(5012)))
    assert loaded.pinned and loaded.parent == "a1b2c3d4e5f6"
    assert loaded.last_restore is not None
    assert loaded.last_restore.effective is True and loaded.last_restore.prompt_n == 37
    assert loaded.corrupt is None and loaded.extra == {}


def _as_written(d: dict[str, Any]) -> bytes:
    """The bytes ``write_sidecar_atomic`` produces for this dict."""
    return (json.dumps(d, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def test_rewriting_stored_v1_file_adds_only_the_optional_defaults(tmp_path: Path) -> None:
    # The released file predates kv_args: it comes back with exactly its own keys (after
    # any migrations) plus each optional key at its default, and nothing else changes.
    stored = json.loads((DATA / "sidecar_v1.json").read_text(encoding="utf-8"))
    assert not OPTIONAL_DEFAULTS.keys() & stored.keys()  # as released: no optional keys
    write_sidecar_atomic(tmp_path / "s.json", load_sidecar(DATA / "sidecar_v1.json"))
    rewritten = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert rewritten.keys() == migrate(stored).keys() | OPTIONAL_DEFAULTS.keys()
    assert rewritten["kv_args"] == []
    assert rewritten == {**OPTIONAL_DEFAULTS, **migrate(stored)}


@pytest.mark.skipif(SCHEMA_VERSION != 1, reason="a schema bump rewrites what its migrations change")
def test_rewriting_stored_v1_file_is_byte_identical_but_for_the_optional_defaults(tmp_path: Path) -> None:
    released = (DATA / "sidecar_v1.json").read_bytes()
    stored = json.loads(released)
    assert _as_written(stored) == released  # the stored file is in the writer's layout
    write_sidecar_atomic(tmp_path / "s.json", load_sidecar(DATA / "sidecar_v1.json"))
    # Optional keys come after the released ones, at their defaults.
    added = {k: v for k, v in OPTIONAL_DEFAULTS.items() if k not in stored}
    assert (tmp_path / "s.json").read_bytes() == _as_written({**stored, **added})


def test_loads_stored_v1_file_with_kv_args() -> None:
    loaded = load_sidecar(DATA / "sidecar_v1_kv_args.json")
    assert loaded.kv_args == ["--lora", "/home/ada/adapters/rust-tutor.gguf", "--rope-freq-scale", "0.5"]
    assert loaded.n_prompt == 1201
    assert loaded == dataclasses.replace(load_sidecar(DATA / "sidecar_v1.json"), kv_args=loaded.kv_args,
                                         n_prompt=loaded.n_prompt)


@pytest.mark.skipif(SCHEMA_VERSION != 1, reason="a schema bump rewrites what its migrations change")
@pytest.mark.parametrize("name", ["sidecar_v1_kv_args.json"])
def test_rewriting_stored_v1_files_with_optional_keys_is_byte_identical_but_for_later_keys(
    tmp_path: Path, name: str
) -> None:
    # Written by this code with the optional keys of its day set; keys added later come after
    # them at their defaults, and nothing else changes.
    stored_path = DATA / name
    stored = json.loads(stored_path.read_text(encoding="utf-8"))
    assert _as_written(stored) == stored_path.read_bytes()
    write_sidecar_atomic(tmp_path / "s.json", load_sidecar(stored_path))
    added = {k: v for k, v in OPTIONAL_DEFAULTS.items() if k not in stored}
    assert (tmp_path / "s.json").read_bytes() == _as_written({**stored, **added})


def test_loads_stored_v2_file_with_media() -> None:
    loaded = load_sidecar(DATA / "sidecar_v2_media.json")
    assert (loaded.n_media, loaded.mmproj_sha256) == (2, "9" * 64)
    plain = load_sidecar(DATA / "sidecar_v1.json")
    assert (plain.n_media, plain.mmproj_sha256) == (0, None)  # files before the keys hold text only


@pytest.mark.parametrize("bad",
                         [{"n_media": -1}, {"n_media": True}, {"mmproj_sha256": "abc"}, {"mmproj_sha256": 5}])
def test_media_keys_are_type_checked(bad: dict) -> None:
    stored = json.loads((DATA / "sidecar_v2_media.json").read_text(encoding="utf-8"))
    with pytest.raises(SidecarError):
        Sidecar.from_json({**stored, **bad})


def test_v1_files_migrate_to_a_restore_mode_from_their_architecture() -> None:
    # The released v1 file is a full-attention qwen3 session: restores work.
    assert load_sidecar(DATA / "sidecar_v1.json").restore_mode == "works"
    stored = json.loads((DATA / "sidecar_v1.json").read_text(encoding="utf-8"))
    for arch, swa, swa_full, mode in [
        ("qwen35", False, False, "exact"),  # hybrid: no checkpoints in a save file
        ("granitehybrid", False, False, "exact"),
        ("mamba", False, False, "exact"),
        ("gemma3", True, False, "never"),  # sliding window without --swa-full
        ("gemma3", True, True, "exact"),
        ("deepseek2", False, False, "works"),  # MLA
        ("some-future-arch", False, False, "unknown"),
    ]:
        migrated = Sidecar.from_json({**stored, "arch": arch, "swa": swa, "swa_full": swa_full})
        assert (arch, migrated.restore_mode, migrated.schema_version) == (arch, mode, SCHEMA_VERSION)


def test_loads_stored_v2_file() -> None:
    loaded = load_sidecar(DATA / "sidecar_v2.json")
    assert (loaded.arch, loaded.restore_mode, loaded.schema_version) == ("qwen35", "exact", SCHEMA_VERSION)
    assert (loaded.state_bytes, loaded.pieces) == (loaded.size_bytes, {})  # a whole state, no pieces
    assert loaded.last_restore is not None and loaded.last_restore.effective is None
    assert loaded.last_restore.reason and loaded.last_restore.reason.startswith("not judged")
    assert loaded.extra == {}


@pytest.mark.skipif(SCHEMA_VERSION != 2, reason="a schema bump rewrites what its migrations change")
@pytest.mark.parametrize("name", ["sidecar_v2.json", "sidecar_v2_media.json", "sidecar_v2_verified.json"])
def test_rewriting_stored_v2_file_is_byte_identical_but_for_later_keys(tmp_path: Path, name: str) -> None:
    # Optional keys added after a file was written come after its own, at their defaults.
    stored_path = DATA / name
    stored = json.loads(stored_path.read_text(encoding="utf-8"))
    assert _as_written(stored) == stored_path.read_bytes()
    write_sidecar_atomic(tmp_path / "s.json", load_sidecar(stored_path))
    added = {k: v for k, v in OPTIONAL_DEFAULTS.items() if k not in stored}
    assert (tmp_path / "s.json").read_bytes() == _as_written({**stored, **added})


def test_loads_stored_v2_file_with_a_verified_stamp() -> None:
    loaded = load_sidecar(DATA / "sidecar_v2_verified.json")
    assert loaded.verified is not None and loaded.verified.content_hash == loaded.content_hash
    assert loaded.verified.size == loaded.size_bytes
    assert load_sidecar(DATA / "sidecar_v2.json").verified is None  # before the key: hash before restoring


def test_v2_needs_a_restore_mode() -> None:
    d = valid_json()
    del d["restore_mode"]
    with pytest.raises(SidecarError, match="restore_mode: missing"):
        Sidecar.from_json(d)


# --- strict validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("n_tokens", "12", r"n_tokens: expected an integer, got str '12'"),
        ("n_tokens", 12.0, r"n_tokens: expected an integer, got float"),
        ("n_tokens", True, r"n_tokens: expected an integer, got bool"),
        ("n_tokens", -1, r"n_tokens: must be at least 0"),
        ("size_bytes", -5, r"size_bytes: must be at least 0, got -5"),
        ("n_parallel", 0, r"n_parallel: must be at least 1"),
        ("n_ctx_slot", 0, r"n_ctx_slot: must be at least 1"),
        ("id", "ab/cd", r"id: 'ab/cd' is not a URL-safe id"),
        ("id", "..", r"id: '\.\.' is not a URL-safe id"),
        ("id", "", r"id: '' is not a URL-safe id"),
        ("id", 123, r"id: expected a string, got int"),
        ("parent", "../x", r"parent: '\.\./x' is not a session id"),
        ("kv_file", "../evil.kv", r"kv_file: '\.\./evil\.kv' is not a bare file name"),
        ("kv_file", "dir/a.kv", r"kv_file: .* is not a bare file name"),
        ("kv_file", "a\\b.kv", r"kv_file: .* is not a bare file name"),
        ("kv_file", "C:a.kv", r"kv_file: .* is not a bare file name"),
        ("kv_file", ".hidden", r"kv_file: .* is not a bare file name"),
        ("kv_file", "a..kv", r"kv_file: .* is not a bare file name"),
        ("kv_file", "trailing.", r"kv_file: .* is not a bare file name"),
        ("title", None, r"title: expected a string, got NoneType"),
        ("swa", 1, r"swa: expected true/false, got int 1"),
        ("flash_attn", "auto", r"flash_attn: expected true/false, got str 'auto'"),
        ("pinned", "yes", r"pinned: expected true/false"),
        ("cache_type_k", "", r"cache_type_k: must not be empty"),
        ("model_sha256", "ABC", r"model_sha256: 'ABC' is not 64 lowercase hex digits"),
        ("model_sha256", SHA_A.upper(), r"model_sha256: .* is not 64 lowercase hex"),
        ("tokens_digest", "xyz", r"tokens_digest: 'xyz' is not 16 hex digits"),
        ("content_hash", "f" * 32, r"content_hash: .* is not 'xxh3_128:' \+ 32 hex"),
        ("content_hash", "sha256:" + "f" * 32, r"content_hash: .* is not 'xxh3_128:'"),
        ("created_at", "2026-11-01 10:00:00", r"created_at: not an ISO-8601 UTC timestamp"),
        ("created_at", "2026-11-01T10:00:00+00:00", r"created_at: not an ISO-8601 UTC"),
        (
            "last_used_at",
            "2026-13-01T10:00:00Z",
            r"last_used_at: not a valid date and time: '2026-13-01T10:00:00Z'",
        ),
        ("last_restore", [], r"last_restore: expected an object, got list"),
        ("corrupt", "yes", r"corrupt: expected an object, got str"),
        ("corrupt", {"at": "2026-11-01T10:00:00Z"}, r"corrupt\.reason: missing"),
    ],
)
def test_rejects_bad_field(key: str, value: Any, message: str) -> None:
    with pytest.raises(SidecarError, match=message):
        Sidecar.from_json(valid_json(**{key: value}))


@pytest.mark.parametrize("key", [k for k in make_sidecar().to_json()
                                 if k != "schema_version" and k not in OPTIONAL_DEFAULTS])
def test_every_field_is_required(key: str) -> None:
    d = valid_json()
    del d[key]
    with pytest.raises(SidecarError, match=rf"^{key}: missing$"):
        Sidecar.from_json(d)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"slot": -1}, r"last_restore\.slot: must be at least 0"),
        ({"n_restored": "5"}, r"last_restore\.n_restored: expected an integer"),
        ({"cache_n": -3}, r"last_restore\.cache_n: must be at least 0"),
        ({"effective": "no"}, r"last_restore\.effective: expected true/false"),
        ({"reason": 5}, r"last_restore\.reason: expected a string"),
        ({"at": "yesterday"}, r"last_restore\.at: not an ISO-8601"),
    ],
)
def test_rejects_bad_restore_record(changes: dict[str, Any], message: str) -> None:
    record = RestoreRecord(at="2026-11-02T10:00:01Z", slot=0, n_restored=10).to_json()
    record.update(changes)
    with pytest.raises(SidecarError, match=message):
        Sidecar.from_json(valid_json(last_restore=record))


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(SidecarError, match="sidecar: expected an object, got list"):
        Sidecar.from_json([])  # type: ignore[arg-type]


# --- schema versions and migrations ----------------------------------------------


def test_newer_schema_is_refused_with_a_clear_message() -> None:
    with pytest.raises(SidecarError) as excinfo:
        Sidecar.from_json(valid_json(schema_version=7))
    assert (
        str(excinfo.value) == "saved by a newer Slotkeeper (schema 7); this version reads up to "
                              f"{SCHEMA_VERSION}"
    )


def test_missing_schema_version() -> None:
    d = valid_json()
    del d["schema_version"]
    with pytest.raises(SidecarError, match="^schema_version: missing$"):
        Sidecar.from_json(d)


@pytest.mark.parametrize("version", ["1", 1.0, True, -1, None])
def test_schema_version_must_be_a_non_negative_integer(version: Any) -> None:
    with pytest.raises(SidecarError, match="schema_version"):
        Sidecar.from_json(valid_json(schema_version=version))


def _fake_v0(d_v1: dict[str, Any]) -> dict[str, Any]:
    """A v1 sidecar as an imagined schema 0 would have stored it."""
    d = dict(d_v1)
    d["schema_version"] = 0
    d["name"] = d.pop("title")
    del d["pinned"]
    return d


def _migrate_v0_to_v1(d: dict[str, Any]) -> dict[str, Any]:
    d["title"] = d.pop("name")
    d["pinned"] = False
    d["schema_version"] = 1
    return d


def test_old_schema_goes_through_the_migration_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MIGRATIONS, 0, _migrate_v0_to_v1)
    expected = make_sidecar(title="Old title")
    migrated = Sidecar.from_json(_fake_v0(expected.to_json()))
    assert migrated == expected
    assert migrated.schema_version == SCHEMA_VERSION


def test_migration_does_not_mutate_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MIGRATIONS, 0, _migrate_v0_to_v1)
    old = _fake_v0(make_sidecar().to_json())
    snapshot = json.loads(json.dumps(old))
    Sidecar.from_json(old)
    assert old == snapshot


def test_migrations_chain_over_several_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sidecar_module, "SCHEMA_VERSION", 3)
    steps: list[int] = []

    def step(frm: int):
        def bump(d: dict[str, Any]) -> dict[str, Any]:
            steps.append(frm)
            return {**d, "schema_version": frm + 1, f"added_in_{frm + 1}": True}

        return bump

    monkeypatch.setitem(MIGRATIONS, 1, step(1))
    monkeypatch.setitem(MIGRATIONS, 2, step(2))
    result = migrate(valid_json(schema_version=1))
    assert steps == [1, 2]
    assert result["schema_version"] == 3 and result["added_in_2"] and result["added_in_3"]


def test_missing_migration_is_an_error() -> None:
    assert 0 not in MIGRATIONS
    with pytest.raises(SidecarError, match="schema 0 is too old: no migration to 1"):
        Sidecar.from_json(valid_json(schema_version=0))


def test_migration_that_forgets_to_bump_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MIGRATIONS, 0, lambda d: d)
    with pytest.raises(SidecarError, match="did not produce 1"):
        Sidecar.from_json(valid_json(schema_version=0))


# --- forward compatibility ---------------------------------------------------------


def test_unknown_keys_survive_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    future_restore = {**RestoreRecord("2026-11-02T10:00:01Z", 1, 5).to_json(), "ms": 12.5}
    d = valid_json(future_key={"nested": [1, 2]}, last_restore=future_restore)
    path.write_text(json.dumps(d), encoding="utf-8")

    loaded = load_sidecar(path)
    assert loaded.extra == {"future_key": {"nested": [1, 2]}}
    assert loaded.last_restore is not None and loaded.last_restore.extra == {"ms": 12.5}

    loaded.pinned = True
    write_sidecar_atomic(path, loaded)
    rewritten = json.loads(path.read_text(encoding="utf-8"))
    assert rewritten["future_key"] == {"nested": [1, 2]}
    assert rewritten["last_restore"]["ms"] == 12.5
    assert rewritten["pinned"] is True


def test_extra_never_overrides_a_known_key() -> None:
    sidecar = make_sidecar(extra={"title": "stale", "other": 1})
    d = sidecar.to_json()
    assert d["title"] == "A chat" and d["other"] == 1


# --- files -------------------------------------------------------------------------


def test_load_reports_invalid_json_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema_version": 1,', encoding="utf-8")
    with pytest.raises(SidecarError, match="^broken.json: not valid JSON"):
        load_sidecar(path)


def test_load_reports_binary_garbage(tmp_path: Path) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SidecarError, match="^garbage.json: not valid JSON"):
        load_sidecar(path)


def test_load_prefixes_validation_errors_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(valid_json(n_tokens="12")), encoding="utf-8")
    with pytest.raises(SidecarError, match="^s.json: n_tokens: expected an integer"):
        load_sidecar(path)


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_written_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_sidecar_atomic(path, make_sidecar())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_sidecar_atomic(path, make_sidecar(title="first"))
    write_sidecar_atomic(path, make_sidecar(title="second"))
    assert load_sidecar(path).title == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_failed_replace_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.json"
    write_sidecar_atomic(path, make_sidecar(title="old"))

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(sidecar_module.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_sidecar_atomic(path, make_sidecar(title="new"))
    assert load_sidecar(path).title == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_write_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(sidecar_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    write_sidecar_atomic(tmp_path / "s.json", make_sidecar())
    assert len(synced) == (1 if os.name == "nt" else 2)


def test_write_refuses_a_sidecar_it_could_not_read_back(tmp_path: Path) -> None:
    with pytest.raises(SidecarError, match="id: '../x' is not a URL-safe id"):
        write_sidecar_atomic(tmp_path / "s.json", make_sidecar(id="../x"))
    assert list(tmp_path.iterdir()) == []


# --- field formats -------------------------------------------------------------------


def test_new_session_id_is_12_hex_and_valid() -> None:
    ids = {new_session_id() for _ in range(100)}
    assert len(ids) == 100
    for session_id in ids:
        assert len(session_id) == 12 and int(session_id, 16) >= 0
        Sidecar.from_json(valid_json(id=session_id))


def test_tokens_digest_is_xxh3_64_of_little_endian_i32() -> None:
    tokens = [1, 2, 3, 151643]
    expected = xxhash.xxh3_64_hexdigest(struct.pack("<4i", *tokens))
    assert tokens_digest(tokens) == expected
    assert len(expected) == 16
    assert tokens_digest([]) == xxhash.xxh3_64_hexdigest(b"")


def test_content_hash_file(tmp_path: Path) -> None:
    path = tmp_path / "a.kv"
    payload = os.urandom(9 << 20)  # spans several read chunks
    path.write_bytes(payload)
    assert content_hash_file(path) == "xxh3_128:" + xxhash.xxh3_128_hexdigest(payload)
    Sidecar.from_json(valid_json(content_hash=content_hash_file(path)))


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 11, 3, 14, 5, 9, tzinfo=timezone.utc),
        datetime(2026, 11, 3, 14, 5, 9, 123456, tzinfo=timezone.utc),
        datetime(2026, 11, 3, 15, 5, 9, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_utc_timestamps_round_trip(moment: datetime) -> None:
    text = format_utc(moment)
    assert text.endswith("Z")
    assert parse_utc(text) == moment


def test_parse_utc_accepts_short_fractions() -> None:
    # Other writers (and Python 3.10's fromisoformat) disagree on fraction lengths.
    assert parse_utc("2026-11-03T14:05:09.5Z").microsecond == 500000
    assert parse_utc("2026-11-03T14:05:09.123Z").microsecond == 123000


def test_format_utc_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        format_utc(datetime(2026, 1, 1))


# --- compatibility -------------------------------------------------------------------


def test_matching_server_is_compatible() -> None:
    assert check_compatible(make_sidecar(), make_facts()) == []


@pytest.mark.parametrize(
    ("sidecar_changes", "facts_changes", "reason"),
    [
        (
            {"cache_type_k": "q8_0"},
            {},
            "saved with K cache type q8_0; the server uses f16",
        ),
        (
            {"cache_type_v": "q4_0"},
            {"cache_type_v": "q8_0"},
            "saved with V cache type q4_0; the server uses q8_0",
        ),
        (
            {"n_parallel": 2},
            {"n_parallel": 1},
            "saved with 2 slots (-np 2); the server runs 1",
        ),
        (
            {"kv_unified": True},
            {},
            "saved with a unified KV cache; the server's is per slot",
        ),
        (
            {"model_sha256": SHA_A, "model_path": "/m/model.gguf"},
            {"model_sha256": SHA_B, "model_path": "/m/other.gguf"},
            "saved for a different model (model.gguf, sha256 1a2b3c4d…); the server runs other.gguf",
        ),
        (
            {"model_sha256": SHA_A, "model_path": "C:\\models\\model.gguf"},
            {"model_sha256": SHA_B, "model_path": "/m/model.gguf"},
            (
                "saved for a different model (model.gguf, sha256 1a2b3c4d…); "
                "the server runs model.gguf (sha256 5e6f7a8b…)"
            ),
        ),
        (
            {"n_tokens": 5000, "n_ctx_slot": 8192},
            {"n_ctx_slot": 2048},
            "needs 5000 tokens of context per slot; the server's slots have 2048",
        ),
        (
            {"swa": True, "swa_full": True},
            {"swa": True, "swa_full": False},
            "saved with --swa-full; the server runs without it",
        ),
        (
            {"swa": True, "swa_full": False},
            {"swa": True, "swa_full": True},
            "saved without --swa-full; the server runs with it",
        ),
    ],
)
def test_incompatibility_reasons(
    sidecar_changes: dict[str, Any], facts_changes: dict[str, Any], reason: str
) -> None:
    reasons = check_compatible(make_sidecar(**sidecar_changes), make_facts(**facts_changes))
    assert reasons == [reason]


def test_larger_context_on_the_server_is_fine() -> None:
    sidecar = make_sidecar(n_ctx_slot=4096, n_tokens=4000)
    assert check_compatible(sidecar, make_facts(n_ctx_slot=32768)) == []


def test_smaller_context_that_still_holds_the_tokens_is_fine() -> None:
    # Restore needs a cell per saved token, not the context the file was saved from.
    sidecar = make_sidecar(n_ctx_slot=8192, n_tokens=1000)
    assert check_compatible(sidecar, make_facts(n_ctx_slot=2048)) == []


def test_tokens_exactly_filling_the_slot_are_fine() -> None:
    assert check_compatible(make_sidecar(n_tokens=4096), make_facts(n_ctx_slot=4096)) == []


def test_swa_full_is_ignored_for_models_without_sliding_window() -> None:
    sidecar = make_sidecar(swa=False, swa_full=True)
    assert check_compatible(sidecar, make_facts(swa_full=False)) == []
    sidecar = make_sidecar(swa=False, swa_full=False)
    assert check_compatible(sidecar, make_facts(swa_full=True)) == []


def test_flash_attention_is_no_reason_a_restore_carries_it_over() -> None:
    for saved in (True, False):
        assert check_compatible(make_sidecar(flash_attn=saved), make_facts(flash_attn=not saved)) == []


def test_all_reasons_are_reported_together() -> None:
    sidecar = make_sidecar(cache_type_k="q8_0", n_parallel=2, kv_unified=True, n_tokens=9000)
    reasons = check_compatible(sidecar, make_facts(model_sha256=SHA_B))
    assert len(reasons) == 5
    assert reasons[0].startswith("saved for a different model")


def test_optional_keys_default_when_absent_and_are_validated() -> None:
    d = valid_json()
    del d["kv_args"]
    assert Sidecar.from_json(d).kv_args == []
    with pytest.raises(SidecarError, match="kv_args"):
        Sidecar.from_json(valid_json(kv_args="--lora x"))


def test_restore_record_explains_effective_with_the_engines_rule() -> None:
    # The engine judges a restore; the schema's docstring must say by which rule.
    from slotkeeper.core.engine.slots.board import EFFECTIVE_REUSE_SHARE

    doc = " ".join((RestoreRecord.__doc__ or "").split())
    assert "cache_n >= EFFECTIVE_REUSE_SHARE * n_restored" in doc
    assert f"the share being {EFFECTIVE_REUSE_SHARE}" in doc


# --- images: the projector decides ---------------------------------------------

SHA_PROJ, SHA_PROJ_B = "c" * 64, "d" * 64


def test_a_text_session_restores_with_or_without_a_projector() -> None:
    sc = make_sidecar(mmproj_sha256=SHA_PROJ)  # saved with a projector loaded, no image in it
    assert check_compatible(sc, make_facts()) == []
    assert check_compatible(sc, make_facts(mmproj_sha256=SHA_PROJ_B)) == []
    assert check_compatible(make_sidecar(), make_facts(mmproj_sha256=SHA_PROJ)) == []


def test_an_image_session_needs_the_projector_that_read_its_images() -> None:
    sc = make_sidecar(n_media=1, mmproj_sha256=SHA_PROJ)
    assert check_compatible(sc, make_facts(mmproj_sha256=SHA_PROJ)) == []
    (without,) = check_compatible(sc, make_facts())
    assert without == "holds 1 image; the server runs without a projector (--mmproj)"
    (other,) = check_compatible(sc, make_facts(mmproj_sha256=SHA_PROJ_B))
    assert other.startswith("holds 1 image read by another projector (sha256 cccccccc")
    assert "dddddddd" in other


@pytest.mark.parametrize("changes", [{}, {"continues": True, "pinned": True},
                                     {"verified": "stamp", "n_media": 2, "mmproj_sha256": "c" * 64}])
def test_the_sessions_index_gives_back_the_sidecar_it_kept(changes):
    from slotkeeper.core.sessions.stamps import FileStamp

    if changes.get("verified") == "stamp":
        changes = {**changes,
                   "verified": FileStamp(4096, 1_700_000_000_000_000_000, 42, 1_700_000_000_000_000_001,
                                         "xxh3_128:" + "f" * 32)}
    sc = make_sidecar(**changes)
    assert Sidecar.from_index(sc.to_json()) == sc
