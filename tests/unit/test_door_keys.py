"""The front door's keys: llama-server's rules (a comma list, a file of lines with # comments,
the environment), a file read again when it changes, and a door that shuts rather than opens
when a key that was asked for cannot be read. Refusing to listen beyond loopback without one."""

from __future__ import annotations

import os

import pytest

from slotkeeper.core.server.apikey import DoorKeys, KeyUnavailable, exposure_refusal, file_keys, split_keys


def test_a_comma_list_is_several_keys_as_in_llama_server():
    assert split_keys("k1,k2") == ["k1", "k2"]
    assert split_keys("k1,,k2,") == ["k1", "k2"]
    assert split_keys('"a,b",c') == ["a,b", "c"]
    keys = DoorKeys(("--api-key", "k1,k2"), environ={})
    assert keys.check("k1") and keys.check("k2") and not keys.check("k1,k2") and not keys.check("")


def test_a_key_file_is_one_key_per_line_and_hash_lines_are_comments():
    assert file_keys("# my keys\nalpha\n\nbeta\n#gamma\n") == ["alpha", "beta"]
    assert file_keys(" spaced \n") == [" spaced "]  # taken as it is, like llama-server


def test_a_key_file_is_read_again_when_it_changes(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# comment\nfirst\n")
    keys = DoorKeys(("--api-key-file", str(f)), environ={})
    assert keys.check("first") and not keys.check("# comment")
    f.write_text("second\n")
    os.utime(f, ns=(1, 1))  # whatever the clock: the stat changed
    assert keys.check("second") and not keys.check("first")


@pytest.mark.parametrize("damage", ["missing", "empty", "comments only", "moved", "unreadable"])
def test_a_key_file_that_cannot_give_a_key_shuts_the_door(tmp_path, damage):
    f = tmp_path / "keys"
    f.write_text("k\n")
    keys = DoorKeys(("--api-key-file", str(f)), environ={})
    assert keys.check("k")
    if damage == "missing":
        f.unlink()
    elif damage == "empty":
        f.write_text("")
    elif damage == "comments only":
        f.write_text("# no key here\n")
    elif damage == "moved":
        f.rename(tmp_path / "elsewhere")
    else:
        f.chmod(0)
        if os.access(f, os.R_OK):  # root reads anything: make it a folder instead
            f.chmod(0o600)
            f.unlink()
            f.mkdir()
    with pytest.raises(KeyUnavailable, match=str(f)):
        keys.check("k")
    assert keys.first() is None


def test_the_environment_stands_in_for_a_flag_not_given():
    assert DoorKeys((), environ={"LLAMA_API_KEY": "e1,e2"}).check("e2")
    both = DoorKeys(("--api-key", "a"), environ={"LLAMA_API_KEY": "e"})
    assert both.check("a") and not both.check("e")  # the flag wins, as llama-server's env fallback
    open_door = DoorKeys((), environ={})
    assert not open_door.required and open_door.keys() == ()


def test_a_flag_without_a_value_shuts_the_door():
    with pytest.raises(KeyUnavailable):
        DoorKeys(("--api-key",), environ={}).keys()
    with pytest.raises(KeyUnavailable):
        DoorKeys(("--api-key", ","), environ={}).keys()


def test_listening_beyond_loopback_needs_a_usable_key(tmp_path):
    assert exposure_refusal("127.0.0.1", 8789, (), environ={}) is None
    assert exposure_refusal("localhost", 8789, (), environ={}) is None
    assert "without an API key" in exposure_refusal("0.0.0.0", 8789, (), environ={})
    assert exposure_refusal("0.0.0.0", 8789, ("--api-key", "k"), environ={}) is None
    assert exposure_refusal("0.0.0.0", 8789, (), environ={"LLAMA_API_KEY": "k"}) is None
    missing = tmp_path / "nope"
    assert "cannot be read" in exposure_refusal("::", 8789, ("--api-key-file", str(missing)), environ={})
