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
