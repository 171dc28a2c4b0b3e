"""The data and sessions folders are the user's own: created 0700, refused when another user owns
them, when group or others can write them, or (the sessions folder) when it is a symbolic link.
Every file Slotkeeper writes is 0600, KV files included (llama-server writes them with the umask).
"""

from __future__ import annotations

import os
import stat
import sys

import pytest
from sessions_helpers import make_session, run_cli, save_incoming, write_slot_save

from slotkeeper.core.basics.fsutil import UnsafeFolder
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.history import RequestHistory, RequestRecord
from slotkeeper.core.model.model_hash import ModelHashCache
from slotkeeper.core.sessions import saving
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.in_slots import publish_in_slots
from slotkeeper.core.sessions.naming import new_incoming_name
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.settings import Settings, save_settings

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX owners and modes")

PLANTED = "aaaaaaaaaaaa"
OTHER_UID = 65534  # nobody


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def refused(paths, *expected: str) -> None:
    """ensure() refuses, and the CLI says why (an error exit, no traceback) without listing anything."""
    with pytest.raises(UnsafeFolder) as info:
        paths.ensure()
    for text in expected:
        assert text in str(info.value)
    r = run_cli(paths.data_dir, "list")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("slotkeeper: ") and all(text in r.stderr for text in expected), r.stderr
    assert PLANTED not in r.stdout


def test_folders_are_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        paths = app_paths(tmp_path / "home").ensure()
    finally:
        os.umask(old)
    for d in (paths.data_dir, paths.sessions_dir, paths.config_dir, paths.state_dir, paths.cache_dir,
              paths.log_dir):
        assert mode(d) == 0o700, d
    assert paths.check_private() is paths


def test_a_data_folder_writable_by_everyone_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)  # pre-created by someone else's script, say
    make_session(home / "sessions", PLANTED)
    refused(app_paths(home), "data folder", str(home), "other users", "0777", f"chmod 700 '{home}'")


def test_a_sessions_folder_writable_by_its_group_is_refused(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    make_session(paths.sessions_dir, PLANTED)
    os.chmod(paths.sessions_dir, 0o770)
    refused(paths, "sessions folder", "its group", "0770", "chmod 700")
    os.chmod(paths.sessions_dir, 0o700)  # the fix the message gives
    assert run_cli(paths.data_dir, "list").returncode == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("which", ["data", "sessions"])
def test_a_folder_owned_by_another_user_is_refused(tmp_path, which):
    paths = app_paths(tmp_path / "home").ensure()
    make_session(paths.sessions_dir, PLANTED)
    os.chown(paths.data_dir if which == "data" else paths.sessions_dir, OTHER_UID, OTHER_UID)
    refused(paths, f"{which} folder", "belongs to", f"uid {OTHER_UID}", "not to you")


def test_a_sessions_folder_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chmod(target, 0o755)
    make_session(target, PLANTED)
    paths.sessions_dir.rmdir()
    paths.sessions_dir.symlink_to(target)
    refused(paths, "sessions folder", "symbolic link", str(target))
    assert mode(target) == 0o755, "never chmod through a link"
    with pytest.raises(UnsafeFolder):
        SessionStore(paths.sessions_dir)


def test_a_data_folder_that_is_a_link_to_a_private_folder_is_fine(tmp_path):
    real = app_paths(tmp_path / "real").ensure()
    make_session(real.sessions_dir, PLANTED)
    (tmp_path / "link").symlink_to(real.data_dir)
    r = run_cli(tmp_path / "link", "list")
    assert r.returncode == 0 and PLANTED in r.stdout, r.stderr


def test_a_deleted_sessions_folder_is_created_again_and_checked(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    store = SessionStore(paths.sessions_dir)
    paths.sessions_dir.rmdir()
    store.ensure_folder()
    assert mode(paths.sessions_dir) == 0o700
    os.chmod(paths.sessions_dir, 0o777)
    with pytest.raises(UnsafeFolder, match="chmod 700"):
        store.ensure_folder()
    paths.sessions_dir.rmdir()
    paths.sessions_dir.symlink_to(tmp_path)
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        store.ensure_folder()


def test_a_saved_kv_file_is_0600_even_when_llama_server_wrote_it_0644(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    store = SessionStore(paths.sessions_dir)
    name = new_incoming_name()
    incoming = write_slot_save(store.dir / name, list(range(50)))
    os.chmod(incoming, 0o644)  # as llama-server leaves it with umask 022
    facts = ServerFacts(model_sha256="a" * 64, model_path="/m.gguf", flash_attn=True, cache_type_k="f16",
                        cache_type_v="f16", swa_full=False, n_parallel=1, n_ctx_slot=4096, swa=False)
    outcome = save_incoming(store, name, incoming.stat().st_size, 0, saving.SaveContext(facts, "llama", "b1"),
                                   lambda tokens: ("t", "p"))
    assert outcome.kind == "new"
    assert mode(store.dir / outcome.sidecar.kv_file) == 0o600
    assert mode(store.sidecar_path(outcome.sidecar.id)) == 0o600


def test_every_file_slotkeeper_writes_is_0600(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    save_settings(paths.settings_file, Settings())
    publish_in_slots(paths.in_slots_file, ["aaaaaaaaaaaa"])
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    ModelHashCache(paths.hash_cache_file).compute(model)
    history = RequestHistory(paths.history_file)
    history.append(RequestRecord(at=1.0, slot=0, n_prompt=10, cache_n=5, prompt_n=5, prompt_ms=1.0))
    for f in (paths.settings_file, paths.in_slots_file, paths.hash_cache_file, paths.history_file):
        assert mode(f) == 0o600, f


def test_a_history_file_an_older_version_made_0644_becomes_0600(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    paths.history_file.write_text("")
    os.chmod(paths.history_file, 0o644)
    RequestHistory(paths.history_file).append(
        RequestRecord(at=1.0, slot=0, n_prompt=10, cache_n=5, prompt_n=5, prompt_ms=1.0))
    assert mode(paths.history_file) == 0o600
