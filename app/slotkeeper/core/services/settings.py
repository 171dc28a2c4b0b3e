"""The settings service: the saved settings apart from this run's command-line overrides.

`slotkeeper --port 9000` changes the port for this run only. The Settings dialog shows the value
in use and says it comes from the command line; saving the dialog never writes an override back
to the settings file unless the user changed that very value in the dialog (then their choice
is saved and wins for this run too).

Names are dotted paths into ``Settings``: ``"profile.port"``, ``"idle_save_seconds"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from slotkeeper.core.settings import Settings, SettingsError, load_settings, save_settings

__all__ = ["SettingsService", "field_names", "get_field", "with_field"]


def field_names(settings: Settings) -> list[str]:
    """Every leaf setting as a dotted name."""
    out = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        if is_dataclass(value):
            out.extend(f"{f.name}.{sub.name}" for sub in fields(value))
        elif f.name != "schema_version":
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

    def is_overridden(self, name: str) -> bool:
        return name in self._overrides

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
        save_settings(self.path, result)
        return self.effective(result)

    def update(self, current: Settings, **changes: Any) -> Settings:
        """Change some values (dotted names with "__" for "."), save, return this run's settings."""
        chosen = current
        for key, value in changes.items():
            chosen = with_field(chosen, key.replace("__", "."), value)
        return self.save(chosen)
