"""The JSON sidecar written beside each saved KV file, and its compatibility rules.

A slot save file carries no model identity, no settings and no checksum (see
``kvfile``), and llama-server restores a mismatched file either with an opaque 400 or,
worse, "successfully" with garbage. So everything needed to decide whether a file can
be restored into the running server lives here, next to it.

Schema evolution:
- Adding an optional key does not bump ``SCHEMA_VERSION``: older Slotkeepers keep the
  key they do not know in ``Sidecar.extra`` and write it back unchanged.
- Any other change bumps ``SCHEMA_VERSION`` and adds ``MIGRATIONS[old] = fn`` that turns
  a schema-``old`` dict into a schema-``old + 1`` dict. ``from_json`` runs the chain.
- ``tests/data/sidecar_v<N>.json`` keeps one file per released schema; the tests load
  each of them forever.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import xxhash

from slotkeeper.core.basics.fsutil import UnsafeFile, atomic_write_text, open_regular
from slotkeeper.core.model import families
from slotkeeper.core.sessions.naming import SESSION_ID_RE
from slotkeeper.core.sessions.stamps import CONTENT_HASH_PREFIX, FileStamp, hash_with_stamp

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "RestorePoint",
    "RestoreRecord",
    "Sidecar",
    "SidecarError",
    "content_hash_file",
    "format_utc",
    "load_sidecar",
    "migrate",
    "new_session_id",
    "parse_utc",
    "tokens_digest",
    "utc_now",
    "write_sidecar_atomic",
]

SCHEMA_VERSION = 3


def _v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 records the restore mode (``core.model.families``). A schema-1 file knew only its
    architecture and whether it had sliding-window layers; that is enough to tell: hybrid and
    recurrent architectures and sliding-window with --swa-full restore for an exact
    continuation only, sliding-window without --swa-full never helps, the rest works."""
    d = dict(d)
    arch, swa, swa_full = d.get("arch"), d.get("swa"), d.get("swa_full")
    if isinstance(arch, str) and isinstance(swa, bool) and isinstance(swa_full, bool):
        d["restore_mode"] = families.arch_restore_mode(arch, swa, swa_full)
    # else: leave it out; validation then names the malformed field
    d["schema_version"] = 2
    return d


