"""Server profile -> llama-server argv (``build_argv`` is pure: no I/O), and the API key rules."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from slotkeeper.core.settings import ServerProfile

# Flags we always pass, and why:
# - an explicit -np N keeps the KV cache per slot (not unified). With unified KV the server may
#   move an idle slot to its RAM cache (--cache-idle-slots) and clear it when another task
#   arrives, so an idle slot's contents would vanish before Slotkeeper saves them.
# - an explicit -fa on|off: flash attention is baked into a save file, so "auto" must never
#   decide it behind our back. The "auto" setting (the default) is llama-server's own choice,
#   asked of the binary once and then passed as on or off (core/server/flash_attn.py).
# - --metrics for the /metrics counters; --slot-save-path enables the save/restore actions.
# - --no-cache-idle-slots and --no-kv-unified, when the build knows them, are belt and braces
#   for the same reason.
# - --cache-ram 0: Slotkeeper keeps conversations that leave a slot on disk and brings them back
#   itself, so a slot holds what Slotkeeper thinks it holds (llama-server's RAM prompt cache
#   would swap slot contents behind its back; see docs/ARCHITECTURE.md for the measurement).
OPTIONAL_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--no-kv-unified",),
    ("--no-cache-idle-slots",),
    ("--cache-ram", "0"),
)
OWNED_FLAGS = frozenset(
    {
        "-m", "--model", "--host", "--port", "-c", "--ctx-size", "-np", "--parallel",
        "-fa", "--flash-attn", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v",
        "--swa-full", "--no-swa-full", "--slot-save-path", "-kvu", "--kv-unified", "-no-kvu",
        "--no-kv-unified",
        # These would undo what the flags above are for: idle slots cleared before they are
        # saved, or no /slots to watch them by.
        "--cache-idle-slots", "--no-cache-idle-slots", "--cache-ram", "-cram",
        # The front door serves llama-server's paths at the root of the user's address.
        "--api-prefix", "--reuse-port",
        # The projector is a setting: its hash goes into every sidecar that holds images.
        "-mm", "--mmproj", "-mmu", "--mmproj-url", "--no-mmproj", "--mmproj-auto", "--no-mmproj-auto",
    }
)


# Extra arguments that change what a KV cache means: a session saved with them must only be
# restored into a server that runs with the same ones (recorded in the sidecar as kv_args).
KV_AFFECTING_PREFIXES = ("--lora", "--rope", "--yarn", "--control-vector", "--override-kv", "--grp-attn")


def kv_affecting_args(extra_args: tuple[str, ...]) -> tuple[str, ...]:
    """The KV-affecting flags among ``extra_args``, each with its value(s), in order."""
    out: list[str] = []
    taking = False
    for arg in extra_args:
        if arg.startswith("-"):
            taking = arg.split("=", 1)[0].startswith(KV_AFFECTING_PREFIXES)
            if taking:
                out.append(arg)
        elif taking:
            out.append(arg)
    return tuple(out)


# Hosts that only this machine can reach: no key is needed to keep others out.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
API_KEY_FLAGS = ("--api-key", "--api-key-file")


def api_key_args(extra_args: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """Every ``--api-key`` / ``--api-key-file`` among the extra arguments, as (flag, value).

    The value follows the flag (``--api-key KEY``) or is joined to it (``--api-key=KEY``);
    it is None for a flag given last with nothing after it.
    """
    out: list[tuple[str, str | None]] = []
    args = list(extra_args)
    i = 0
    while i < len(args):
        flag, eq, joined = args[i].partition("=")
        if flag in API_KEY_FLAGS:
            if eq:
                out.append((flag, joined))
            elif i + 1 < len(args):
                out.append((flag, args[i + 1]))
                i += 1
            else:
                out.append((flag, None))
        i += 1
    return out


def is_loopback(host: str) -> bool:
    """Only this machine can reach a server listening on ``host``."""
    return host.strip().lower() in LOOPBACK_HOSTS


def without_api_key(extra_args: tuple[str, ...]) -> tuple[str, ...]:
    """The extra arguments minus ``--api-key KEY`` and ``--api-key-file FILE``: the user's key
    guards Slotkeeper's front door; llama-server gets a private key through its environment
    (``LLAMA_API_KEY``), so no key shows in ``ps``, logs or state files."""
    out: list[str] = []
    skip = False
    for arg in extra_args:
        if skip:
            skip = False
            continue
        if arg in API_KEY_FLAGS:
            skip = True
            continue
        if arg.startswith(tuple(f + "=" for f in API_KEY_FLAGS)):
            continue
        out.append(arg)
    return tuple(out)


def exposes_without_key(host: str, extra_args: tuple[str, ...],
                        environ: Mapping[str, str] | None = None) -> bool:
    """True when the server would listen beyond this machine with no ``--api-key`` or
    ``--api-key-file``: anyone on the network could use it and read its conversations."""
    if is_loopback(host):
        return False
    return (not api_key_args(extra_args)
            and not (os.environ if environ is None else environ).get("LLAMA_API_KEY"))


# Flags the user gives for the front door's clients: Slotkeeper always has /slots and /metrics
# itself, and answers clients the way llama-server would with the user's choice.
DOOR_FLAGS = {"--slots": ("slots", True), "--no-slots": ("slots", False), "--metrics": ("metrics", True)}
DOOR_ENV = {"slots": "LLAMA_ARG_ENDPOINT_SLOTS", "metrics": "LLAMA_ARG_ENDPOINT_METRICS"}
DOOR_DEFAULTS = {"slots": True, "metrics": False}  # llama-server's own defaults


def user_wants(extra_args: Sequence[str], endpoint: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user's llama-server arguments (or its environment variables) offer ``endpoint``
    ("slots" or "metrics") to clients; the last flag wins, as in llama-server."""
    env = os.environ if environ is None else environ
    wanted = DOOR_DEFAULTS[endpoint]
    value = env.get(DOOR_ENV[endpoint], "").strip().lower()
    if value in ("1", "true", "on", "enabled"):
        wanted = True
    elif value in ("0", "false", "off", "disabled"):
        wanted = False
    for arg in extra_args:
        flag = DOOR_FLAGS.get(arg)
        if flag is not None and flag[0] == endpoint:
            wanted = flag[1]
    return wanted


