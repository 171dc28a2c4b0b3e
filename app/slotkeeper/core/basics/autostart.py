"""Start Slotkeeper when the user logs in, the way each desktop expects it.

- Linux and other XDG desktops: ``$XDG_CONFIG_HOME/autostart/slotkeeper.desktop``
  (XDG Autostart spec), honoured by GNOME, KDE, Xfce, Cinnamon, MATE, LXQt.
- macOS: a per-user LaunchAgent, ``~/Library/LaunchAgents/app.slotkeeper.plist``, loaded by
  launchd at the next login (RunAtLoad).
- Windows: a value in ``HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run``.

Nothing here needs administrator rights and nothing is left behind by ``disable()``.
"""

from __future__ import annotations

import os
import plistlib
import re
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import platformdirs

from slotkeeper.core.basics import paths
from slotkeeper.core.basics.fsutil import atomic_write_text

__all__ = [
    "APP_ID",
    "APP_NAME",
    "Autostart",
    "LaunchAgentAutostart",
    "RunKey",
    "Translocated",
    "WindowsRunAutostart",
    "XdgAutostart",
    "autostart_for",
    "default_command",
    "desktop_exec_line",
]

APP_NAME = "Slotkeeper"
APP_ID = "app.slotkeeper"  # LaunchAgent label (reverse-DNS, as launchd wants)
RUN_KEY_PATH = r"Software\Microsoft\Windows\CurrentVersion\Run"


