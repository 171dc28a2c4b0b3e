"""What is wrong with a saved session's files, found without changing them.

``sidecar_problems``: a listing's view, from the sidecar's JSON and one look at the folder (no file
read). ``integrity_problems``: a restore's or `sessions verify`'s, the size and then the whole
file's content hash (skipped while the file keeps the stamp recorded when it last matched). The
store records what they find; these functions only look.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import NotARegularFile, not_regular_error, regular_size
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.naming import SIDECAR_SUFFIX, owns_kv_file
from slotkeeper.core.sessions.rows import Stamp
from slotkeeper.core.sessions.stamps import FileStamp, hash_with_stamp

StatOf = Callable[[str], Stamp | None]  # an entry of the folder's lstat, by name (None: not there)


def sidecar_problems(folder: Path, sid: str, data: dict[str, Any], stat_of: StatOf) -> tuple[int, list[str]]:
    """(KV bytes on disk, restore points included; problems) of a readable sidecar's JSON, with the
    folder's stat."""
    problems: list[str] = []
    sc_id, kv_file, corrupt = data["id"], data["kv_file"], data["corrupt"]
    if sc_id != sid:
        problems.append(f"sidecar {sid}{SIDECAR_SUFFIX} claims id {sc_id}")
    if not owns_kv_file(sid, kv_file):
        # A sidecar copied under another name: the file is another session's (or no one's).
        problems.append(f"its KV file {kv_file} belongs to another session")
    if corrupt:
        problems.append(f"damaged: {corrupt['reason']}")
    size, kv_problem = kv_stat_state(folder, kv_file, stat_of(kv_file))
    if kv_problem:
        problems.append(kv_problem)
    elif size != data["size_bytes"] and not corrupt:
        problems.append(f"KV file is {size} bytes; {data['size_bytes']} were saved")
    return size + points_bytes(data, stat_of), problems


def integrity_problems(entry: SessionEntry, trust_stamp: bool = False) -> tuple[list[str], FileStamp | None]:
    """(problems, a stamp to record) of a session with a sidecar: size, then the whole file's
    content hash. With ``trust_stamp`` the hash is skipped while the file still has the stamp
    recorded when its content last matched (``stamps``: same size, mtime, inode and ctime). A
    full check that passes returns the file's stamp when the sidecar does not hold it yet."""
    sc = entry.sidecar
    assert sc is not None and entry.kv_path is not None
    if sc.corrupt:
        return [f"damaged: {sc.corrupt['reason']}"], None
    return file_integrity(entry.kv_path, sc.size_bytes, sc.content_hash, sc.verified, trust_stamp)


def file_integrity(path: Path, size_bytes: int, content_hash: str, verified: FileStamp | None,
                   trust_stamp: bool = False) -> tuple[list[str], FileStamp | None]:
    """``integrity_problems`` of one KV file (a session's, or one of its restore points)."""
    size, kv_problem = kv_file_state(path)
    if kv_problem:
        return [kv_problem], None
    if size != size_bytes:
        return [f"KV file is {size} bytes; {size_bytes} were saved (cut short or appended to)"], None
    if trust_stamp and verified is not None:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and verified.matches(st, content_hash):
            return [], None
    try:
        found, st = hash_with_stamp(path)
    except NotARegularFile as exc:  # replaced since the lstat
        return [f"KV file {exc}"], None
    if found != content_hash:
        return ["KV file content does not match its hash (damaged on disk)"], None
    if st is not None and (verified is None or not verified.matches(st, found)):
        return [], FileStamp.of(st, found)
    return [], None


def points_bytes(data: dict[str, Any], stat_of: StatOf) -> int:
    """The restore points' bytes on disk (a missing point is only a point less, not a problem)."""
    total = 0
    for p in data.get("points") or ():
        st = stat_of(p["kv_file"]) if isinstance(p, dict) and isinstance(p.get("kv_file"), str) else None
        if st is not None and stat.S_ISREG(st[0]):
            total += st[1]
    return total


def kv_stat_state(folder: Path, name: str, st: Stamp | None) -> tuple[int, str | None]:
    """``kv_file_state`` of ``folder/name`` from a stat already taken (a listing's look at the folder)."""
    if st is None:
        return 0, f"KV file {name} is missing"
    if not stat.S_ISREG(st[0]):
        return 0, f"KV file {not_regular_error(folder / name, st[0])}"
    return st[1], None


def kv_file_state(path: Path) -> tuple[int, str | None]:
    """(size on disk, problem) of a session's KV file, by lstat: a symbolic link, a FIFO or any other
    non-regular file is a problem and is never followed or opened; a missing file is 0 bytes."""
    try:
        return regular_size(path), None
    except FileNotFoundError:
        return 0, f"KV file {path.name} is missing"
    except NotARegularFile as exc:
        return 0, f"KV file {exc}"
    except OSError as exc:
        return 0, f"KV file {path.name} cannot be read: {exc}"
