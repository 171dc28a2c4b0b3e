"""The command line's defaults come from the settings, its help says them, and `--` means
"llama-server's arguments" only where llama-server is started."""

from __future__ import annotations

import json

import pytest

from slotkeeper.cli import run as cli
from slotkeeper.cli.commands import build_parser, main
from slotkeeper.cli.options import command_word as _command_word
from slotkeeper.core.settings import DEFAULT_PORT, ServerProfile

APP_CTX = ServerProfile().ctx


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes


@pytest.mark.parametrize("argv", [(), ("serve",)])
def test_help_says_the_default_port_and_address(capsys, argv):
    text = help_text(capsys, *argv)
    assert f"--port PORT port to listen on (default {DEFAULT_PORT})" in text
    assert f"http://127.0.0.1:{DEFAULT_PORT}" in text
    assert f"(default {APP_CTX})" in text


def test_model_info_estimates_at_the_apps_default_context(tmp_path, capsys):
    from slotkeeper.core.model.modelgen import write_model

    assert build_parser().parse_args(["model-info", "m.gguf"]).ctx == APP_CTX
    assert (f"--ctx N total context (default {APP_CTX}, the app's and serve's)"
            in help_text(capsys, "model-info"))
    model = write_model(tmp_path / "g.gguf", "llama")
    assert main(["model-info", str(model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv"]["n_ctx"] == APP_CTX


@pytest.mark.parametrize(("argv", "command"), [
    (["serve", "--demo", "--", "--threads", "2"], "serve"),
    (["--data-dir", "sessions", "serve"], "serve"),  # "sessions" is the folder's name here
    (["--dat", "X", "sessions", "show", "--", "-abc"], "sessions"),  # an abbreviated option, its value
    (["--port=9000", "-v", "models", "list-curated"], "models"),
    (["--demo", "--swa-full", "--", "sessions"], None),  # the desktop app; "sessions" is llama-server's
    ([], None),
])
def test_the_command_word(argv, command):
    assert _command_word(build_parser(), argv) == command


@pytest.mark.parametrize("argv", [["serve", "--demo"], ["--demo"]])
def test_arguments_after_double_dash_still_go_to_llama_server(monkeypatch, tmp_path, argv):
    got = []
    monkeypatch.setattr(cli, "cmd_serve", lambda args, extra: got.append(extra) or 0)
    monkeypatch.setattr(cli, "cmd_gui", lambda args, extra: got.append(extra) or 0)
    assert main([*argv, "--data-dir", str(tmp_path), "--", "--threads", "2"]) == 0
    assert got == [["--threads", "2"]]


def test_other_commands_refuse_stray_arguments_after_double_dash(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sessions", "list", "--data-dir", str(tmp_path), "--", "--threads"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized arguments: -- --threads" in err, "not dropped without a word"


def test_help_calls_them_conversations(capsys):
    """What people read says "conversations"; the command names keep "sessions"."""
    text = help_text(capsys)
    assert "prune saved conversations" in text and "sessions list, search" in text
    for said in ("restore conversations of SWA models", "most recent compatible saved conversations",
                 "restore this saved conversation", "disk budget for saved conversations"):
        assert said in text, said
    text = help_text(capsys, "sessions")
    assert "list saved conversations, most recently used first" in text
    assert "delete a saved conversation" in text and "ID is a session id" in text
