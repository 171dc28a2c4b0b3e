"""Before a model or its settings change: what happens to the saved conversations, and whether
the machine can hold the launch.

Pure functions over values the faces already have (the sessions listing, the running server's
facts, a model's header, the machine's memory), so the Settings dialog and the model switch say
the same thing, and the unit tests need no server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model import gguf_info, gguf_memory
from slotkeeper.core.model.model_choice import ModelChoice, check_launch, profile_model_name
from slotkeeper.core.server.command import kv_affecting_args
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible, model_file_name
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.sidecar import Sidecar
from slotkeeper.core.settings import ServerProfile

__all__ = [
    "LaunchSanity",
    "ModelIdentity",
    "expected_facts",
    "launch_sanity",
    "left_behind",
    "n_ctx_per_slot",
]

CELL_PAD = 256  # llama.cpp pads the context, and each slot's share of it, to 256 cells


def n_ctx_per_slot(ctx: int, parallel: int) -> int:
    """The context each slot gets (what /props reports as n_ctx_slot) for ``-c ctx -np parallel``."""
    total = -(-ctx // CELL_PAD) * CELL_PAD
    return -(-(total // max(1, parallel)) // CELL_PAD) * CELL_PAD


@dataclass(frozen=True)
class ModelIdentity:
    """Which saved sessions belong to a model: by its SHA-256 when known (the running server's, or
    the hash cache's), else by the file's resolved path as the sidecars record it."""

    path: str  # resolved
    sha256: str | None = None
    has_swa: bool = False

    def owns(self, sidecar: Sidecar) -> bool:
        if self.sha256:
            return sidecar.model_sha256 == self.sha256
        return sidecar.model_path == self.path


def expected_facts(profile: ServerProfile, model: ModelIdentity, auto: bool = True) -> ServerFacts:
    """The facts a server launched with ``profile`` on ``model`` will have (``sha256`` may be
    unknown: ``left_behind`` then matches sessions by path). Flash attention left to "auto" is
    taken as ``auto``; it leaves no conversation behind either way (a restore carries one saved
    under the other choice over)."""
    return ServerFacts(
        model_sha256=model.sha256 or "", model_path=model.path,
        flash_attn=auto if profile.flash_attn is None else profile.flash_attn,
        cache_type_k=profile.cache_type_k, cache_type_v=profile.cache_type_v, swa_full=profile.swa_full,
        n_parallel=profile.parallel, n_ctx_slot=n_ctx_per_slot(profile.ctx, profile.parallel),
        swa=model.has_swa, kv_args=kv_affecting_args(profile.extra_args),
        mmproj_sha256=_projector_mark(profile.mmproj_path),
    )  # fmt: skip


def _projector_mark(mmproj_path: str | None) -> str | None:
    """Which projector a profile names, before anything is hashed: its resolved path (compared
    between two profiles only; ``_as_saved`` stands in the sessions' own hash for the current one)."""
    return None if not mmproj_path else "file:" + str(Path(mmproj_path).expanduser().resolve())


def _as_saved(sc: Sidecar, facts: ServerFacts) -> ServerFacts:
    """``facts`` with this session's model, and its projector taken as the one the facts name
    (when they name one): how it restores under those settings."""
    return replace(facts, model_sha256=sc.model_sha256, model_path=sc.model_path,
                   mmproj_sha256=sc.mmproj_sha256 if facts.mmproj_sha256 else None)


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def _slots(n: int) -> str:
    return _plural(n, "slot")


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def left_behind(entries: Iterable[SessionEntry], before: ServerFacts, before_model: ModelIdentity,
                after: ServerFacts, after_model: ModelIdentity) -> list[str]:
    """Sentences for the saved conversations that restore with ``before`` and will not with
    ``after`` ("12 saved conversations were made with 1 slot and will not restore with 2"), one
    per setting that causes it, by the compatibility rules themselves. Empty when none is lost."""
    usable: list[Sidecar] = []
    for e in entries:
        sc = e.sidecar
        if sc is None or e.problems or not before_model.owns(sc):
            continue
        if not check_compatible(sc, _as_saved(sc, before)):
            usable.append(sc)
    if not usable:
        return []
    if before_model.path != after_model.path and not (
            before_model.sha256 and before_model.sha256 == after_model.sha256):
        n = len(usable)
        name = model_file_name(before_model.path)
        return [f"{_plural(n, 'saved conversation')} of {name} will wait until you switch back to it "
                f"(they stay listed under Sessions)."]

    def lost_to(**changes) -> list[Sidecar]:
        out = []
        for sc in usable:
            if check_compatible(sc, replace(_as_saved(sc, before), **changes)):
                out.append(sc)
        return out

    said: list[str] = []

    def say(lost: list[Sidecar], made: str, restore: str) -> None:
        if lost:
            were = "was" if len(lost) == 1 else "were"
            said.append(f"{_plural(len(lost), 'saved conversation')} {were} made with {made} and will not "
                        f"restore with {restore}.")

    if after.n_parallel != before.n_parallel:
        say(lost_to(n_parallel=after.n_parallel), _slots(before.n_parallel), str(after.n_parallel))
    if after.n_ctx_slot < before.n_ctx_slot:
        lost = lost_to(n_ctx_slot=after.n_ctx_slot)
        if lost:
            were = "is" if len(lost) == 1 else "are"
            said.append(f"{_plural(len(lost), 'saved conversation')} {were} longer than the "
                        f"{after.n_ctx_slot:,} tokens each slot would have, and will not restore.")
    for which, attr in (("K", "cache_type_k"), ("V", "cache_type_v")):
        old, new = getattr(before, attr), getattr(after, attr)
        if old != new:
            say(lost_to(**{attr: new}), f"a {which} cache of {old}", new)
    if after.swa_full != before.swa_full:
        say(lost_to(swa_full=after.swa_full),
            "--swa-full" if before.swa_full else "the default sliding-window cache",
            "--swa-full" if after.swa_full else "the default sliding-window cache")
    if after.kv_args != before.kv_args:
        say(lost_to(kv_args=after.kv_args), f"the arguments {' '.join(before.kv_args) or '(none)'}",
            " ".join(after.kv_args) or "none")
    if after.mmproj_sha256 != before.mmproj_sha256:
        lost = lost_to(mmproj_sha256=after.mmproj_sha256 and "another projector")
        if lost:
            hold = "holds" if len(lost) == 1 else "hold"
            without = "without it" if after.mmproj_sha256 is None else "with another projector"
            said.append(f"{_plural(len(lost), 'saved conversation')} {hold} images read by the current "
                        f"projector and will not restore {without}.")
    return said


# -- the machine ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchSanity:
    """What a launch needs against what the machine has, said before it starts."""

    weights_bytes: int
    kv_bytes: int
    total_memory: int
    refusal: str | None  # the engine will refuse this launch: it cannot fit
    warnings: tuple[str, ...] = ()

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def summary(self) -> str:
        return (f"Needs about {human_bytes(self.need_bytes)} of memory (model "
                f"{human_bytes(self.weights_bytes)} + KV cache {human_bytes(self.kv_bytes)}); this machine "
                f"has {human_bytes(self.total_memory)}.")

    @property
    def problems(self) -> tuple[str, ...]:
        return ((self.refusal,) if self.refusal else ()) + self.warnings


def launch_sanity(info: gguf_info.ModelInfo, profile: ServerProfile, total_memory: int,
                  available_memory: int, is_demo: bool = False) -> LaunchSanity:
    """The memory a launch of ``info`` with ``profile`` needs (weights + KV at this context) against
    the machine's, and the engine's own launch check (a context beyond the model's training
    context, memory that will not fit). ValueError for settings the estimate cannot read."""
    est = gguf_memory.kv_estimate(info, profile.ctx, profile.parallel, type_k=profile.cache_type_k,
                                type_v=profile.cache_type_v)
    kv = est.bytes_full if profile.swa_full else est.bytes_swa
    check = check_launch(ModelChoice(info.path, info, is_demo), profile, total_memory, available_memory)
    return LaunchSanity(info.file_size, kv, total_memory, check.refusal, check.warnings)


def model_label(model_path: str | None) -> str:
    """A model's name in menus and messages."""
    return profile_model_name(model_path)
