import sys

import pytest

from slotkeeper import __version__
from slotkeeper.cli.commands import build_parser, main
from slotkeeper.cli.options import split_extra as _split_extra


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_options_before_or_after_the_subcommand_agree():
    assert parse("--data-dir", "X", "sessions", "list").data_dir == "X"
    assert parse("sessions", "--data-dir", "X", "list").data_dir == "X"
    # global options are taken anywhere on the line, also after the last command word
    assert parse("sessions", "list", "--data-dir", "X", "--json").data_dir == "X"
    assert parse("sessions", "delete", "abc", "--data-dir", "X", "-v").verbose is True
    assert parse("sessions", "prune", "--dry-run", "--data-dir", "X").data_dir == "X"
    assert parse("serve", "--data-dir", "X").data_dir == "X"
    assert parse("model-info", "m.gguf", "-v").verbose is True
    assert parse("sessions", "list").data_dir is None and parse("sessions", "list").verbose is False
    a = parse("--port", "9000", "serve")
    b = parse("serve", "--port", "9000", "--swa-full")
    assert a.port == b.port == 9000 and b.swa_full is True and a.swa_full is None
    assert parse("--demo").demo is True and parse("--demo").command is None


def test_extra_arguments_after_double_dash():
    assert (_split_extra(["serve", "--demo", "--", "--threads", "2"])
            == (["serve", "--demo"], ["--threads", "2"]))


@pytest.mark.parametrize("argv", [["serve", "--port", "70000"], ["serve", "--budget", "lots"],
                                  ["serve", "--flash-attn", "maybe"], ["serve", "--model", "a", "--demo"]])
def test_bad_values_are_clear_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert __version__ in capsys.readouterr().out


def test_model_info_errors_and_json(tmp_path, capsys):
    bad = tmp_path / "x.gguf"
    bad.write_text("hello")
    assert main(["model-info", str(bad)]) == 2
    assert "not a GGUF" in capsys.readouterr().err
    from slotkeeper.core.model.modelgen import write_model

    model = write_model(tmp_path / "g.gguf", "gemma2")
    assert main(["model-info", str(model), "--ctx", "8192", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert (data["arch"] == "gemma2" and data["swa"]
            and data["kv"]["bytes_swa_full"] > data["kv"]["bytes_default"])


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="no-display detection is Linux (X11/Wayland) only")
def test_desktop_app_without_a_display_says_so(monkeypatch, capsys, tmp_path):
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    assert main(["--demo", "--data-dir", str(tmp_path)]) == 1
    assert "serve" in capsys.readouterr().err


def test_a_data_folder_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a folder")
    assert main(["sessions", "list", "--data-dir", str(afile)]) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err
    assert main(["serve", "--demo", "--data-dir", str(afile / "inside")]) == 2
    assert "a folder on its path is a file" in capsys.readouterr().err
    assert afile.read_text() == "not a folder"


def test_the_head_start_skips_exactly_the_commands_of_the_table_that_never_launch():
    """`__main__` cannot import the table before the head start (argparse alone costs start-up), so
    it keeps its own list: the two must name the same commands."""
    from slotkeeper.__main__ import NO_LAUNCH
    from slotkeeper.cli.commands import commands

    assert {c.name for c in commands() if not c.launches} == set(NO_LAUNCH) - {"-h", "--help", "--version"}


def test_every_command_of_the_table_is_parsed_and_dispatched(monkeypatch, tmp_path):
    """The table feeds the parser and the dispatch: a command added to it is reachable."""
    from slotkeeper.cli import commands as table_module

    ran: list[str] = []
    table = table_module.commands()
    monkeypatch.setattr(table_module.Command, "__call__",
                        lambda self, args, extra: ran.append(self.name) or 0)
    argv = {"serve": [], "model-info": ["m.gguf"], "sessions": ["list"], "models": ["list-curated"]}
    for command in table:
        assert main([command.name, *argv[command.name], "--data-dir", str(tmp_path)]) == 0
    assert ran == [c.name for c in table]


@pytest.mark.parametrize("where", [["serve"], []], ids=["serve", "desktop"])
def test_llama_servers_own_spellings_of_the_server_options_are_taken(where):
    given = {"ctx": ("-c", "--ctx-size", "--ctx"), "parallel": ("-np", "--parallel"),
             "flash_attn": ("-fa", "--flash-attn"), "cache_type_k": ("-ctk", "--cache-type-k"),
             "cache_type_v": ("-ctv", "--cache-type-v"), "model": ("-m", "--model"),
             "mmproj": ("-mm", "--mmproj")}
    values = {"ctx": ("8192", 8192), "parallel": ("3", 3), "flash_attn": ("off", False),
              "cache_type_k": ("q8_0", "q8_0"), "cache_type_v": ("q4_0", "q4_0"),
              "model": ("m.gguf", "m.gguf"), "mmproj": ("p.gguf", "p.gguf")}
    for dest, spellings in given.items():
        text, value = values[dest]
        for spelling in spellings:
            assert getattr(parse(*where, spelling, text), dest) == value, spelling
            if spelling.startswith("--"):
                assert getattr(parse(*where, f"{spelling}={text}"), dest) == value, spelling
    a = parse(*where, "-m", "m.gguf", "-c", "4096", "-np", "2", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
              "--host", "0.0.0.0", "--port", "9000", "--swa-full")
    assert (a.model, a.ctx, a.parallel, a.flash_attn, a.cache_type_k, a.cache_type_v, a.host, a.port,
            a.swa_full) == ("m.gguf", 4096, 2, True, "q8_0", "q8_0", "0.0.0.0", 9000, True)
    assert parse(*where, "-c4096").ctx == 4096


def test_llama_servers_spellings_leave_the_double_dash_pass_through_alone(monkeypatch):
    """After `--` every argument goes to llama-server as it is, whatever it is called; one that
    overrides what Slotkeeper manages is still refused there (command.OWNED_FLAGS)."""
    from slotkeeper.cli.options import command_word

    argv = ["serve", "-c", "4096", "-np", "2", "--", "--threads", "2", "-c", "9"]
    assert command_word(build_parser(), argv) == "serve"
    assert command_word(build_parser(), ["-np", "2", "-ctk", "q8_0", "serve"]) == "serve"
    mine, extra = _split_extra(argv)
    assert extra == ["--threads", "2", "-c", "9"] and parse(*mine).ctx == 4096


@pytest.mark.parametrize("argv", [["serve", "-c", "0"], ["serve", "-np", "x"], ["serve", "-fa", "maybe"],
                                  ["serve", "-m", "a", "--demo"], ["serve", "--ctx-size"]])
def test_llama_servers_spellings_get_the_same_clear_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
