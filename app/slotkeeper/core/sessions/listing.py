"""The sessions folder listed: every session (its sidecar as the index has it, read again only
when its stat changed, with the files' problems and its share of pieces) and every other file,
and the same as `sessions list --json`'s rows, kept between processes while the folder does not
change. Readers over the store (``SessionStore.listing``, ``listing_rows``)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import orjson

from slotkeeper.core.basics.fsutil import file_kind
from slotkeeper.core.sessions.entries import Listing, SessionEntry, UnmanagedFile, finish_row, list_row
from slotkeeper.core.sessions.file_checks import sidecar_problems
from slotkeeper.core.sessions.index import piece_shares
from slotkeeper.core.sessions.naming import PIECES_DIR, SIDECAR_SUFFIX, is_scratch, transcript_name
from slotkeeper.core.sessions.rows import kept, rows_file, split_rows, write_rows
from slotkeeper.core.sessions.sidecar import Sidecar, SidecarError

if TYPE_CHECKING:
    from slotkeeper.core.sessions.store import SessionStore

log = logging.getLogger(__name__)


def list_folder(store: SessionStore) -> Listing:
    """Every session and every other file, as the folder holds them now: each entry's lstat is
    compared with the index, and only sidecars that changed are read."""
    with store.exclusive(reading=True):
        files = store.refresh()
        entries: list[SessionEntry] = []
        claimed: set[str] = set()
        order: dict[str, tuple[str, float]] = {}
        records = list(store.index.items())
        shares, _total = piece_shares({sid: (rec.facts() or {}).get("pieces") for sid, rec in records})
        for sid, rec in records:
            entry = store.entry_of(sid, rec, files.get)
            if shares.get(sid):
                entry = replace(entry, size_bytes=entry.size_bytes + shares[sid])
            entries.append(entry)
            order[entry.id] = rec.recency()
            claimed.add(sid + SIDECAR_SUFFIX)
            if entry.sidecar is not None:
                claimed.add(entry.sidecar.kv_file)
                claimed.add(transcript_name(entry.sidecar.kv_file) or "")
                claimed.update(p.kv_file for p in entry.sidecar.points)
        claimed.add(PIECES_DIR)
        unmanaged = []
        for name in sorted(files):
            if name in claimed or is_scratch(name):
                continue
            mode, size = files[name][0], files[name][1]
            kind = file_kind(mode)
            unmanaged.append(UnmanagedFile(name, size if kind == "file" else 0, kind))
    entries.sort(key=lambda e: (order.get(e.id, ("", 0.0)), e.id), reverse=True)
    return Listing(entries, unmanaged)


def list_rows(store: SessionStore) -> list[bytes]:
    """`sessions list --json`'s rows as JSON: ``orjson.dumps(entry.to_json())`` of each of
    ``list_folder(store).sessions``. The rows kept for the same look at the folder when nothing changed
    (``rows.kept``), else made from the facts and the ready row the index keeps of each sidecar
    (nothing decoded), and kept: thousands list in a blink."""
    with store.exclusive(reading=True):
        files = store.scan()
        key = None
        if store.index_file is not None:
            key, body = kept(store.dir, store.index_file, files)
            if body is not None:
                return split_rows(body)
        files = store.refresh(files)
        rows = []
        records = list(store.index.items())
        shares, _total = piece_shares({sid: (rec.facts() or {}).get("pieces") for sid, rec in records})
        for sid, rec in records:
            facts = rec.facts()
            if facts is None:
                row = orjson.dumps(list_row(sid, None, 0, [f"unreadable sidecar: {rec.error}"]))
            else:
                try:
                    Sidecar.check_index_paths(facts, facts.get("id"))
                    size, problems = sidecar_problems(store.dir, sid, facts, files.get)
                    size += shares.get(sid, 0)
                    base = rec.row()
                    assert base is not None  # facts were read, so the sidecar's JSON was
                except (SidecarError, KeyError, TypeError):  # not what we wrote: the full way
                    entry = store.entry_of(sid, rec, files.get)
                    entry = replace(entry, size_bytes=entry.size_bytes + shares.get(sid, 0))
                    row = orjson.dumps(entry.to_json())
                else:
                    row = finish_row(base, size, problems)
            rows.append((rec.recency(), sid, row))
    rows.sort(key=lambda r: r[:2], reverse=True)
    out = [r[2] for r in rows]
    if store.index_file is not None and key is not None:
        try:
            write_rows(rows_file(store.index_file), key, out)
        except OSError as exc:  # a cache: a failure costs time only
            log.debug("could not keep the list rows: %s", exc)
    return out
