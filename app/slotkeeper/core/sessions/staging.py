"""The staging folder: where llama-server writes a slot's state and reads one back.

llama-server saves a whole state file and restores from one (``--slot-save-path``). Slotkeeper keeps
states as pieces (``pieces``): a save is read once from llama-server's file and only its new cells
reach the disk; a restore assembles the file and llama-server reads it. Where that file lies decides
what a save costs the disk:

- Linux: a folder of its own in ``/dev/shm`` (tmpfs, memory): llama-server's write and the read back
  never touch the disk, so a save writes only its new pieces. Used when the memory it would take (a
  state per slot at once, at most) is free there and in the machine; otherwise the data folder;
- macOS has no memory file system a program may use without an administrator (a RAM disk needs
  one), and Windows none at all: the staging folder is in the data folder, so llama-server's own
  write of each state reaches the disk (then removed at once; the page cache usually serves the
  read back). What Slotkeeper keeps afterwards is still only the new pieces.

The folder is private (0700, ours alone, never a link) and emptied of what an earlier run left.

In memory, the states llama-server wrote are kept there after they are committed, as a cache of
whole files (``cache_state``, ``cached_state``): a restore of one of them (the conversation at the
next launch, the point its next turn goes on from) needs no assembly, which for a transposed V
cache (flash attention off) costs ~6 ms per MB on small models. Named by the manifest's hash and
the file's own, checked whole before llama-server reads one, the least recently used removed
beyond 16 files a folder or, over all of this user's staging folders (other data folders', deleted
ones'), a quarter of the free memory (2 GiB at most). They last until the machine restarts; in the
data folder nothing is kept (it would cost the disk what pieces save).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from slotkeeper.core.basics.folder_identity import folder_key
from slotkeeper.core.basics.fsutil import ensure_private_folder
from slotkeeper.core.sessions.naming import INCOMING_PREFIX

__all__ = ["MEMORY_ROOT", "cache_state", "cached_state", "clear_staging", "ensure_staging", "in_memory",
           "staging_folder"]

MEMORY_ROOT = Path("/dev/shm")
DISK_NAME = "staging"
HEADROOM = 256 << 20  # memory left beside the states, at least


def staging_folder(data_dir: Path, needed_bytes: int, memory_root: Path = MEMORY_ROOT,
                   platform: str = sys.platform) -> Path:
    """The staging folder for a server whose states take up to ``needed_bytes`` at once: in memory
    where there is room, else in the data folder (created, private)."""
    if platform.startswith("linux"):
        folder = _in_memory(data_dir, needed_bytes, memory_root)
        if folder is not None:
            return folder
    folder = Path(data_dir) / DISK_NAME
    ensure_staging(folder)
    return folder


def _in_memory(data_dir: Path, needed: int, root: Path) -> Path | None:
    try:
        if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
            return None
        free = shutil.disk_usage(root).free
        import psutil

        available = psutil.virtual_memory().available
    except (OSError, ImportError):
        return None
    if free < needed + HEADROOM or available < needed + HEADROOM:
        return None
    uid = os.getuid() if hasattr(os, "getuid") else 0
    key = folder_key(data_dir).encode()
    import hashlib

    folder = root / f"slotkeeper-{uid}" / hashlib.sha256(key).hexdigest()[:16]
    try:
        ensure_staging(folder.parent)
        ensure_staging(folder)
    except OSError:
        return None  # another user's folder of that name, a link: not ours to use
    return folder


def ensure_staging(folder: Path) -> None:
    """Create the folder (0700) if it is gone, and check it is still private (UnsafeFolder)."""
    ensure_private_folder(Path(folder), "staging folder")


STALE_SECONDS = 60.0  # a state file this old is no save or restore under way


def clear_staging(folder: Path) -> int:
    """Remove the state files an earlier run left (a save or restore cut short, not written to for a
    minute); returns how many."""
    import time

    removed = 0
    now = time.time()
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.startswith(INCOMING_PREFIX) or name.startswith("restore-"):
            try:
                if now - os.lstat(Path(folder) / name).st_mtime < STALE_SECONDS:
                    continue
                os.unlink(Path(folder) / name)
                removed += 1
            except OSError:
                pass
    return removed


CACHE_PREFIX = "state-"
CACHE_FILES = 16
CACHE_MAX_BYTES = 2 << 30


def in_memory(folder: Path, memory_root: Path = MEMORY_ROOT) -> bool:
    """Whether the staging folder lies in the memory file system (not the data folder)."""
    return Path(folder).parent.parent == memory_root


def _cache_key(manifest_hash: str) -> str:
    return manifest_hash.rpartition(":")[2]


def cache_state(staged: Path, manifest_hash: str, memory_root: Path = MEMORY_ROOT) -> bool:
    """Keep the whole state llama-server wrote to ``staged`` (committed as the manifest whose hash is
    ``manifest_hash``) in the cache, when the staging folder is in memory; else remove it. Never
    raises: a state not kept is only assembled again."""
    folder = Path(staged).parent
    try:
        if not manifest_hash or not in_memory(folder, memory_root):
            return False
        import xxhash

        from slotkeeper.core.sessions.statefile import mapped

        with mapped(staged) as buf:
            whole = xxhash.xxh3_128_hexdigest(buf)
        name = f"{CACHE_PREFIX}{_cache_key(manifest_hash)}-{whole}.kv"
        os.replace(staged, folder / name)
        _evict(folder, keep=name)
        return True
    except (OSError, ValueError):
        return False
    finally:
        try:
            os.unlink(staged)
        except OSError:
            pass


def cached_state(folder: Path, manifest_hash: str) -> str | None:
    """The name, in the staging folder, of a whole file of the state whose manifest has this hash,
    checked against its own hash (None: none kept, or one that no longer matches, removed)."""
    if not manifest_hash:
        return None
    prefix = f"{CACHE_PREFIX}{_cache_key(manifest_hash)}-"
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".kv")]
    except OSError:
        return None
    import xxhash

    from slotkeeper.core.sessions.statefile import mapped

    for name in names:
        path = Path(folder) / name
        try:
            with mapped(path) as buf:
                ok = xxhash.xxh3_128_hexdigest(buf) == name[len(prefix):-3]
            if ok:
                os.utime(path)  # used: the last to go
                return name
            os.unlink(path)
        except (OSError, ValueError):
            continue
    return None


def _evict(folder: Path, keep: str) -> None:
    """The least recently used cached states removed beyond the cache's limits: at most CACHE_FILES
    in this staging folder, and within the byte limit over every staging folder of this user (other
    data folders', and those of data folders deleted since: memory is one, and /dev/shm lasts until
    the machine restarts)."""
    try:
        import psutil

        limit = min(CACHE_MAX_BYTES, psutil.virtual_memory().available // 4)
    except (ImportError, OSError):
        limit = 0
    folder = Path(folder)
    try:
        folders = [f for f in folder.parent.iterdir() if f.is_dir() and not f.is_symlink()]
    except OSError:
        folders = [folder]
    entries = []
    for each in folders:
        try:
            names = os.listdir(each)
        except OSError:
            continue
        for name in names:
            if name.startswith(CACHE_PREFIX):
                try:
                    st = os.lstat(each / name)
                except OSError:
                    continue
                new = each == folder and name == keep
                entries.append((new, st.st_mtime, st.st_size, str(each / name), each == folder))
    entries.sort(reverse=True)  # the new one, then the most recently used
    total = here = 0
    for _new, _mtime, size, path, ours in entries:
        total += size
        here += ours
        if (ours and here > CACHE_FILES) or total > limit:
            try:
                os.unlink(path)
            except OSError:
                pass