def default_command(
    executable: str | None = None, frozen: bool | None = None, system: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The command line that starts this same Slotkeeper (the tray app) again, on the same data
    folder (``data_dir``: passed on when it is not the platform's default one).

    A frozen build (PyInstaller) is its own executable. From a Python install, the package is
    run as a module with the interpreter that runs us now, so the venv is kept. On Windows
    pythonw.exe is preferred: python.exe would open a console window at every login.
    """
    executable = sys.executable if executable is None else executable
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    if frozen:
        if is_translocated(executable):
            raise Translocated(
                "Slotkeeper is running from a temporary copy macOS made of it (App Translocation), "
                "which is gone after a restart. Move Slotkeeper to the Applications folder, open it "
                "from there, then turn start at login on.")
        command = [executable]
    else:
        if (system or sys.platform).lower().startswith("win"):
            exe = Path(executable)
            windowless = exe.with_name("pythonw.exe")
            if exe.name.lower() == "python.exe" and windowless.is_file():
                executable = str(windowless)
        command = [executable, "-m", "slotkeeper"]
    if data_dir is not None and Path(data_dir).resolve() != default_data_dir().resolve():
        command += ["--data-dir", str(Path(data_dir).resolve())]
    return command


class Translocated(ValueError):
    """The app runs from the random, read-only path macOS gives an app opened where it was
    downloaded (App Translocation): a path that must never be recorded."""


TRANSLOCATION_MARK = "/AppTranslocation/"


def is_translocated(executable: str) -> bool:
    """macOS runs a quarantined app that was not moved from Downloads from a randomised mount under
    ``/private/var/folders/.../AppTranslocation/<uuid>/d/``; it vanishes at the next restart."""
    return TRANSLOCATION_MARK in executable


def default_data_dir() -> Path:
    """The data folder Slotkeeper uses without --data-dir or $SLOTKEEPER_HOME."""
    return Path(platformdirs.user_data_dir(paths.APP_NAME, appauthor=False))


class Autostart(ABC):
    """One platform's "start at login" switch."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the switch lives (a file path or a registry value), to show the user."""

    @abstractmethod
    def is_enabled(self) -> bool: ...

    @abstractmethod
    def enable(self, command: list[str]) -> None:
        """Start ``command`` (argv) at every login; replaces any earlier command."""

    @abstractmethod
    def disable(self) -> None:
        """Stop starting at login; a no-op when already disabled."""


def _check_command(command: Sequence[str]) -> list[str]:
    if not command or not all(isinstance(a, str) for a in command) or not command[0]:
        raise ValueError(f"autostart command must be a non-empty list of strings, not {command!r}")
    return list(command)


# --------------------------------------------------------------------------------------
# XDG (Linux, BSD)
# --------------------------------------------------------------------------------------

# Desktop Entry spec, "The Exec key": an argument holding any of these must be quoted.
_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
# Inside double quotes, these must be backslash-escaped.
_EXEC_ESCAPE_IN_QUOTES = set('"`$\\')


def _quote_exec_arg(arg: str) -> str:
    # '%' starts a field code (%f, %u, ...) anywhere, quoted or not; '%%' is a literal '%'.
    arg = arg.replace("%", "%%")
    if arg and not any(c in _EXEC_RESERVED for c in arg):
        return arg
    escaped = "".join("\\" + c if c in _EXEC_ESCAPE_IN_QUOTES else c for c in arg)
    return f'"{escaped}"'


def _escape_string_value(value: str) -> str:
    # The spec's string-value escapes apply to the whole line *before* Exec unquoting, so
    # each backslash the quoting produced must be doubled again (a literal backslash in an
    # argument ends up as four).
    return (
        value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    )


def desktop_exec_line(command: Sequence[str]) -> str:
    """The value of ``Exec=`` that runs ``command`` exactly, per the Desktop Entry spec."""
    return _escape_string_value(" ".join(_quote_exec_arg(a) for a in _check_command(command)))


class XdgAutostart(Autostart):
    def __init__(self, config_home: Path) -> None:
        self.path = Path(config_home) / "autostart" / "slotkeeper.desktop"

    @property
    def location(self) -> str:
        return str(self.path)

    def is_enabled(self) -> bool:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return False
        keys = _desktop_entry_keys(text)
        # Either key switches the entry off (XDG Autostart spec; GNOME's own key).
        return (
            keys.get("Hidden", "false").lower() != "true"
            and keys.get("X-GNOME-Autostart-enabled", "true").lower() != "false"
        )

    def enable(self, command: list[str]) -> None:
        atomic_write_text(self.path, self._entry(command), mode=0o644)

    def disable(self) -> None:
        self.path.unlink(missing_ok=True)

    @staticmethod
    def _entry(command: list[str]) -> str:
        lines = [
            "[Desktop Entry]",
            "Type=Application",
            f"Name={APP_NAME}",
            "Comment=Keeps a local LLM's memory warm",
            f"Exec={desktop_exec_line(command)}",
            "Terminal=false",
            "X-GNOME-Autostart-enabled=true",
        ]
        return "\n".join(lines) + "\n"


def _desktop_entry_keys(text: str) -> dict[str, str]:
    """Keys of the [Desktop Entry] group (no configparser: it rejects valid entry files)."""
    keys: dict[str, str] = {}
    in_group = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            in_group = line == "[Desktop Entry]"
        elif in_group and "=" in line:
            key, value = line.split("=", 1)
            keys[key.strip()] = value.strip()
    return keys


def _xdg_config_home(env: Mapping[str, str], home: Path) -> Path:
    value = env.get("XDG_CONFIG_HOME", "")
    # The Base Directory spec says a relative path is invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return home / ".config"


# --------------------------------------------------------------------------------------
# macOS
# --------------------------------------------------------------------------------------


LAUNCHCTL_TIMEOUT_S = 5


def _launchctl(subcommand: str, service: str = "") -> str:
    """``launchctl SUBCOMMAND gui/UID[/SERVICE]``'s output ("" when it cannot be asked: not macOS)."""
    if sys.platform == "win32":
        return ""
    target = f"gui/{os.getuid()}" + (f"/{service}" if service else "")
    try:
        done = subprocess.run(["launchctl", subcommand, target], capture_output=True, text=True,
                              timeout=LAUNCHCTL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def disabled_by_user(print_disabled: str, label: str = APP_ID) -> bool:
    """True when ``launchctl print-disabled`` lists ``label`` as disabled: what turning it off in
    System Settings ▸ General ▸ Login Items does (the plist stays where it was). Both forms:
    ``"label" => disabled`` (macOS 13 and later) and ``"label" => true`` (earlier)."""
    found = re.search(r'"%s"\s*=>\s*(\w+)' % re.escape(label), print_disabled)
    return bool(found and found.group(1).lower() in ("disabled", "true"))


class LaunchAgentAutostart(Autostart):
    def __init__(self, home: Path, launchctl: Callable[..., str] = _launchctl) -> None:
        self.path = Path(home) / "Library" / "LaunchAgents" / f"{APP_ID}.plist"
        self._launchctl = launchctl

    @property
    def location(self) -> str:
        return str(self.path)

    def is_enabled(self) -> bool:
        try:
            data = plistlib.loads(self.path.read_bytes())
        except Exception:  # noqa: BLE001 - missing or damaged: launchd would not run it
            return False
        if not (isinstance(data, dict) and bool(data.get("RunAtLoad")) and not data.get("Disabled")):
            return False
        return not disabled_by_user(self._launchctl("print-disabled"))

    def enable(self, command: list[str]) -> None:
        plist: dict[str, Any] = {
            "Label": APP_ID,
            "ProgramArguments": _check_command(command),
            "RunAtLoad": True,
            # A tray app belongs to the graphical session only, not to ssh logins.
            "LimitLoadToSessionType": "Aqua",
            "ProcessType": "Interactive",
        }
        text = plistlib.dumps(plist, fmt=plistlib.FMT_XML).decode("utf-8")
        atomic_write_text(self.path, text, mode=0o644)
        # Turned off in Login Items before, launchd keeps it off whatever the plist says.
        self._launchctl("enable", APP_ID)

    def disable(self) -> None:
        self.path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------


class RunKey(Protocol):
    """The values of one registry key, as strings (the Run key holds REG_SZ command lines)."""

    def get(self, name: str) -> str | None: ...

    def set(self, name: str, value: str) -> None: ...

    def delete(self, name: str) -> None: ...


class _WinregRunKey:
    """HKCU\\...\\Run through winreg, imported only when used (it exists on Windows only)."""

    def __init__(self, key_path: str = RUN_KEY_PATH) -> None:
        self._key_path = key_path

    def get(self, name: str) -> str | None:
        # as the import would say (and mypy reads the registry API on Windows only)
        if sys.platform != "win32":
            raise ModuleNotFoundError("No module named 'winreg'", name="winreg")
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, self._key_path) as key:
                value, _kind = winreg.QueryValueEx(key, name)
        except FileNotFoundError:
            return None
        return str(value)

    def set(self, name: str, value: str) -> None:
        # as the import would say (and mypy reads the registry API on Windows only)
        if sys.platform != "win32":
            raise ModuleNotFoundError("No module named 'winreg'", name="winreg")
        import winreg

        with winreg.CreateKeyEx(
            winreg.HKEY_CURRENT_USER, self._key_path, 0, winreg.KEY_SET_VALUE
        ) as key:
            winreg.SetValueEx(key, name, 0, winreg.REG_SZ, value)

    def delete(self, name: str) -> None:
        # as the import would say (and mypy reads the registry API on Windows only)
        if sys.platform != "win32":
            raise ModuleNotFoundError("No module named 'winreg'", name="winreg")
        import winreg

        try:
            with winreg.OpenKey(
                winreg.HKEY_CURRENT_USER, self._key_path, 0, winreg.KEY_SET_VALUE
            ) as key:
                winreg.DeleteValue(key, name)
        except FileNotFoundError:
            pass


class WindowsRunAutostart(Autostart):
    def __init__(self, run_key: RunKey | None = None, value_name: str = APP_NAME) -> None:
        self._key = run_key if run_key is not None else _WinregRunKey()
        self._name = value_name

    @property
    def location(self) -> str:
        return f"HKEY_CURRENT_USER\\{RUN_KEY_PATH}\\{self._name}"

    def is_enabled(self) -> bool:
        try:
            return bool(self._key.get(self._name))
        except OSError:
            return False

    def enable(self, command: list[str]) -> None:
        # The Run key holds one command line, parsed by the usual Windows (MSVCRT) rules.
        self._key.set(self._name, subprocess.list2cmdline(_check_command(command)))

    def disable(self) -> None:
        self._key.delete(self._name)


# --------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------


def autostart_for(
    system: str | None = None,
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    run_key: RunKey | None = None,
) -> Autostart:
    """The autostart switch for ``system`` (platform.system() or sys.platform style names).

    ``home``, ``env`` and ``run_key`` default to the real ones; tests pass their own.
    """
    name = (system or sys.platform).lower()
    if name.startswith("win"):
        return WindowsRunAutostart(run_key)
    home = Path.home() if home is None else Path(home)
    if name == "darwin":
        return LaunchAgentAutostart(home)
    # Linux, the BSDs and other Unix desktops follow the XDG Autostart spec.
    return XdgAutostart(_xdg_config_home(os.environ if env is None else env, home))