def _v2_to_v3(d: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 keeps states as manifests over shared pieces (``pieces``): the sidecar names the
    pieces its states use (``pieces``: id -> bytes) and each state's size as llama-server reads it
    (``state_bytes``). A schema-2 file names a whole state llama-server wrote (``<id>.<gen>.kv``):
    its size is its state's, it uses no pieces. (An older Slotkeeper refuses schema 3 in words: it
    would hand llama-server a manifest as a state.)"""
    d = dict(d)
    if isinstance(d.get("size_bytes"), int):
        d.setdefault("state_bytes", d["size_bytes"])
    d.setdefault("pieces", {})
    points = d.get("points")
    if isinstance(points, list):
        d["points"] = [{"state_bytes": p.get("size_bytes"), **p} if isinstance(p, dict) else p
                       for p in points]
    d["schema_version"] = 3
    return d


# MIGRATIONS[n] takes a schema-n dict and returns a schema-(n + 1) dict.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}

# Keys added after schema 1 without a bump, and what a file written before them means.
OPTIONAL_DEFAULTS: dict[str, Any] = {"kv_args": [], "n_prompt": None, "n_media": 0, "mmproj_sha256": None,
                                     "verified": None}
# Optional keys written only when they are not their default (files stay as older versions wrote them).
WRITTEN_WHEN_SET: dict[str, Any] = {"continues": False, "points": ()}

SESSION_ID_BYTES = 6  # 12 hex characters: plenty for one user's sessions
_ID_RE = SESSION_ID_RE  # the one id pattern (naming), also what the store accepts as an id
# A bare file name that llama-server also accepts: no separators, no leading dot or
# space, no trailing dot (it refuses those with "Invalid filename").
_KV_FILE_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,254}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TOKENS_DIGEST_RE = re.compile(r"[0-9a-f]{16}")
_CONTENT_HASH_RE = re.compile(re.escape(CONTENT_HASH_PREFIX) + r"[0-9a-f]{32}")
_UTC_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")
_UTC_FORMAT = "%Y-%m-%dT%H:%M:%S"
SIDECAR_FILE_MODE = 0o600
# Ours are a few KiB; a damaged or tampered one may be longer (thousands of points entries, of
# which the first MAX_POINTS are read) and its conversation must still be read: far beyond is not ours.
MAX_SIDECAR_BYTES = 16 << 20


class SidecarError(ValueError):
    """A sidecar is malformed, from a newer Slotkeeper, or cannot be migrated."""


# ---------------------------------------------------------------------------
# Small helpers that define the formats of individual fields


def new_session_id() -> str:
    """A fresh URL-safe session id (12 lowercase hex characters)."""
    return secrets.token_hex(SESSION_ID_BYTES)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def format_utc(moment: datetime) -> str:
    """ISO-8601 in UTC with a "Z" suffix, e.g. "2026-11-03T14:05:09.123456Z"."""
    if moment.tzinfo is None:
        raise ValueError("format_utc needs an aware datetime")
    return moment.astimezone(timezone.utc).replace(tzinfo=None).isoformat() + "Z"


def parse_utc(text: str) -> datetime:
    """Parse a timestamp written by ``format_utc``; raises ``ValueError`` otherwise."""
    if not isinstance(text, str) or not _UTC_RE.fullmatch(text):
        raise ValueError(f"not an ISO-8601 UTC timestamp ending in 'Z': {text!r}")
    # strptime rather than fromisoformat: Python 3.10's accepts only 3 or 6 digit fractions.
    body = text[:-1]
    layout = _UTC_FORMAT + ".%f" if "." in body else _UTC_FORMAT
    try:
        moment = datetime.strptime(body, layout)
    except ValueError:
        raise ValueError(f"not a valid date and time: {text!r}") from None
    return moment.replace(tzinfo=timezone.utc)


def tokens_digest(tokens: Sequence[int]) -> str:
    """xxh3_64 hex of the token ids as little-endian i32: a cheap identity for lineage."""
    arr = array("i", tokens)
    if sys.byteorder == "big":
        arr.byteswap()
    return xxhash.xxh3_64_hexdigest(arr.tobytes())


def content_hash_file(path: str | os.PathLike[str]) -> str:
    """The "xxh3_128:<hex>" hash of a whole file, read in chunks (KV files reach gigabytes)."""
    return hash_with_stamp(path)[0]  # never a link followed, never a FIFO waited on


# ---------------------------------------------------------------------------
# Field validation: each returns the value or raises SidecarError naming the field


def _type_name(value: object) -> str:
    return type(value).__name__


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise SidecarError(f"{where}{key}: missing")
    return d[key]


def _str(d: Mapping[str, Any], key: str, where: str = "") -> str:
    value = _require(d, key, where)
    if not isinstance(value, str):
        raise SidecarError(f"{where}{key}: expected a string, got {_type_name(value)} {value!r}")
    return value


def _matching(d: Mapping[str, Any], key: str, pattern: re.Pattern[str], what: str) -> str:
    value = _str(d, key)
    if not pattern.fullmatch(value):
        raise SidecarError(f"{key}: {value!r} is not {what}")
    return value


def _bool(d: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = _require(d, key, where)
    if not isinstance(value, bool):
        raise SidecarError(f"{where}{key}: expected true/false, got {_type_name(value)} {value!r}")
    return value


def _int(d: Mapping[str, Any], key: str, minimum: int, where: str = "") -> int:
    value = _require(d, key, where)
    # bool is an int subclass in Python; JSON true is not a count.
    if not isinstance(value, int) or isinstance(value, bool):
        raise SidecarError(f"{where}{key}: expected an integer, got {_type_name(value)} {value!r}")
    if value < minimum:
        raise SidecarError(f"{where}{key}: must be at least {minimum}, got {value}")
    return value


def _optional_int(d: Mapping[str, Any], key: str, where: str = "") -> int | None:
    if _require(d, key, where) is None:
        return None
    return _int(d, key, 0, where)


def _optional_bool(d: Mapping[str, Any], key: str, where: str = "") -> bool | None:
    return None if _require(d, key, where) is None else _bool(d, key, where)


def _optional_str(d: Mapping[str, Any], key: str, where: str = "") -> str | None:
    return None if _require(d, key, where) is None else _str(d, key, where)


def _timestamp(d: Mapping[str, Any], key: str, where: str = "") -> str:
    value = _str(d, key, where)
    try:
        parse_utc(value)
    except ValueError as exc:
        raise SidecarError(f"{where}{key}: {exc}") from None
    return value


def _mapping(value: object, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SidecarError(f"{key}: expected an object, got {_type_name(value)} {value!r}")
    return value


def _unknown_keys(d: Mapping[str, Any], known: Sequence[str] | frozenset[str]) -> dict[str, Any]:
    if len(d) == len(known):  # the common case: exactly the known keys
        if isinstance(known, frozenset) and known.issuperset(d):
            return {}
    return {k: v for k, v in d.items() if k not in known}


# ---------------------------------------------------------------------------
# The schema


@dataclass
class RestoreRecord:
    """The last restore of this session into a slot, and whether it paid off.

    ``effective`` stays None until the next request on that slot has been seen; then it
    says whether the server reused at least half of the restored tokens that request could
    reuse under the session's restore mode (``cache_n >= EFFECTIVE_REUSE_SHARE * n_restored``
    when it continues the conversation, the share being 0.5, in ``core.engine``). A restore
    whose next request reused only a few tokens is not effective. When the next request did
    not continue the restored conversation (another chat, or a rollback an exact-only model
    cannot do, which is recomputed), ``effective`` stays None and ``reason`` says "not judged".
    """

    at: str
    slot: int
    n_restored: int
    cache_n: int | None = None
    prompt_n: int | None = None
    effective: bool | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("at", "slot", "n_restored", "cache_n", "prompt_n", "effective", "reason")

    def to_json(self) -> dict[str, Any]:
        known = {key: getattr(self, key) for key in self._KEYS}
        return {**self.extra, **known}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RestoreRecord:
        where = "last_restore."
        d = _mapping(d, "last_restore")
        return cls(
            at=_timestamp(d, "at", where),
            slot=_int(d, "slot", 0, where),
            n_restored=_int(d, "n_restored", 0, where),
            cache_n=_optional_int(d, "cache_n", where),
            prompt_n=_optional_int(d, "prompt_n", where),
            effective=_optional_bool(d, "effective", where),
            reason=_optional_str(d, "reason", where),
            extra=_unknown_keys(d, cls._KEYS),
        )


POINT_PROMPT = "prompt"  # one token short of the last prompt: a re-rendered reply, a Regenerate
POINT_USER = "user"  # the start of a user message: an edited message (the last, or an earlier one)
POINT_KINDS = (POINT_PROMPT, POINT_USER)


@dataclass(frozen=True)
class RestorePoint:
    """A restore point: the slot's state at a prefix of the conversation, in its own KV file
    (``<id>.<gen>.kv``), for models whose restored state cannot be rolled back (``sessions.points``).
    A request that strictly extends its tokens continues from it exactly."""

    kv_file: str
    n_tokens: int
    tokens_digest: str  # of the conversation's first n_tokens tokens
    size_bytes: int  # its KV file's (a manifest's, or a whole state's)
    content_hash: str
    kind: str  # POINT_PROMPT or POINT_USER
    made_at: str
    verified: FileStamp | None = None
    state_bytes: int = 0  # the state llama-server restores from it

    _KEYS = ("kv_file", "n_tokens", "tokens_digest", "size_bytes", "content_hash", "kind", "made_at",
             "verified", "state_bytes")

    def to_json(self) -> dict[str, Any]:
        return {key: _plain(getattr(self, key)) for key in self._KEYS}

    @classmethod
    def from_json(cls, d: Any) -> RestorePoint:
        where = "points[]."
        d = _mapping(d, "points[]")
        kind = _str(d, "kind", where)
        if kind not in POINT_KINDS:
            raise SidecarError(f"{where}kind: {kind!r} is not one of {', '.join(POINT_KINDS)}")
        return cls(
            kv_file=_kv_file_name(d),
            n_tokens=_int(d, "n_tokens", 1, where),
            tokens_digest=_matching(d, "tokens_digest", _TOKENS_DIGEST_RE, "16 hex digits"),
            size_bytes=_int(d, "size_bytes", 0, where),
            content_hash=_matching(d, "content_hash", _CONTENT_HASH_RE,
                                   f"'{CONTENT_HASH_PREFIX}' + 32 hex digits"),
            kind=kind,
            made_at=_timestamp(d, "made_at", where),
            verified=FileStamp.from_json(d.get("verified")),
            state_bytes=_int(d, "state_bytes", 0, where),
        )


_PIECE_ID_RE = re.compile(r"[0-9a-f]{32}")


def _pieces(d: Mapping[str, Any]) -> dict[str, int]:
    value = _require(d, "pieces", "")
    if not isinstance(value, dict):
        raise SidecarError(f"pieces: expected an object, got {_type_name(value)}")
    out = {}
    for key, size in value.items():
        if not isinstance(key, str) or not _PIECE_ID_RE.fullmatch(key):
            raise SidecarError(f"pieces: {key!r} is not a piece id")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise SidecarError(f"pieces.{key}: expected a size in bytes, got {size!r}")
        out[key] = size
    return out


MAX_POINTS = 64  # llama-server keeps 32 checkpoints per slot; more entries than twice that are not ours


def _points(d: Mapping[str, Any]) -> tuple[RestorePoint, ...]:
    """The restore points a sidecar lists, each checked on its own: an entry that is not a point of
    this conversation (malformed, a file of another session or the conversation's own save, a
    second entry for one file, not shorter than the conversation, past the first ``MAX_POINTS``)
    is left out, and only that point is lost; the conversation itself stays readable."""
    value = d.get("points", [])
    if not isinstance(value, list):
        return ()
    main = d.get("kv_file")
    sid = d.get("id")
    n_tokens = d.get("n_tokens")
    kept: list[RestorePoint] = []
    seen: set[str] = set()
    for raw in value[:MAX_POINTS]:
        try:
            p = RestorePoint.from_json(raw)
        except SidecarError:
            continue
        if (p.kv_file == main or p.kv_file in seen or not p.kv_file.startswith(f"{sid}.")
                or (isinstance(n_tokens, int) and p.n_tokens >= n_tokens)):
            continue
        seen.add(p.kv_file)
        kept.append(p)
    return tuple(kept)


@dataclass
class Sidecar:
    """Everything Slotkeeper knows about one saved KV file (``<id>.json`` beside it)."""

    id: str
    kv_file: str
    title: str
    preview: str
    model_path: str
    model_sha256: str
    arch: str
    swa: bool  # the model has sliding-window attention layers
    swa_full: bool
    flash_attn: bool  # resolved on/off, never "auto"
    cache_type_k: str
    cache_type_v: str
    n_parallel: int
    kv_unified: bool
    n_ctx_slot: int
    n_tokens: int
    tokens_digest: str
    size_bytes: int
    content_hash: str
    llama_build: str
    created_at: str
    last_used_at: str
    pinned: bool = False
    parent: str | None = None
    last_restore: RestoreRecord | None = None
    corrupt: dict[str, str] | None = None
    # Extra llama-server arguments that change what the KV cache means (LoRA adapters, RoPE
    # scaling, control vectors ...). Optional key: files written before it read as "none".
    kv_args: list[str] = field(default_factory=list)
    # Tokens of the last request's prompt when the slot was saved (its reply follows): lineage
    # lets a later save differ from this one only after it (a re-rendered reply), never inside
    # the prompt. Optional key: unknown for files written before it.
    n_prompt: int | None = None
    # What a restore of it is good for (core.model.families: works, exact, never, unknown), from the
    # model's family and the server's --swa-full when it was saved. Schema 2.
    restore_mode: str = families.RESTORE_WORKS
    # Images/audio clips among the tokens, and the projector (--mmproj) that read them. Optional
    # keys: files written before them hold text only.
    n_media: int = 0
    mmproj_sha256: str | None = None
    # The KV file's stamp when its content last matched content_hash (sessions.stamps): while the
    # file still has it, a restore need not hash the whole file again. Optional key.
    verified: FileStamp | None = None
    # This save carries its parent's conversation forward (all of the parent's tokens, then
    # more): the continuation of a pinned snapshot, which keeps the snapshot and the pin. Faces
    # show the two as one conversation. Optional key: false for files written before it.
    continues: bool = False
    # Restore points (``RestorePoint``): prefixes of this conversation saved for models whose
    # restored state cannot be rolled back, longest first. Optional key: none for files before it.
    points: tuple[RestorePoint, ...] = ()
    # The state as llama-server reads it (assembled from pieces, or the whole KV file), in bytes.
    state_bytes: int = 0
    # Every piece this conversation's states (its save and its restore points) are made of, with
    # its size (``pieces``); none for a state kept whole.
    pieces: dict[str, int] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    # Keys written by a newer Slotkeeper of the same schema; written back untouched.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        known = {key: _plain(getattr(self, key)) for key in SIDECAR_KEYS
                 if key not in WRITTEN_WHEN_SET or getattr(self, key) != WRITTEN_WHEN_SET[key]}
        # Known keys win: a stale copy of a known key in extra must never override it.
        return {**known, **{k: v for k, v in self.extra.items() if k not in SIDECAR_KEYS}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Sidecar:
        d = migrate(_mapping(d, "sidecar"))
        parent = _require(d, "parent", "")
        last_restore = _require(d, "last_restore", "")
        return cls(
            schema_version=d["schema_version"],
            id=_matching(d, "id", _ID_RE, "a URL-safe id ([A-Za-z0-9_-], 1-64 characters)"),
            kv_file=_kv_file_name(d),
            title=_str(d, "title"),
            preview=_str(d, "preview"),
            model_path=_str(d, "model_path"),
            model_sha256=_matching(d, "model_sha256", _SHA256_RE, "64 lowercase hex digits"),
            arch=_str(d, "arch"),
            swa=_bool(d, "swa"),
            swa_full=_bool(d, "swa_full"),
            flash_attn=_bool(d, "flash_attn"),
            cache_type_k=_non_empty(d, "cache_type_k"),
            cache_type_v=_non_empty(d, "cache_type_v"),
            n_parallel=_int(d, "n_parallel", 1),
            kv_unified=_bool(d, "kv_unified"),
            n_ctx_slot=_int(d, "n_ctx_slot", 1),
            n_tokens=_int(d, "n_tokens", 0),
            tokens_digest=_matching(d, "tokens_digest", _TOKENS_DIGEST_RE, "16 hex digits"),
            size_bytes=_int(d, "size_bytes", 0),
            content_hash=_matching(
                d, "content_hash", _CONTENT_HASH_RE, f"'{CONTENT_HASH_PREFIX}' + 32 hex digits"
            ),
            llama_build=_str(d, "llama_build"),
            created_at=_timestamp(d, "created_at"),
            last_used_at=_timestamp(d, "last_used_at"),
            pinned=_bool(d, "pinned"),
            parent=None if parent is None else _matching(d, "parent", _ID_RE, "a session id"),
            last_restore=None if last_restore is None else RestoreRecord.from_json(last_restore),
            corrupt=_corrupt_mark(d),
            kv_args=_str_list(d, "kv_args"),
            n_prompt=_optional_int(d, "n_prompt", "") if "n_prompt" in d else None,
            restore_mode=_non_empty(d, "restore_mode"),
            n_media=_int(d, "n_media", 0) if "n_media" in d else 0,
            mmproj_sha256=(None if d.get("mmproj_sha256") is None
                           else _matching(d, "mmproj_sha256", _SHA256_RE, "64 lowercase hex digits")),
            verified=FileStamp.from_json(d.get("verified")),
            continues=_bool(d, "continues") if "continues" in d else False,
            points=_points(d),
            state_bytes=_int(d, "state_bytes", 0),
            pieces=_pieces(d),
            extra=_unknown_keys(d, _SIDECAR_KEY_SET),
        )

    @classmethod
    def from_index(cls, d: Mapping[str, Any]) -> Sidecar:
        """A sidecar from the JSON the sessions index keeps: ``to_json()`` of one ``from_json``
        validated when its file was read. Only the fields that become file names are checked
        again (``check_index_paths``); anything else odd raises SidecarError and the file is
        read again."""
        try:
            # Keys written only when set (``WRITTEN_WHEN_SET``) are absent at their default.
            kw = {key: d[key] if key not in WRITTEN_WHEN_SET else d.get(key, WRITTEN_WHEN_SET[key])
                  for key in SIDECAR_KEYS}
            last = kw["last_restore"]
            if last is not None:
                kw["last_restore"] = RestoreRecord(**{k: last[k] for k in RestoreRecord._KEYS},
                                                   extra=_unknown_keys(last, RestoreRecord._KEYS))
            kw["kv_args"] = list(kw["kv_args"])
            kw["verified"] = FileStamp.from_json(kw["verified"])
            kw["points"] = tuple(RestorePoint(**{**p, "verified": FileStamp.from_json(p.get("verified"))})
                                 for p in kw["points"])
        except (KeyError, TypeError, SidecarError) as exc:
            raise SidecarError(f"not a sidecar the index kept: {exc}") from None
        cls.check_index_paths(d, kw["id"])
        return cls(**kw, extra=_unknown_keys(d, _SIDECAR_KEY_SET))

    @staticmethod
    def check_index_paths(d: Mapping[str, Any], session_id: object) -> None:
        """The id and the KV file name, which become paths: as ``from_json`` requires them."""
        if not isinstance(d, Mapping) or d.get("id") != session_id or not isinstance(session_id, str) \
                or not _ID_RE.fullmatch(session_id):
            raise SidecarError(f"the index's sidecar is not {session_id!r}'s")
        _kv_file_name(d)
        for p in d.get("points") or ():
            _kv_file_name(p)


# The sidecar's keys in the order they are written: the dataclass fields, schema_version first.
SIDECAR_KEYS: tuple[str, ...] = ("schema_version",) + tuple(
    f.name for f in fields(Sidecar) if f.name not in ("schema_version", "extra")
)
_SIDECAR_KEY_SET = frozenset(SIDECAR_KEYS)


def _plain(value: Any) -> Any:
    """A field's JSON form (fresh containers, so the caller may change them)."""
    if isinstance(value, (RestoreRecord, FileStamp, RestorePoint)):
        return value.to_json()
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _str_list(d: Mapping[str, Any], key: str) -> list[str]:
    value = d.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SidecarError(f"{key}: expected a list of strings, got {_type_name(value)}")
    return list(value)


