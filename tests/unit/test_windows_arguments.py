"""The extra llama-server arguments typed in one line (core/settings.py split_args / join_args): on
Windows split as a program's C runtime splits its command line (Microsoft's "Parsing C++
command-line arguments") and joined as subprocess writes one, so quoted paths with spaces and
backslashes survive; on every platform split(join(args)) == args."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotkeeper.core.settings import join_args, split_args

# Microsoft's table ("Parsing C++ command-line arguments", Microsoft C/C++ docs), then paths.
WINDOWS = [
    (r'"abc" d e', ["abc", "d", "e"]),
    (r'a\\b d"e f"g h', [r"a\\b", "de fg", "h"]),
    (r'a\\\"b c d', [r'a\"b', "c", "d"]),
    (r'a\\\\"b c" d e', [r"a\\b c", "d", "e"]),
    (r'a"b"" c d', ['ab" c d']),
    (r'--lora "C:\My Models\a.gguf"', ["--lora", r"C:\My Models\a.gguf"]),
    (r'--lora C:\Models\a.gguf', ["--lora", r"C:\Models\a.gguf"]),
    (r'--slot-save-path "C:\My Models\\" -t 8', ["--slot-save-path", "C:\\My Models\\", "-t", "8"]),
    ('--alias ""', ["--alias", ""]),
    ('  --jinja\t-t  4 ', ["--jinja", "-t", "4"]),
    ('--alias "half open', ["--alias", "half open"]),  # as the program would read it
    ('', []),
]


@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")


@pytest.mark.parametrize(("text", "args"), WINDOWS)
def test_windows_splits_as_the_c_runtime(windows, text, args):
    assert list(split_args(text)) == args


def test_windows_joins_as_subprocess_writes_a_command_line(windows):
    args = ("--lora", r"C:\My Models\a.gguf", "")
    assert join_args(args) == r'--lora "C:\My Models\a.gguf" ""' == subprocess.list2cmdline(args)
    assert split_args(join_args(args)) == args


def test_posix_keeps_shell_quoting():
    if sys.platform == "win32":
        pytest.skip("POSIX rules")
    assert split_args("--alias 'two words' -t 8") == ("--alias", "two words", "-t", "8")
    assert split_args(r"--lora C:\My\ Models") == ("--lora", "C:My Models")  # a shell's backslash


ARGS = st.lists(st.text(alphabet=st.sampled_from(' \t"\\\'ab:é\n$'), max_size=12) | st.text(max_size=8),
                max_size=6).map(tuple)


@pytest.mark.parametrize("platform", ["win32", "linux", "darwin"])
@settings(max_examples=400, deadline=None)
@given(args=ARGS)
def test_what_is_joined_splits_back(platform, args):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "platform", platform)
        assert split_args(join_args(args)) == args
