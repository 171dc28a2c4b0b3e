"""Typed settings and the server profile, persisted as versioned JSON with atomic writes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import atomic_write_text
from slotkeeper.core.model.gguf_memory import CACHE_TYPES

SCHEMA_VERSION = 4
DEFAULT_PORT = 8789
SMALL_SLOT_CONTEXT = 256  # tokens per slot below which a launch is warned about
MAX_CTX = 2**31 - 1  # llama-server reads --ctx-size as a 32-bit int
DEFAULT_BUDGET_BYTES = 20 * 1024**3
DEFAULT_IDLE_SAVE_SECONDS = 10.0
# Restore points of earlier user messages are kept at least this many tokens apart (core.sessions.points):
# llama-server keeps its older RAM checkpoints at least 8,192 tokens apart by default (--checkpoint-min-step).
DEFAULT_POINT_SPACING_TOKENS = 4096
MIN_POINT_SPACING_TOKENS = 64
UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})
MAX_REMEMBERED_MODELS = 20  # per-model settings kept, most recently chosen first


class SettingsError(Exception):
    """Settings file that cannot be read; the message says why and what was kept."""


def _json_of(settings: ServerProfile | ModelMemory) -> dict[str, Any]:
    """A profile, or the settings remembered for a model, as JSON (the extra arguments a list)."""
    data = asdict(settings)
    data["extra_args"] = list(settings.extra_args)
    return data


def _fields_from_json(cls: type, raw: dict[str, Any], bad_args: Callable[[Any], str]) -> dict[str, Any]:
    """The fields of ``cls`` in ``raw`` (keys from a newer version are ignored), the extra
    arguments a tuple; SettingsError (``bad_args(value)`` says it) when they are not a list of
    strings."""
    known = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in raw.items() if k in known}
    if "extra_args" in kwargs:
        args = kwargs["extra_args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise SettingsError(bad_args(args))
        kwargs["extra_args"] = tuple(args)
    return kwargs


@dataclass(frozen=True)
class ServerProfile:
    """What llama-server is launched with. ``ctx`` is the total context; each slot gets ctx/parallel."""

    model_path: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ctx: int = 8192
    parallel: int = 1
    # None = "auto": what llama-server's own auto chooses for the model on this machine, resolved
    # to a concrete on/off at each launch (engine/lifecycle/launching.resolve_flash_attn), since a
    # save file holds one or the other.
    flash_attn: bool | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    extra_args: tuple[str, ...] = ()
    server_bin: str | None = None
    # A multimodal projector (--mmproj) for models that read images or audio; None: text only.
    mmproj_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _json_of(self)

    @classmethod
    def from_json(cls, raw: Any) -> ServerProfile:
        if not isinstance(raw, dict):
            raise SettingsError(f"setting 'profile' should be an object of server settings, not {raw!r}")
        return cls(**_fields_from_json(cls, raw, lambda args: (
            "setting 'extra_args' should be a list of arguments such as [\"--threads\", \"4\"], not "
            f"{args!r}")))

    def validate(self) -> None:
        if not (1 <= self.port <= 65535):
            raise SettingsError(f"port {self.port} is outside 1-65535")
        if "," in self.host or not self.host.strip():
            raise SettingsError(f"host {self.host!r}: Slotkeeper listens on one address (a name or an IP "
                                "address), not a list")
        if self.parallel < 1:
            raise SettingsError("slots (-np) must be at least 1")
        if self.ctx > MAX_CTX:
            raise SettingsError(f"context {self.ctx:,} is more than llama-server accepts ({MAX_CTX:,})")
        # a smaller context than is useful is only warned about (small_context_note)
        if self.ctx < self.parallel:
            raise SettingsError(f"context {self.ctx} is too small for {self.parallel} slot(s): each slot "
                                "needs a token")
        for name in ("cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value not in CACHE_TYPES:
                raise SettingsError(
                    f"unknown cache type {value!r}; choose one of {', '.join(CACHE_TYPES)}"
                )

    @property
    def ctx_per_slot(self) -> int:
        return self.ctx // self.parallel

    def small_context_note(self) -> str | None:
        """A word about a context llama-server accepts but few conversations fit in."""
        if self.ctx_per_slot >= SMALL_SLOT_CONTEXT:
            return None
        return (f"Each slot has {self.ctx_per_slot} tokens of context: llama-server runs like this, but most "
                "conversations will not fit in it. A larger context (or fewer slots) serves them.")

    @property
    def base_url(self) -> str:
        return connect_url(self.host, self.port)


def needs_flash_attention(profile: ServerProfile) -> bool:
    """True when the profile asks for a quantized V cache with flash attention off: llama-server
    quantizes the V cache only with flash attention, so it has to be turned on."""
    return profile.cache_type_v not in UNQUANTIZED_CACHE_TYPES and profile.flash_attn is False


def split_args(text: str) -> tuple[str, ...]:
    """Extra llama-server arguments as typed in one line, quoted as this platform's command lines are:
    a POSIX shell's words (ValueError if a quote is unbalanced), or on Windows as a program's C
    runtime splits its command line (``_split_windows``)."""
    if sys.platform == "win32":
        return tuple(_split_windows(text))
    return tuple(shlex.split(text))


def join_args(args: tuple[str, ...]) -> str:
    """The one-line form of extra arguments that ``split_args`` reads back as they were."""
    if sys.platform == "win32":
        return subprocess.list2cmdline(args)  # what Popen writes: the C runtime's quoting
    return shlex.join(args)


def _split_windows(text: str) -> list[str]:
    """``text`` split as the Microsoft C runtime splits a program's command line into argv ("Parsing
    C++ command-line arguments"), the rules ``subprocess.list2cmdline`` quotes for: spaces and tabs
    part arguments outside double quotes; 2n backslashes and a quote are n backslashes and a quote
    that opens or closes, 2n+1 backslashes and a quote are n backslashes and a literal quote;
    backslashes before anything else are themselves; inside quotes, two quotes are one literal quote.
    ``C:\\My Models`` keeps its backslashes, and an unclosed quote runs to the end (as it does for
    the program). shlex's posix=False keeps the quotes in the words and knows none of this."""
    args: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return args
        arg: list[str] = []
        quoted = False
        while True:
            slashes = 0
            while i < n and text[i] == "\\":
                i += 1
                slashes += 1
            literal = True
            if i < n and text[i] == '"':
                if slashes % 2 == 0:
                    if quoted and i + 1 < n and text[i + 1] == '"':
                        i += 1  # "" inside quotes: one literal quote, still quoted
                    else:
                        literal = False
                        quoted = not quoted
                slashes //= 2
            arg.append("\\" * slashes)
            if i >= n or (not quoted and text[i] in " \t"):
                break
            if literal:
                arg.append(text[i])
            i += 1
        args.append("".join(arg))


