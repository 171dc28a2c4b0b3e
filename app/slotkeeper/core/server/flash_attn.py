"""Flash attention as llama-server's ``auto`` chooses it, asked of the binary itself.

Flash attention is baked into a save file (without it the V cache is stored transposed, and a
restore into a server that differs is refused), so Slotkeeper always passes a concrete
``--flash-attn on|off``. Left to the "auto" setting (the default), the value is what the binary
would choose for this model, these flags and this machine's devices: ``auto_choice`` starts it once
with ``--flash-attn auto`` and the very command line of the launch, reads its verdict in the log
(libllama's ``resolve_fused_ops: Flash Attention enabled``, or ``... not supported, set to
disabled``; the context's ``flash_attn = enabled|disabled`` when it was settled earlier, e.g. forced
off for an architecture), and stops it. A model's weights load for that (on a CPU they are mapped,
a fraction of a second for the starter model; on a GPU they are copied), once: the verdict is kept
per binary file version, command line and model file version in the binary facts cache.

A verdict that cannot be read (an older build's log, a probe that failed to load the model) is
``None``: the launch then passes ``off``, as Slotkeeper always did, and asks again next time.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.server.private import free_port
from slotkeeper.core.server.spawn import launch_environment, start

log = logging.getLogger(__name__)

FACT = "flash-attn-auto"
PROBE_TIMEOUT_SECONDS = 300.0  # a large model on a slow disk; the real launch would take as long
ENABLED = re.compile(r"Flash Attention enabled|flash_attn\s*=\s*enabled"
                     r"|Flash Attention was auto, set to enabled")
DISABLED = re.compile(r"Flash Attention not supported|flash_attn\s*=\s*disabled"
                      r"|Flash Attention was auto, set to disabled")


def verdict(line: str) -> bool | None:
    """What one log line says of flash attention's choice, or None when it says nothing."""
    if ENABLED.search(line):
        return True
    if DISABLED.search(line):
        return False
    return None


def probe_argv(argv: Sequence[str], port: int, flags: frozenset[str]) -> list[str]:
    """The launch's command line asking for ``auto`` on its own port, with libllama's info lines
    (where the verdict is) and without the warm-up run it does not need."""
    out = list(argv)
    out[out.index("--flash-attn") + 1] = "auto"
    out[out.index("--port") + 1] = str(port)
    if "--log-verbosity" in flags:
        out += ["--log-verbosity", "4"]
    if "--no-warmup" in flags:
        out.append("--no-warmup")
    return out


def cache_key(argv: Sequence[str], model_path: str | os.PathLike[str]) -> str:
    """What the verdict depends on beyond the binary: every argument but the port, and the model
    file's version."""
    args = list(argv)
    i = args.index("--port")
    del args[i:i + 2]
    st = os.stat(model_path)
    return FACT + "\0" + json.dumps([args, st.st_size, st.st_mtime_ns])


def auto_choice(binary_path: str, argv: Sequence[str], model_path: str | os.PathLike[str],
                flags: frozenset[str], cache: FileFactsCache | None = None,
                timeout: float = PROBE_TIMEOUT_SECONDS) -> bool | None:
    """True or False as llama-server's ``--flash-attn auto`` would choose for the launch ``argv``
    (which passes a concrete value), or None when the binary did not say."""
    try:
        key = cache_key(argv, model_path)
    except OSError:
        return None
    stored = cache.get(binary_path, key) if cache is not None else None
    if isinstance(stored, bool):
        return stored
    started = time.monotonic()
    choice = _ask(probe_argv(argv, free_port(), flags), timeout)
    log.info("llama-server's auto chooses flash attention %s for this model (asked in %.1f s)",
             {True: "on", False: "off", None: "(no answer)"}[choice], time.monotonic() - started)
    if choice is not None and cache is not None:
        cache.put(binary_path, choice, key)
    return choice


def pass_auto_choice(binary_path: str, argv: list[str], model_path: str | os.PathLike[str],
                     flags: frozenset[str], cache: FileFactsCache | None = None) -> bool:
    """``argv`` (a launch's, with a placeholder value) made to pass auto's choice, off when the
    binary does not say (as a launch does); returns the value passed."""
    choice = bool(auto_choice(binary_path, argv, model_path, flags, cache))
    argv[argv.index("--flash-attn") + 1] = "on" if choice else "off"
    return choice


def _ask(argv: list[str], timeout: float) -> bool | None:
    # A key nobody knows: the probe listens on loopback for the moment it runs, and answers no one.
    env = launch_environment(secrets.token_hex(16))
    try:
        proc = start(argv, env, True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT)
    except OSError as exc:
        log.warning("could not ask llama-server about flash attention: %s", exc)
        return None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put(None)

    threading.Thread(target=read, name="flash-attn-probe", daemon=True).start()
    deadline = time.monotonic() + timeout
    choice: bool | None = None
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # it ended without saying (a model it cannot load, an old build)
                break
            choice = verdict(line)
            if choice is not None:
                break
    finally:
        _stop(proc)
    return choice


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            if sys.platform == "win32":
                proc.kill()
            else:
                os.killpg(proc.pid, signal.SIGKILL)  # started in its own session: its group is its pid
        except OSError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout is not None:
        proc.stdout.close()