def _non_empty(d: Mapping[str, Any], key: str) -> str:
    value = _str(d, key)
    if not value:
        raise SidecarError(f"{key}: must not be empty")
    return value


def _kv_file_name(d: Mapping[str, Any]) -> str:
    name = _str(d, "kv_file")
    # The store joins this onto its directory, so anything path-like is refused.
    if not _KV_FILE_RE.fullmatch(name) or ".." in name or name.endswith("."):
        raise SidecarError(f"kv_file: {name!r} is not a bare file name")
    return name


def _corrupt_mark(d: Mapping[str, Any]) -> dict[str, str] | None:
    value = _require(d, "corrupt", "")
    if value is None:
        return None
    mark = _mapping(value, "corrupt")
    return {"at": _timestamp(mark, "at", "corrupt."), "reason": _str(mark, "reason", "corrupt.")}


def migrate(d: Mapping[str, Any]) -> dict[str, Any]:
    """Bring a sidecar dict of any readable schema up to ``SCHEMA_VERSION``."""
    version = d.get("schema_version")
    if version is None:
        raise SidecarError("schema_version: missing")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise SidecarError(f"schema_version: expected a non-negative integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise SidecarError(
            f"saved by a newer Slotkeeper (schema {version}); "
            f"this version reads up to {SCHEMA_VERSION}"
        )
    migrated = dict(d)
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise SidecarError(f"schema {version} is too old: no migration to {version + 1}")
        migrated = step(dict(migrated))
        if migrated.get("schema_version") != version + 1:
            # A migration that forgets to bump the version would loop forever.
            raise SidecarError(f"migration from schema {version} did not produce {version + 1}")
        version += 1
    return migrated