# Hosts that mean "listen on every interface": a client connects to them over loopback.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def connect_url(host: str, port: int) -> str:
    """The http URL a local client uses to reach a server listening on ``host:port``.

    A wildcard host (``0.0.0.0``, ``::`` or empty, bracketed or not) is reached at
    127.0.0.1; an IPv6 address is bracketed once, whether or not it came with its brackets.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare in _WILDCARD_HOSTS:
        bare = "127.0.0.1"
    netloc = f"[{bare}]" if ":" in bare else bare
    return f"http://{netloc}:{port}"


@dataclass(frozen=True)
class ModelMemory:
    """The settings remembered for one model, restored when that model is chosen again.

    Every field but ``model_path`` has the name of the ``ServerProfile`` field it remembers
    (``PER_MODEL_FIELDS``); a per-model setting the profile gains later is remembered by adding
    it here with a default (as ``mmproj_path`` was: entries written before it read as "none").
    """

    model_path: str
    ctx: int = ServerProfile.ctx  # the profile's defaults
    parallel: int = ServerProfile.parallel
    flash_attn: bool | None = ServerProfile.flash_attn
    cache_type_k: str = ServerProfile.cache_type_k
    cache_type_v: str = ServerProfile.cache_type_v
    swa_full: bool = ServerProfile.swa_full
    extra_args: tuple[str, ...] = ServerProfile.extra_args
    mmproj_path: str | None = ServerProfile.mmproj_path

    @classmethod
    def of(cls, profile: ServerProfile) -> ModelMemory:
        if not profile.model_path:
            raise ValueError("a profile without a model has nothing to remember")
        return cls(model_path=profile.model_path,
                   **{name: getattr(profile, name) for name in PER_MODEL_FIELDS})

    def apply_to(self, profile: ServerProfile) -> ServerProfile:
        """``profile`` running this model with its remembered settings."""
        return replace(profile, model_path=self.model_path,
                       **{name: getattr(self, name) for name in PER_MODEL_FIELDS})

    def to_json(self) -> dict[str, Any]:
        return _json_of(self)

    @classmethod
    def from_json(cls, raw: Any) -> ModelMemory:
        if not isinstance(raw, dict) or not isinstance(raw.get("model_path"), str):
            raise SettingsError(f"each entry of 'models' should be an object with a model_path, not {raw!r}")
        memory = cls(**_fields_from_json(cls, raw, lambda args: (
            f"'extra_args' remembered for {raw['model_path']} should be a list of arguments, not {args!r}")))
        for f in fields(cls):
            value = getattr(memory, f.name)
            want: Any = {"int": int, "bool": bool, "str": str,
                         "bool | None": (bool, type(None))}.get(str(f.type))
            if (want is not None
                    and (not isinstance(value, want) or (want is int and isinstance(value, bool)))):
                raise SettingsError(f"setting {f.name!r} remembered for {memory.model_path} has the wrong "
                                    f"type: {value!r}")
        return memory


PER_MODEL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModelMemory) if f.name != "model_path")


@dataclass(frozen=True)
class Settings:
    profile: ServerProfile = field(default_factory=ServerProfile)
    idle_save_seconds: float = DEFAULT_IDLE_SAVE_SECONDS
    restore_on_start: int | None = None  # None = one per slot
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    # On by default: once a model is chosen, a relaunch serves it (clients are not refused); with
    # no model nothing starts whatever this says. The setting turns it off.
    start_server_on_launch: bool = True
    start_at_login: bool = False
    # Restore points (core.sessions.points): for models whose restored state cannot be rolled back,
    # prefixes of each saved conversation kept beside it so a rollback re-reads no more than
    # llama-server that never stopped; earlier user-message points kept this many tokens apart.
    restore_points: bool = True
    point_spacing_tokens: int = DEFAULT_POINT_SPACING_TOKENS
    # Per-model settings, the most recently chosen model first (the Model menu's recent models).
    models: tuple[ModelMemory, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["profile"] = self.profile.to_json()
        data["models"] = [m.to_json() for m in self.models]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        data = migrate(dict(data))
        profile = ServerProfile.from_json(data.get("profile") or {})
        raw_models = data.get("models") or []
        if not isinstance(raw_models, list):
            raise SettingsError("setting 'models' should be a list of per-model settings, not "
                                f"{raw_models!r}")
        known_top = {f.name for f in fields(cls)} - {"profile", "models"}
        top = {k: v for k, v in data.items() if k in known_top}
        top["models"] = tuple(ModelMemory.from_json(m) for m in raw_models)
        top["schema_version"] = SCHEMA_VERSION
        settings = cls(profile=profile, **top)
        settings.check_types()
        return settings

    def check_types(self) -> None:
        p = self.profile
        expect: list[tuple[str, Any, tuple[type, ...]]] = [
            ("port", p.port, (int,)),
            ("ctx", p.ctx, (int,)),
            ("parallel", p.parallel, (int,)),
            ("flash_attn", p.flash_attn, (bool, type(None))),
            ("swa_full", p.swa_full, (bool,)),
            ("host", p.host, (str,)),
            ("cache_type_k", p.cache_type_k, (str,)),
            ("cache_type_v", p.cache_type_v, (str,)),
            ("model_path", p.model_path, (str, type(None))),
            ("server_bin", p.server_bin, (str, type(None))),
            ("idle_save_seconds", self.idle_save_seconds, (int, float)),
            ("restore_on_start", self.restore_on_start, (int, type(None))),
            ("budget_bytes", self.budget_bytes, (int,)),
            ("start_server_on_launch", self.start_server_on_launch, (bool,)),
            ("start_at_login", self.start_at_login, (bool,)),
            ("restore_points", self.restore_points, (bool,)),
            ("point_spacing_tokens", self.point_spacing_tokens, (int,)),
        ]
        for name, value, types in expect:
            if isinstance(value, bool) and bool not in types:
                raise SettingsError(f"setting {name!r} should be a number, not {value!r}")
            if not isinstance(value, types):
                raise SettingsError(f"setting {name!r} has the wrong type: {value!r}")
        if self.point_spacing_tokens < MIN_POINT_SPACING_TOKENS:
            raise SettingsError("setting 'point_spacing_tokens' should be at least "
                                f"{MIN_POINT_SPACING_TOKENS} tokens, not {self.point_spacing_tokens}")

    def with_profile(self, **changes: Any) -> Settings:
        return replace(self, profile=replace(self.profile, **changes))

    # -- per-model settings -----------------------------------------------------------------
    def remembered(self, model_path: str) -> ModelMemory | None:
        return next((m for m in self.models if m.model_path == model_path), None)

    def remember_model(self) -> Settings:
        """The profile's per-model values remembered for its model, which becomes the most recent."""
        if not self.profile.model_path:
            return self
        current = ModelMemory.of(self.profile)
        others = tuple(m for m in self.models if m.model_path != current.model_path)
        return replace(self, models=(current, *others)[:MAX_REMEMBERED_MODELS])

    def choose_model(self, model_path: str, **changes: Any) -> Settings:
        """Run ``model_path`` from now on: the current model's settings are remembered, the chosen
        model's remembered ones come back (a model chosen for the first time keeps the current
        values), then ``changes`` (per-model fields, e.g. ``swa_full=True``) apply."""
        unknown = set(changes) - set(PER_MODEL_FIELDS)
        if unknown:
            raise ValueError(f"not per-model settings: {', '.join(sorted(unknown))}")
        settings = self.remember_model()
        memory = settings.remembered(model_path)
        if memory is not None:
            settings = replace(settings, profile=memory.apply_to(settings.profile))
        else:
            changes = {"model_path": model_path, **changes}
        return settings.with_profile(**changes).remember_model()


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 remembers settings per model: the model of a version-1 file keeps its settings."""
    profile = data.get("profile")
    models = []
    if isinstance(profile, dict) and isinstance(profile.get("model_path"), str) and profile["model_path"]:
        models.append({"model_path": profile["model_path"],
                       **{k: profile[k] for k in PER_MODEL_FIELDS if k in profile}})
    return {**data, "models": models}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 starts the server with the app by default. Versions 1 and 2 wrote their default
    (off) into every file, so an off there is the old default, not a choice: it becomes on (the
    setting still turns it off, and a version-3 file keeps what was chosen)."""
    return {**data, "start_server_on_launch": True}


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """Version 4 leaves flash attention to "auto" (llama-server's own choice, resolved per launch)
    by default. Versions up to 3 wrote their default (off) into every file, so an off there is the
    old default, not a choice: it becomes auto, for the profile and each remembered model (an on
    stays on). A model whose saved conversations were made with it off keeps it off, decided at its
    next launch (``launching.resolve_flash_attn``), so they keep restoring."""
    out = dict(data)
    profile = out.get("profile")
    if isinstance(profile, dict) and profile.get("flash_attn") is False:
        out["profile"] = {**profile, "flash_attn": None}
    models = out.get("models")
    if isinstance(models, list):
        out["models"] = [{**m, "flash_attn": None}
                         if isinstance(m, dict) and m.get("flash_attn") is False else m for m in models]
    return out


# Migrations from older schema versions: MIGRATIONS[n] turns a version-n dict into version n+1.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise SettingsError("settings file has no schema_version")
    if version > SCHEMA_VERSION:
        raise SettingsError(
            f"settings were written by a newer Slotkeeper (schema {version}); "
            f"this version reads up to {SCHEMA_VERSION}"
        )
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
        data["schema_version"] = version
    return data


def load_settings(path: Path) -> Settings:
    """Defaults when the file is missing; SettingsError (file left untouched) when it is bad."""
    if not path.exists():
        return Settings()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} does not hold a JSON object")
    try:
        return Settings.from_json(data)
    except TypeError as exc:
        raise SettingsError(f"settings file {path} is malformed: {exc}") from exc


def save_settings(path: Path, settings: Settings) -> None:
    atomic_write_text(path, json.dumps(settings.to_json(), indent=2, sort_keys=True) + "\n")
