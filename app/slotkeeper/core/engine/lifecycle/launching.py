"""What to launch, and launching it before the engine has even been imported.

``plan_launch`` works out llama-server's command line from the settings (the model and its facts,
the binary and its flags, the private address): the engine calls it for every launch.

``prelaunch`` lets `slotkeeper serve` (and the desktop app) load the model and build the engine
at once. Loading a model takes llama-server a while; so does importing the engine (the front
door's HTTP stack, the search index ...). ``prelaunch`` needs only the light modules: it takes the data
folder's lock, claims the front door's port, plans the launch and starts the supervisor, whose thread starts
llama-server (or supervises the one the head start began from the last launch's note, when it
runs exactly the planned command line: ``core/server/headstart.py``); the engine, built
afterwards, takes the running supervisor over (``Engine(prelaunched=...)``) and sees every event
it emitted meanwhile (they wait in a held ``EventBus``). Whenever something is not plain (a server
an earlier run left, a busy port, a launch that would be refused) it steps aside and the engine
does the launch, and says what is wrong, as it always does.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from slotkeeper.core.basics import datalock, ports
from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.lifecycle.model_facts import (
    ModelChoice,
    check_launch,
    model_facts_cache,
    resolve_model,
    resolve_projector,
    swa_note,
)
from slotkeeper.core.events import EventBus
from slotkeeper.core.model import gguf_memory
from slotkeeper.core.model.model_choice import DEMO_MODEL
from slotkeeper.core.server import headstart
from slotkeeper.core.server.apikey import exposure_refusal
from slotkeeper.core.server.calibrate import Verdict
from slotkeeper.core.server.command import (
    CommandError,
    build_argv,
    without_api_key,
)
from slotkeeper.core.server.flash_attn import AutoFacts, probe
from slotkeeper.core.server.flash_choice import FlashAttnChoice, calibration_key, choose, remember_choice
from slotkeeper.core.server.locate import (
    FLAGS_VERSION,
    ServerBinary,
    ServerBinaryNotFound,
    locate_server,
    probe_flags,
)
from slotkeeper.core.server.private import LOOPBACK, PrivateAddress, private_address
from slotkeeper.core.server.spawn import launch_environment
from slotkeeper.core.server.supervisor import LaunchSpec, Supervisor, SupervisorError, port_user
from slotkeeper.core.sessions.staging import clear_staging, staging_folder
from slotkeeper.core.settings import UNQUANTIZED_CACHE_TYPES, ServerProfile, Settings, SettingsError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchPlan:
    spec: LaunchSpec
    model: ModelChoice
    profile: ServerProfile  # the settings launched (the engine's "running profile")
    private: PrivateAddress
    notes: tuple[str, ...]  # warnings to show once launched
    binary: str = ""  # llama-server's file (what its facts are kept under)
    flash_attn: bool = False  # what --flash-attn passes: the setting, or what "auto" resolved to
    flash_choice: FlashAttnChoice | None = None  # how and why (None: an older plan's)
    staging: Path | None = None  # where it writes and reads slot files (--slot-save-path)


def plan_launch(paths: AppPaths, profile: ServerProfile, model_facts: FileFactsCache,
                binary_facts: FileFactsCache, leftover_port: int | None,
                fetching: Callable[[int, int], None] | None = None) -> LaunchPlan:
    """llama-server's launch for ``profile``; SupervisorError with a user-facing sentence when it
    cannot be launched (missing model or binary, bad arguments, not enough memory). The starter
    model is downloaded first when this computer has none (``fetching`` told the bytes)."""
    try:
        model = resolve_model(profile.model_path, paths.models_dir, model_facts, fetching)
        resolve_projector(profile.mmproj_path)  # a clear refusal, before llama-server's
        binary = locate_server(profile.server_bin)
        flags = probe_flags(binary, 15.0, binary_facts)
        workarounds = binary_workarounds(binary, flags, binary_facts)
        private = private_address(paths.private_address_file,
                                  lambda port: port != leftover_port
                                  and port_user(LOOPBACK, port) is not None)
        # llama-server listens privately; the front door has the user's host and port.
        server_profile = replace(profile, host=LOOPBACK, port=private.port,
                                 extra_args=without_api_key(profile.extra_args))
        staging = staging_folder(paths.data_dir, states_bytes(model, profile))
        clear_staging(staging)
        argv = build_argv(binary.argv_prefix, server_profile, model.path, staging, supported_flags=flags)
        argv[len(binary.argv_prefix):len(binary.argv_prefix)] = workarounds
        fa = resolve_flash_attn(binary.path, argv, model, profile, flags, binary_facts, model_facts)
        flash_attn = fa.value
    except (EngineError, ServerBinaryNotFound, CommandError, SettingsError, OSError) as exc:
        raise SupervisorError(str(exc)) from exc
    refusal = exposure_refusal(profile.host, profile.port, profile.extra_args)
    if refusal:
        raise SupervisorError(refusal)
    memory = psutil.virtual_memory()
    check = check_launch(model, profile, memory.total, memory.available)
    if check.refusal:
        raise SupervisorError(check.refusal)
    notes = tuple(n for n in (swa_note(model, profile), *check.warnings, profile.small_context_note(),
                              *exposure_notes(profile)) if n)
    # The record (how a later run reads a server this one leaves) holds the value passed.
    record = {"profile": replace(profile, extra_args=without_api_key(profile.extra_args),
                                 flash_attn=flash_attn).to_json(),
              "model_path": str(model.path)}
    env = launch_environment(private.key)
    fallback = None
    if "--no-repack" in flags and "--no-repack" not in workarounds:  # see NO_REPACK_FACT
        at = len(binary.argv_prefix)
        fallback = (ILLEGAL_INSTRUCTION, LaunchSpec((*argv[:at], "--no-repack", *argv[at:]), LOOPBACK,
                                                    private.port, env=env, record=record))
    spec = LaunchSpec(tuple(argv), LOOPBACK, private.port, env=env, record=record, fallback=fallback)
    return LaunchPlan(spec, model, profile, private, notes, binary.path, flash_attn, fa, staging)


def states_bytes(model: ModelChoice, profile: ServerProfile) -> int:
    """The most the server's slot files take at once: every slot's state (its KV cache as
    allocated; a state file holds at most that)."""
    try:
        est = gguf_memory.kv_estimate(model.info, profile.ctx, profile.parallel, type_k=profile.cache_type_k,
                                      type_v=profile.cache_type_v)
    except ValueError:
        return 0
    return (est.bytes_full if profile.swa_full else est.bytes_swa) + est.recurrent_bytes


def resolve_flash_attn(binary_path: str, argv: list[str], model: ModelChoice, profile: ServerProfile,
                       flags: frozenset[str], binary_facts: FileFactsCache,
                       model_facts: FileFactsCache) -> FlashAttnChoice:
    """The value ``argv`` passes for --flash-attn (set in it), how it was chosen and why
    (``flash_choice.choose``): the setting, or for "auto" what the probe of the binary found and a
    measurement kept for this binary, arguments and model. The choice is kept for the model too, so
    Settings can say it when the server does not run."""
    facts = None
    measured: Verdict | None = None
    if profile.flash_attn is None:
        facts = probe(binary_path, argv, model.path, flags, binary_facts)
        try:
            measured = Verdict.from_json(binary_facts.get(binary_path, calibration_key(argv, model.path)))
        except OSError:
            measured = None
    choice = choose(profile.flash_attn, profile.cache_type_v not in UNQUANTIZED_CACHE_TYPES,
                    model.info.has_swa and profile.swa_full, facts or AutoFacts(None), measured)
    argv[argv.index("--flash-attn") + 1] = "on" if choice.value else "off"
    remember_choice(model_facts, model.path, choice)
    return choice


# Some systems report CPU instructions they do not let a program use (AMX in some virtual machines):
# llama-server's weight repacking then stops it with SIGILL while it loads the model. Each launch
# names its fallback with --no-repack (weights used as they are; slower, never wrong), which the
# supervisor runs then; once seen for a binary, it is started so from the first.
NO_REPACK_FACT = "illegal-instruction-when-repacking"
ILLEGAL_INSTRUCTION = -getattr(signal, "SIGILL", 4)  # the exit code of a process SIGILL stopped


def binary_workarounds(binary: ServerBinary, flags: frozenset[str],
                       binary_facts: FileFactsCache) -> list[str]:
    """Flags this binary needs on this machine, as learnt from how it ended before."""
    if "--no-repack" in flags and binary_facts.get(binary.path, NO_REPACK_FACT):
        return ["--no-repack"]
    return []


def remember_illegal_instruction(binary_path: str, binary_facts: FileFactsCache) -> bool:
    """A launch of ``binary_path`` died of SIGILL while loading: start it with --no-repack from
    now on. False when that was done already (the workaround did not help)."""
    if not binary_path or binary_facts.get(binary_path, NO_REPACK_FACT):
        return False
    try:
        binary_facts.put(binary_path, True, NO_REPACK_FACT)
    except OSError:
        return False
    return True


def exposure_notes(profile: ServerProfile) -> list[str]:
    """What to say up front about who can reach the server and see its key."""
    notes = []
    if any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv):
        notes.append("The API key given on Slotkeeper's command line is visible to other users (ps); "
                     "give it with --api-key-file FILE or the LLAMA_API_KEY environment variable instead.")
    return notes


def binary_facts_cache(cache_file: Path) -> FileFactsCache:
    return FileFactsCache(cache_file, FLAGS_VERSION)


@dataclass
class Prelaunched:
    """A launch under way before the engine exists: the engine takes all of it over."""

    supervisor: Supervisor
    plan: LaunchPlan
    events: EventBus  # held: the engine subscribes, then releases it
    front_socket: socket.socket  # the front door's address, already claimed
    model_facts: FileFactsCache
    binary_facts: FileFactsCache
    taken: bool = False  # an engine owns it now (and stops it when it closes)

    def abandon(self) -> None:
        """Stop this launch (nobody will take it over): no server is left behind."""
        self.supervisor.stop()
        self.front_socket.close()


def prelaunch(paths: AppPaths, settings: Settings,
              command_line: Sequence[str] | None = None) -> Prelaunched | None:
    """Start llama-server for ``settings`` now, or None when the engine had better do it.
    ``command_line``: Slotkeeper's arguments, noted for the next run's head start (``headstart``)."""
    try:
        return _prelaunch(paths, settings, command_line)
    finally:
        headstart.discard()  # an early server the plan did not confirm never runs on


def _prelaunch(paths: AppPaths, settings: Settings, command_line: Sequence[str] | None) -> Prelaunched | None:
    profile = settings.profile
    if profile.model_path == DEMO_MODEL:
        from slotkeeper.core.model.starter_model import find_starter_model  # the demo only: start-up time

        if find_starter_model(paths.models_dir) is None:
            return None  # the engine downloads it, and shows how far it got
    try:
        paths.ensure()  # the folders llama-server writes into, checked as private
        datalock.acquire(paths.engine_lock_file, str(paths.data_dir))
    except (datalock.DataDirBusy, OSError):
        return None  # the engine says so
    events = EventBus(held=True)
    supervisor = Supervisor(log_path=paths.server_log,
                            state_file=paths.server_state_file, events=events)
    early = headstart.early()
    if supervisor.leftover_port(ours=early.popen.pid if early else None) is not None:
        return None  # an earlier run's server: the engine adopts it, or saves its slots and stops it
    sock = claim_address(profile.host, profile.port)
    if sock is None:
        return None
    model_facts = model_facts_cache(paths.model_facts_file)
    binary_facts = binary_facts_cache(paths.binary_facts_file)
    try:
        plan = plan_launch(paths, profile, model_facts, binary_facts, early.port if early else None)
    except SupervisorError:
        sock.close()
        headstart.forget(paths)
        return None
    child = headstart.take(plan.spec.argv, plan.spec.env or {})
    supervisor.start(plan.spec, child=child)  # this launch; the engine plans the next ones
    if command_line is not None:
        headstart.remember(paths, command_line, plan.spec.argv, plan.private.port)
    if child is not None and early is not None:  # taken over: the early one
        log.debug("llama-server has had a head start of %.0f ms", (time.monotonic() - early.started) * 1000)
    else:
        log.debug("llama-server started before the engine was built")
    return Prelaunched(supervisor, plan, events, sock, model_facts, binary_facts)


def claim_address(host: str, port: int) -> socket.socket | None:
    """A listening socket on the front door's address (as the door would open it), or None."""
    try:
        infos = ports.addresses(host, port)
        if len(infos) != 1:
            return None  # several addresses (a name such as localhost): the engine opens them all
        return ports.listening_socket(*infos[0])
    except OSError:
        return None