# ---------------------------------------------------------------------------
# Files


def load_sidecar(path: str | os.PathLike[str]) -> Sidecar:
    """Read and validate a sidecar; ``SidecarError`` names the file and the problem.

    Safe on a file someone else planted: a symbolic link is not followed, a FIFO or a device is
    not opened for a blocking read, a file over ``MAX_SIDECAR_BYTES`` is not read, and JSON
    nested too deeply is an error, not a RecursionError. Other OSErrors pass through.
    """
    path = Path(path)
    try:
        with open_regular(path, MAX_SIDECAR_BYTES) as f:
            raw = f.read(MAX_SIDECAR_BYTES + 1)
    except UnsafeFile as exc:
        raise SidecarError(str(exc)) from None
    if len(raw) > MAX_SIDECAR_BYTES:  # grew after the check
        raise SidecarError(f"{path.name} is over {MAX_SIDECAR_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SidecarError(f"{path.name}: not valid JSON: {exc}") from None
    except (RecursionError, ValueError) as exc:
        raise SidecarError(f"{path.name}: not a sidecar: {type(exc).__name__}: {str(exc)[:200]}") from None
    try:
        return Sidecar.from_json(data)
    except SidecarError as exc:
        raise SidecarError(f"{path.name}: {exc}") from None
    except RecursionError:
        raise SidecarError(f"{path.name}: nested too deeply to be a sidecar") from None


def write_sidecar_atomic(path: str | os.PathLike[str], sidecar: Sidecar) -> None:
    """Write the sidecar so that readers see the old file or the new one, never a mix."""
    data = sidecar.to_json()
    Sidecar.from_json(data)  # never write a file we could not read back
    try:
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    except RecursionError:  # an unknown key nested deeper than the encoder goes
        raise SidecarError(f"{Path(path).name}: nested too deeply to write back") from None
    atomic_write_text(Path(path), text, SIDECAR_FILE_MODE)
