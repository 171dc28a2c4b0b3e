"""What llama-server's ``--flash-attn auto`` chooses, and where it keeps the KV cache, asked of
the binary itself.

Flash attention is baked into a save file (without it the V cache is stored transposed), so
Slotkeeper always passes a concrete ``--flash-attn on|off``, chosen by the launch
(``engine/lifecycle/launching.resolve_flash_attn``) from what this probe finds: ``probe`` starts the
binary once with ``--flash-attn auto`` and the very command line of the launch, reads in its log
the devices that hold the KV cache (``llama_kv_cache: CPU KV buffer size``, ``CUDA0``, ``MTL0``,
``Vulkan0`` ...) and auto's verdict (libllama's ``resolve_fused_ops: Flash Attention enabled``, or
``... not supported, set to disabled``; the context's ``flash_attn = enabled|disabled`` when it was
settled earlier, e.g. forced off for an architecture), and stops it. A model's weights load for
that (on a CPU they are mapped, a fraction of a second for the starter model; on a GPU they are
copied), once: the answer is kept per binary file version, command line and model file version in
the binary facts cache.

An answer that cannot be read (an older build's log, a probe that failed to load the model) has
``auto`` None: the launch then passes ``off`` and asks again next time.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.server.private import free_port
from slotkeeper.core.server.spawn import kill_now, launch_environment, start

log = logging.getLogger(__name__)

FACT = "flash-attn-auto-devices"
PROBE_TIMEOUT_SECONDS = 300.0  # a large model on a slow disk; the real launch would take as long
ENABLED = re.compile(r"Flash Attention enabled|flash_attn\s*=\s*enabled"
                     r"|Flash Attention was auto, set to enabled")
DISABLED = re.compile(r"Flash Attention not supported|flash_attn\s*=\s*disabled"
                      r"|Flash Attention was auto, set to disabled")


KV_BUFFER = re.compile(r"llama_(?:kv_cache|memory_recurrent):\s+(\S+) (?:KV|RS) buffer size")
HOST_BUFFERS = re.compile(r"^CPU|_Host$", re.IGNORECASE)  # host memory: the CPU runs what uses it


@dataclass(frozen=True)
class AutoFacts:
    """``auto``: what llama-server's auto chose (None: it did not say); ``kv_devices``: the buffers
    its KV cache (and a recurrent state) live in, as its log names them."""

    auto: bool | None
    kv_devices: tuple[str, ...] = ()

    @property
    def on_cpu(self) -> bool:
        """Whether the CPU runs attention: every KV buffer in host memory (or none was named, as
        on a CPU-only build that says nothing)."""
        return all(HOST_BUFFERS.search(d) for d in self.kv_devices)

    def to_json(self) -> dict:
        return {"auto": self.auto, "kv_devices": list(self.kv_devices)}

    @classmethod
    def from_json(cls, raw: object) -> AutoFacts | None:
        if (isinstance(raw, dict) and isinstance(raw.get("auto"), bool)
                and isinstance(raw.get("kv_devices"), list)
                and all(isinstance(d, str) for d in raw["kv_devices"])):
            return cls(raw["auto"], tuple(raw["kv_devices"]))
        return None


def kv_device(line: str) -> str | None:
    """The device a log line says holds (part of) the KV cache, or None."""
    m = KV_BUFFER.search(line)
    return m.group(1) if m else None


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


def probe(binary_path: str, argv: Sequence[str], model_path: str | os.PathLike[str],
          flags: frozenset[str], cache: FileFactsCache | None = None,
          timeout: float = PROBE_TIMEOUT_SECONDS) -> AutoFacts:
    """What llama-server's ``--flash-attn auto`` would choose for the launch ``argv`` (which
    passes a concrete value) and where its KV cache lives, kept once known."""
    try:
        key = cache_key(argv, model_path)
    except OSError:
        return AutoFacts(None)
    stored = AutoFacts.from_json(cache.get(binary_path, key)) if cache is not None else None
    if stored is not None:
        return stored
    started = time.monotonic()
    facts = _ask(probe_argv(argv, free_port(), flags), timeout)
    log.info("llama-server's auto chooses flash attention %s for this model, its KV cache in %s "
             "(asked in %.1f s)", {True: "on", False: "off", None: "(no answer)"}[facts.auto],
             ", ".join(facts.kv_devices) or "(not said)", time.monotonic() - started)
    if facts.auto is not None and cache is not None:
        cache.put(binary_path, facts.to_json(), key)
    return facts


def _ask(argv: list[str], timeout: float) -> AutoFacts:
    # A key nobody knows: the probe listens on loopback for the moment it runs, and answers no one.
    env = launch_environment(secrets.token_hex(16))
    try:
        proc = start(argv, env, True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT)
    except OSError as exc:
        log.warning("could not ask llama-server about flash attention: %s", exc)
        return AutoFacts(None)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put(None)

    threading.Thread(target=read, name="flash-attn-probe", daemon=True).start()
    deadline = time.monotonic() + timeout
    choice: bool | None = None
    devices: list[str] = []
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # it ended without saying (a model it cannot load, an old build)
                break
            device = kv_device(line)
            if device is not None and device not in devices:
                devices.append(device)
            choice = verdict(line)
            if choice is not None:
                break
    finally:
        kill_now(proc)
    return AutoFacts(choice, tuple(devices))


