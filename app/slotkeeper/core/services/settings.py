"""The settings service: the saved settings apart from this run's command-line overrides.

`slotkeeper --port 9000` changes the port for this run only. The Settings dialog shows the value
in use and says it comes from the command line; saving the dialog never writes an override back
to the settings file unless the user changed that very value in the dialog (then their choice
is saved and wins for this run too).

Names are dotted paths into ``Settings``: ``"profile.port"``, ``"idle_save_seconds"``.

Settings are remembered per model (``Settings.models``): every save remembers the saved profile's
per-model values for its model, and choosing a model (``choose_model``) brings back what was
remembered for it. The remembered values are always saved ones: a command-line ``--ctx 4096``
is never remembered, and it belongs to the model it came with, so choosing another model drops
this run's per-model overrides (and the ``--model`` one); given with no model at all, they apply
to the first model chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from slotkeeper.core.settings import (
    PER_MODEL_FIELDS,
    Settings,
    SettingsError,
    load_settings,
    save_settings,
)

__all__ = ["ModelPlan", "SettingsService", "field_names", "get_field", "with_field"]

# Settings that are not values a person sets (the per-model memory is kept by the service).
_NOT_LEAVES = frozenset({"schema_version", "models"})
MODEL_OVERRIDES = frozenset({"profile.model_path", *(f"profile.{name}" for name in PER_MODEL_FIELDS)})


def field_names(settings: Settings) -> list[str]:
    """Every leaf setting as a dotted name."""
    out: list[str] = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        if is_dataclass(value):
            out.extend(f"{f.name}.{sub.name}" for sub in fields(value))
        elif f.name not in _NOT_LEAVES:
            out.append(f.name)
    return out


def get_field(settings: Settings, name: str) -> Any:
    value: Any = settings
    for part in name.split("."):
        value = getattr(value, part)
    return value


def with_field(settings: Any, name: str, value: Any) -> Any:
    head, _, rest = name.partition(".")
    if not rest:
        return replace(settings, **{head: value})
    return replace(settings, **{head: with_field(getattr(settings, head), rest, value)})


class SettingsService:
    def __init__(self, path: Path, overrides: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self._overrides: dict[str, Any] = dict(overrides or {})
        known = set(field_names(Settings()))
        unknown = set(self._overrides) - known
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")

    @property
    def overrides(self) -> dict[str, Any]:
        """This run's command-line values, by dotted name."""
        return dict(self._overrides)

    def saved(self) -> Settings:
        """The settings file (defaults when there is none); SettingsError when it is unreadable."""
        return load_settings(self.path)

    def effective(self, saved: Settings | None = None) -> Settings:
        """What this run uses: the saved settings with the overrides applied (validated)."""
        settings = self.saved() if saved is None else saved
        for name, value in self._overrides.items():
            settings = with_field(settings, name, value)
        settings.profile.validate()
        return settings

    def save(self, chosen: Settings) -> Settings:
        """Write ``chosen`` (what the dialog shows) to the file, except values that only mirror
        an override; returns the settings this run uses from now on."""
        chosen.profile.validate()
        try:
            on_disk = self.saved()
        except SettingsError:  # damaged since we started: the user's choice replaces it
            on_disk = Settings()
        result = chosen
        for name, value in list(self._overrides.items()):
            if get_field(chosen, name) == value:
                result = with_field(result, name, get_field(on_disk, name))  # keep the saved value
            else:
                del self._overrides[name]  # changed in the dialog: the user's choice is saved and wins
        result = replace(result, models=on_disk.remember_model().models).remember_model()
        save_settings(self.path, result)
        return self.effective(result)

    def update(self, current: Settings, **changes: Any) -> Settings:
        """Change some values (dotted names with "__" for "."), save, return this run's settings."""
        chosen = current
        for key, value in changes.items():
            chosen = with_field(chosen, key.replace("__", "."), value)
        return self.save(chosen)

    # -- choosing a model -------------------------------------------------------------------
    def plan_model(self, model_path: str, **changes: Any) -> ModelPlan:
        """What choosing ``model_path`` would save and run (nothing is written; reads the disk)."""
        try:
            on_disk = self.saved()
        except SettingsError:  # damaged: the choice starts from the defaults
            on_disk = Settings()
        key = remembered_key(on_disk, model_path) or model_path
        to_save = on_disk.choose_model(key, **changes)
        had_model = self._overrides.get("profile.model_path") or on_disk.profile.model_path
        # Per-model values from the command line belong to the model they came with; given with
        # no model at all, they are for the first one chosen.
        dropped = MODEL_OVERRIDES if had_model else {"profile.model_path"}
        kept = {n: v for n, v in self._overrides.items() if n not in dropped}
        settings = to_save
        for name, value in kept.items():
            settings = with_field(settings, name, value)
        return ModelPlan(to_save, settings, on_disk.remembered(key) is not None,
                         tuple(sorted(set(self._overrides) - set(kept))))

    def choose_model(self, model_path: str, **changes: Any) -> Settings:
        """Run ``model_path`` from now on with its remembered settings (``changes`` on top); saved,
        and this run's per-model overrides dropped. Returns the settings this run uses now."""
        plan = self.plan_model(model_path, **changes)
        plan.settings.profile.validate()
        save_settings(self.path, plan.to_save)
        for name in plan.dropped_overrides:
            self._overrides.pop(name, None)
        return plan.settings


@dataclass(frozen=True)
class ModelPlan:
    """Choosing a model: what the settings file gets, what this run uses, whether the model's
    settings were remembered, and the command-line values that stop applying."""

    to_save: Settings
    settings: Settings
    remembered: bool
    dropped_overrides: tuple[str, ...] = ()


def remembered_key(settings: Settings, model_path: str) -> str | None:
    """The name the model is remembered under: the same path, or another path to the same file
    (a link, ``~``); None when it is not remembered. May touch the disk."""
    if settings.remembered(model_path) is not None:
        return model_path
    target = _real(model_path)
    if target is None:
        return None
    for memory in settings.models:
        if _real(memory.model_path) == target:
            return memory.model_path
    return None


def _real(path: str) -> str | None:
    try:
        return os.path.realpath(os.path.expanduser(path))
    except (OSError, ValueError):
        return None
