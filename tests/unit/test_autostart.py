"""Start-at-login switches: XDG .desktop, macOS LaunchAgent, Windows Run key (faked)."""

from __future__ import annotations

import configparser
import os
import plistlib
import re
import sys
from pathlib import Path

import pytest

from slotkeeper.core.basics.autostart import (
    APP_ID,
    LaunchAgentAutostart,
    Translocated,
    WindowsRunAutostart,
    XdgAutostart,
    autostart_for,
    default_command,
    desktop_exec_line,
    disabled_by_user,
)

TRICKY = [
    "/opt/My Apps/slot keeper/python3",
    "-m",
    "slotkeeper",
    'say "hi"',
    "$HOME",
    "back\\slash",
    "100%",
    "tick`s",
    "it's",
    "",
]


# --------------------------------------------------------------------------------------
# default_command
# --------------------------------------------------------------------------------------


def test_default_command_runs_the_current_interpreter() -> None:
    assert default_command(frozen=False, system="linux") == [sys.executable, "-m", "slotkeeper"]


def test_default_command_frozen_app_is_its_own_executable(monkeypatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert default_command() == [sys.executable]
    assert default_command(executable="/Applications/Slotkeeper.app/Contents/MacOS/Slotkeeper") == [
        "/Applications/Slotkeeper.app/Contents/MacOS/Slotkeeper"
    ]


def test_default_command_prefers_pythonw_on_windows(tmp_path: Path) -> None:
    python = tmp_path / "python.exe"
    python.write_bytes(b"")
    assert default_command(str(python), frozen=False, system="Windows")[0] == str(python)
    (tmp_path / "pythonw.exe").write_bytes(b"")
    assert default_command(str(python), frozen=False, system="Windows") == [
        str(tmp_path / "pythonw.exe"),
        "-m",
        "slotkeeper",
    ]


# --------------------------------------------------------------------------------------
# XDG
# --------------------------------------------------------------------------------------


def read_desktop(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in desktop entries
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


_STRING_ESCAPES = {"\\": "\\", "n": "\n", "t": "\t", "r": "\r", "s": " "}


def parse_exec(value: str) -> list[str]:
    """Undo desktop_exec_line the way a spec-following launcher does.

    1. string-value escapes, 2. Exec quoting (double quotes; inside them a backslash escapes
    the next character), 3. '%%' -> '%'. shlex is no help: it leaves '\\$' alone in quotes.
    """
    line = re.sub(r"\\(.)", lambda m: _STRING_ESCAPES.get(m[1], "\\" + m[1]), value)
    args: list[str] = []
    current: str | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if c == " ":
            if current is not None:
                args.append(current)
            current = None
        elif c == '"':
            current = current or ""
            i += 1
            while line[i] != '"':
                if line[i] == "\\":
                    i += 1
                current += line[i]
                i += 1
        else:
            current = (current or "") + c
        i += 1
    if current is not None:
        args.append(current)
    return [a.replace("%%", "%") for a in args]


def test_xdg_enable_writes_a_valid_desktop_entry(tmp_path: Path) -> None:
    home = tmp_path / "home"
    auto = autostart_for(system="Linux", home=home, env={})
    assert isinstance(auto, XdgAutostart)
    path = home / ".config" / "autostart" / "slotkeeper.desktop"
    assert auto.location == str(path)
    assert not auto.is_enabled()

    auto.enable(["/usr/bin/python3", "-m", "slotkeeper"])
    assert auto.is_enabled()
    entry = read_desktop(path)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Slotkeeper"
    assert entry["Exec"] == "/usr/bin/python3 -m slotkeeper"
    assert entry["X-GNOME-Autostart-enabled"] == "true"
    if os.name == "posix":
        assert path.stat().st_mode & 0o777 == 0o644


def test_xdg_exec_quoting_round_trips(tmp_path: Path) -> None:
    auto = XdgAutostart(tmp_path / "config")
    auto.enable(TRICKY)
    assert parse_exec(read_desktop(auto.path)["Exec"]) == TRICKY


def test_desktop_exec_line_rules() -> None:
    assert desktop_exec_line(["a b"]) == '"a b"'
    assert desktop_exec_line(["x", "50%"]) == "x 50%%"
    # A literal backslash in an argument becomes four in the file (spec, "The Exec key").
    assert desktop_exec_line(["a\\b"]) == '"a\\\\\\\\b"'
    assert desktop_exec_line(["$x"]) == '"\\\\$x"'
    with pytest.raises(ValueError):
        desktop_exec_line([])


def test_xdg_config_home_is_honoured_unless_relative(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    auto = autostart_for(system="linux", home=tmp_path, env={"XDG_CONFIG_HOME": str(xdg)})
    assert auto.location == str(xdg / "autostart" / "slotkeeper.desktop")
    rel = autostart_for(system="FreeBSD", home=tmp_path, env={"XDG_CONFIG_HOME": "rel/dir"})
    assert rel.location == str(tmp_path / ".config" / "autostart" / "slotkeeper.desktop")


def test_xdg_disable_and_switched_off_entries(tmp_path: Path) -> None:
    auto = XdgAutostart(tmp_path)
    auto.disable()  # no-op when absent
    auto.enable(["slotkeeper"])
    auto.enable(["slotkeeper", "--again"])  # replaces
    assert parse_exec(read_desktop(auto.path)["Exec"]) == ["slotkeeper", "--again"]
    assert [p.name for p in auto.path.parent.iterdir()] == ["slotkeeper.desktop"]

    text = auto.path.read_text()
    auto.path.write_text(
        text.replace("X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-enabled=false")
    )
    assert not auto.is_enabled()
    auto.path.write_text(text + "Hidden=true\n")
    assert not auto.is_enabled()

    auto.disable()
    assert not auto.path.exists() and not auto.is_enabled()


# --------------------------------------------------------------------------------------
# macOS
# --------------------------------------------------------------------------------------


def test_launch_agent_plist(tmp_path: Path) -> None:
    auto = autostart_for(system="Darwin", home=tmp_path)
    assert isinstance(auto, LaunchAgentAutostart)
    path = tmp_path / "Library" / "LaunchAgents" / "app.slotkeeper.plist"
    assert auto.location == str(path)
    assert not auto.is_enabled()

    auto.enable(TRICKY)
    assert auto.is_enabled()
    data = plistlib.loads(path.read_bytes())
    assert data["Label"] == APP_ID
    assert data["ProgramArguments"] == TRICKY
    assert data["RunAtLoad"] is True

    auto.disable()
    assert not path.exists() and not auto.is_enabled()
    auto.disable()


def test_launch_agent_damaged_or_disabled_plist(tmp_path: Path) -> None:
    auto = LaunchAgentAutostart(tmp_path)
    auto.path.parent.mkdir(parents=True)
    auto.path.write_text("<plist>not really")
    assert not auto.is_enabled()
    auto.enable(["/x"])
    data = plistlib.loads(auto.path.read_bytes())
    data["Disabled"] = True
    auto.path.write_bytes(plistlib.dumps(data))
    assert not auto.is_enabled()


# --------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------


class FakeRunKey:
    def __init__(self) -> None:
        self.values: dict[str, str] = {"OtherApp": r'"C:\Other\other.exe" --tray'}

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def set(self, name: str, value: str) -> None:
        self.values[name] = value

    def delete(self, name: str) -> None:
        self.values.pop(name, None)


def test_windows_run_key() -> None:
    key = FakeRunKey()
    auto = autostart_for(system="Windows", run_key=key)
    assert isinstance(auto, WindowsRunAutostart)
    assert auto.location.endswith(r"Software\Microsoft\Windows\CurrentVersion\Run\Slotkeeper")
    assert not auto.is_enabled()

    auto.enable([r"C:\Program Files\Slotkeeper\Slotkeeper.exe", "--flag", 'a "q"'])
    assert auto.is_enabled()
    assert key.values["Slotkeeper"] == (
        r'"C:\Program Files\Slotkeeper\Slotkeeper.exe" --flag "a \"q\""'
    )

    auto.disable()
    assert "Slotkeeper" not in key.values
    assert "OtherApp" in key.values  # other programs' entries are left alone
    auto.disable()
    assert not auto.is_enabled()


def test_windows_registry_errors_read_as_disabled() -> None:
    class Broken(FakeRunKey):
        def get(self, name: str) -> str | None:
            raise PermissionError("denied")

    assert not WindowsRunAutostart(Broken()).is_enabled()


@pytest.mark.skipif(sys.platform == "win32", reason="winreg exists on Windows")
def test_winreg_is_imported_only_when_used() -> None:
    auto = autostart_for(system="win32")  # constructing must not import winreg
    with pytest.raises(ImportError):
        auto.is_enabled()


def test_the_login_command_keeps_a_custom_data_folder(tmp_path: Path) -> None:
    from slotkeeper.core.basics.autostart import default_data_dir

    custom = tmp_path / "my-data"
    cmd = default_command(frozen=False, system="linux", data_dir=custom)
    assert cmd == [sys.executable, "-m", "slotkeeper", "--data-dir", str(custom.resolve())]
    # the platform's own folder needs no option (and stays right if the user moves their home)
    assert default_command(frozen=False, system="linux", data_dir=default_data_dir()) == [
        sys.executable, "-m", "slotkeeper"]
    assert default_command(executable="/opt/Slotkeeper", frozen=True, data_dir=custom)[1:] == [
        "--data-dir", str(custom.resolve())]


# --------------------------------------------------------------------------------------
# macOS: what the user did in Login Items, and App Translocation
# --------------------------------------------------------------------------------------

PRINT_DISABLED_13 = '''disabled services = {
\t"com.apple.ScreenReaderUIServer" => disabled
\t"app.slotkeeper" => disabled
}
'''


class FakeLaunchctl:
    def __init__(self, disabled: str = "") -> None:
        self.disabled = disabled
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> str:
        self.calls.append(args)
        if args == ("enable", APP_ID):
            self.disabled = ""
        return self.disabled if args[0] == "print-disabled" else ""


def test_login_items_turned_off_by_the_user_reads_as_off_and_turning_on_clears_it(tmp_path: Path) -> None:
    launchctl = FakeLaunchctl()
    auto = LaunchAgentAutostart(tmp_path, launchctl=launchctl)
    auto.enable(["/Applications/Slotkeeper.app/Contents/MacOS/slotkeeper"])
    assert auto.is_enabled()
    launchctl.disabled = PRINT_DISABLED_13  # System Settings ▸ Login Items: switched off
    assert not auto.is_enabled() and auto.path.exists()
    auto.enable(["/Applications/Slotkeeper.app/Contents/MacOS/slotkeeper"])
    assert ("enable", APP_ID) in launchctl.calls
    assert auto.is_enabled()


@pytest.mark.parametrize("text, disabled", [
    (PRINT_DISABLED_13, True),
    ('disabled services = {\n\t"app.slotkeeper" => true\n}\n', True),  # before macOS 13
    ('disabled services = {\n\t"app.slotkeeper" => enabled\n}\n', False),
    ('disabled services = {\n\t"app.slotkeeper.helper" => disabled\n}\n', False),
    ("", False),
])
def test_disabled_by_user_reads_both_forms(text: str, disabled: bool) -> None:
    assert disabled_by_user(text) is disabled


def test_a_translocated_app_is_never_recorded() -> None:
    moved = "/private/var/folders/xy/T/AppTranslocation/1F2E-3D4C/d/Slotkeeper.app/Contents/MacOS/slotkeeper"
    with pytest.raises(Translocated, match="Applications folder"):
        default_command(executable=moved, frozen=True)
    assert default_command(executable="/Applications/Slotkeeper.app/Contents/MacOS/slotkeeper",
                           frozen=True) == ["/Applications/Slotkeeper.app/Contents/MacOS/slotkeeper"]