SSE_PING_DEFAULT = 30  # llama-server's --sse-ping-interval default, in seconds


def sse_ping_interval(extra_args: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """The seconds between SSE comment pings that llama-server sends in a silent stream, as the
    user's arguments (``--sse-ping-interval N``, the last one winning) or its environment
    (``LLAMA_ARG_SSE_PING_INTERVAL``) set it; -1 (or 0): none."""
    env = os.environ if environ is None else environ
    value: str | None = env.get("LLAMA_ARG_SSE_PING_INTERVAL")
    for i, arg in enumerate(extra_args):
        if arg == "--sse-ping-interval" and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith("--sse-ping-interval="):
            value = arg.split("=", 1)[1]
    try:
        return int(value) if value is not None else SSE_PING_DEFAULT
    except ValueError:
        return SSE_PING_DEFAULT


def for_llama_server(extra_args: tuple[str, ...]) -> tuple[str, ...]:
    """The user's extra arguments as llama-server gets them: without the key (the front door's)
    and without the flags that only say what the front door offers clients."""
    return tuple(a for a in without_api_key(extra_args) if a not in DOOR_FLAGS)


class CommandError(ValueError):
    pass


def build_argv(
    binary: Sequence[str],
    profile: ServerProfile,
    model_path: str | Path,
    slot_save_path: str | Path,
    supported_flags: frozenset[str] = frozenset(),
) -> list[str]:
    profile.validate()
    clash = [a for a in profile.extra_args if a.split("=", 1)[0] in OWNED_FLAGS]
    if clash:
        raise CommandError(
            f"extra arguments {' '.join(clash)} would override what Slotkeeper manages; "
            "use the matching setting instead"
        )
    argv = [
        *binary,
        "--model", str(model_path),
        "--host", profile.host,
        "--port", str(profile.port),
        "--ctx-size", str(profile.ctx),
        "--parallel", str(profile.parallel),
        # "auto" (None) is resolved by the launch plan, which then sets this value; never auto here
        "--flash-attn", "on" if profile.flash_attn else "off",
        "--cache-type-k", profile.cache_type_k,
        "--cache-type-v", profile.cache_type_v,
        "--metrics",
        "--slot-save-path", str(slot_save_path),
    ]
    if profile.swa_full:
        argv.append("--swa-full")
    if profile.mmproj_path:
        argv.extend(["--mmproj", str(Path(profile.mmproj_path).expanduser())])
    for flag in OPTIONAL_FLAGS:
        if flag[0] in supported_flags:
            argv.extend(flag)
    argv.extend(for_llama_server(profile.extra_args))  # the key goes in the environment (launch_environment)
    return argv
