"""What `slotkeeper sessions ...` prints for a person, on real sessions folders: the list's table,
`show`'s summary, ids given by their start or starting with "-", and `search --json`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sessions_helpers import make_session, run_cli

from slotkeeper.cli.commands import main
from slotkeeper.cli.sessions import cut, model_labels, short_model_name
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.services.sessions import AmbiguousSessionId, SessionsService
from slotkeeper.core.sessions.naming import MIN_ID_PREFIX
from slotkeeper.core.sessions.search import SearchIndex
from slotkeeper.core.sessions.sidecar import RestoreRecord
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore

LONG_TITLE = "A rather long question about the borrow checker, closures and lifetimes in Rust"
SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


@pytest.fixture
def paths(tmp_path):
    return app_paths(tmp_path / "data").ensure()


def sessions(paths, *args: str, capsys) -> tuple[int, str, str]:
    """`slotkeeper sessions --data-dir DATA ARGS...` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(["sessions", "--data-dir", str(paths.data_dir), *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def three(paths):
    """Two saves of Qwen3-8B's Q4_K_M (one pinned, one a branch of it) and one of gemma."""
    make_session(paths.sessions_dir, "3f9c2a7b1e04", title=LONG_TITLE, pinned=True,
                 used="2026-01-03T12:00:00Z", model_path="/models/Qwen3-8B-Q4_K_M.gguf", model_sha256=SHA_A,
                 n_tokens=5012)
    make_session(paths.sessions_dir, "3f11aa7b1e04", title="Short one", used="2026-01-02T12:00:00Z",
                 model_path="/models/Qwen3-8B-Q4_K_M.gguf", model_sha256=SHA_A, parent="3f9c2a7b1e04")
    make_session(paths.sessions_dir, "0123456789ab", title="Gemma chat", used="2026-01-01T12:00:00Z",
                 model_path="C:\\models\\gemma-3-4b-it-Q8_0.gguf", model_sha256=SHA_B, restore_mode="exact")
    return paths


# -- sessions list ----------------------------------------------------------------------------
def test_the_list_has_a_header_a_model_column_and_titles_cut_with_an_ellipsis(three, capsys):
    code, out, err = sessions(three, "list", capsys=capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "MODEL", "TOKENS", "SIZE", "LAST", "USED", "RESTORES", "TITLE"]
    first = lines[1]
    assert first.startswith("* 3f9c2a7b1e04  Qwen3-8B ") and "5,012" in first and "works" in first
    assert first.endswith("…") and LONG_TITLE[:30] in first and LONG_TITLE not in first
    assert ("gemma-3-4b-it " in lines[3] and "exact continuation only" in lines[3]
            and lines[3].endswith("Gemma chat"))
    column = lines[0].index("MODEL")  # the columns line up under the header
    assert [lines[1].index("Qwen3"), lines[2].index("Qwen3"), lines[3].index("gemma")] == [column] * 3
    assert lines[4] == "3 saved conversations, 2.9 KiB on disk  (* = pinned)"
    assert len(lines) == 5


def test_an_empty_folder_is_one_clear_line(paths, capsys):
    code, out, _err = sessions(paths, "list", capsys=capsys)
    assert (code, out) == (0, "No saved conversations yet.\n")


def test_one_session_is_one_saved_conversation(paths, capsys):
    make_session(paths.sessions_dir, "aaaaaaaaaaaa")
    _code, out, _err = sessions(paths, "list", capsys=capsys)
    assert out.splitlines()[-1] == "1 saved conversation, 1000 B on disk"  # nothing pinned: no legend


def test_the_list_json_is_what_it_was(three, capsys):
    """`list --json`: each session's ``to_json()``, most recently used first (scripts rely on it)."""
    code, out, _err = sessions(three, "list", "--json", capsys=capsys)
    assert code == 0
    rows = json.loads(out)
    assert rows == [e.to_json() for e in SessionStore(three.sessions_dir).listing().sessions]
    assert [r["id"] for r in rows] == ["3f9c2a7b1e04", "3f11aa7b1e04", "0123456789ab"]
    assert "model" not in rows[0] and rows[0]["kv_file"] == "3f9c2a7b1e04.00000000.kv"


def test_short_model_names_keep_their_case_and_drop_the_quantization():
    assert short_model_name("/m/Qwen3-8B-Q4_K_M.gguf") == "Qwen3-8B"
    assert short_model_name("C:\\m\\mistral-7b-instruct-v0.2.Q4_K_M.gguf") == "mistral-7b-instruct-v0.2"
    assert short_model_name("/m/Meta-Llama-3.1-8B-Instruct-IQ4_XS.gguf") == "Meta-Llama-3.1-8B-Instruct"
    assert short_model_name("/m/tiny.gguf") == "tiny"


def sidecar(path: str, sha: str):
    from types import SimpleNamespace

    return SimpleNamespace(model_path=path, model_sha256=sha)


def test_models_that_would_show_the_same_name_are_told_apart():
    same_model = [sidecar("/a/Qwen3-8B-Q4_K_M.gguf", SHA_A), sidecar("/moved/Qwen3-8B-Q4_K_M.gguf", SHA_A)]
    assert model_labels(same_model) == {SHA_A: "Qwen3-8B"}, "one model (same content) in two places"
    two_quants = [sidecar("/a/Qwen3-8B-Q4_K_M.gguf", SHA_A), sidecar("/a/Qwen3-8B-Q8_0.gguf", SHA_B)]
    assert model_labels(two_quants) == {SHA_A: "Qwen3-8B-Q4_K_M", SHA_B: "Qwen3-8B-Q8_0"}
    same_name = two_quants + [sidecar("/b/Qwen3-8B-Q8_0.gguf", SHA_C), sidecar("/c/gemma.gguf", "d" * 64)]
    assert model_labels(same_name) == {SHA_A: "Qwen3-8B-Q4_K_M", SHA_B: "Qwen3-8B-Q8_0 (bbbbbbbb)",
                                       SHA_C: "Qwen3-8B-Q8_0 (cccccccc)", "d" * 64: "gemma"}


def test_two_models_of_one_name_in_the_list(paths, capsys):
    make_session(paths.sessions_dir, "aaaaaaaaaaaa", model_path="/a/Qwen3-8B-Q8_0.gguf", model_sha256=SHA_A)
    make_session(paths.sessions_dir, "bbbbbbbbbbbb", model_path="/b/Qwen3-8B-Q8_0.gguf", model_sha256=SHA_B)
    _code, out, _err = sessions(paths, "list", capsys=capsys)
    assert "Qwen3-8B-Q8_0 (aaaaaaaa)" in out and "Qwen3-8B-Q8_0 (bbbbbbbb)" in out


def test_cut_marks_what_it_leaves_out():
    assert cut("short", 10) == "short"
    assert cut("exactly 10", 10) == "exactly 10"
    assert cut("one two three four", 10) == "one two t…" and len(cut("x" * 80, 50)) == 50
    assert cut("one two   three", 9) == "one two…", "no space before the ellipsis"
    assert cut("a\nb", 10) == "a b", "one line"


# -- sessions show ----------------------------------------------------------------------------
INTERNALS = ("kv_file", "content_hash", "tokens_digest", "verified", "schema_version", "mtime", "ino",
             "kv_unified", "n_ctx_slot")


def test_show_is_a_summary_to_read_and_json_has_every_field(three, capsys):
    store = SessionStore(three.sessions_dir)
    store.update("3f11aa7b1e04", lambda s: replace(s, last_restore=RestoreRecord(
        at="2026-01-02T10:00:00Z", slot=1, n_restored=4000, cache_n=4000, prompt_n=12, effective=True)))
    assert store.verify("3f11aa7b1e04").status == "ok"  # records a verified stamp in the sidecar
    code, out, err = sessions(three, "show", "3f11aa7b1e04", capsys=capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Short one"
    text = "\n".join(lines)
    for expected in ("/models/Qwen3-8B-Q4_K_M.gguf (qwen3", "5,012", "1000 B on disk", "last used",
                     "2026-01-02", "pinned", "works", "full attention",
                     "branched from  3f9c2a7b1e04 (A rather", "into slot 1, 4,000 tokens", "status", "ok",
                     "sessions show --json 3f11aa7b1e04"):
        assert expected in text, (expected, text)
    for internal in INTERNALS:
        assert internal not in text, internal
    code, out, _err = sessions(three, "show", "3f11aa7b1e04", "--json", capsys=capsys)
    data = json.loads(out)
    assert (code == 0 and data["kv_file"] == "3f11aa7b1e04.00000000.kv"
            and data["content_hash"].startswith("xxh3"))
    assert data["verified"]["ino"] > 0 and data["parent"] == "3f9c2a7b1e04"


def test_show_says_what_is_wrong(three, capsys):
    kv = three.sessions_dir / "0123456789ab.00000000.kv"
    kv.write_bytes(b"\0" * 10)
    code, out, _err = sessions(three, "show", "0123456789ab", capsys=capsys)
    assert code == 0
    assert "CORRUPT" in out and "10 bytes; 1000 were saved" in out and "exact continuation only" in out
    (three.sessions_dir / "bbbbbbbbbbbb.json").write_text("{ not json")
    code, out, err = sessions(three, "show", "bbbb", capsys=capsys)
    assert code == 0 and "Traceback" not in err
    assert "cannot be read" in out and "bbbbbbbbbbbb" in out and "unreadable sidecar" in out


# -- ids by their start -----------------------------------------------------------------------
@pytest.mark.parametrize("action", ["show", "pin", "unpin", "verify", "delete"])
def test_every_action_takes_the_start_of_an_id(three, capsys, action):
    code, out, err = sessions(three, action, "0123", capsys=capsys)
    assert code == 0, err
    assert "0123456789ab" in out
    store = SessionStore(three.sessions_dir)
    if action == "delete":
        assert [e.id for e in store.sessions()] == ["3f9c2a7b1e04", "3f11aa7b1e04"]
    if action == "pin":
        assert store.get("0123456789ab").sidecar.pinned


def test_a_start_of_several_ids_names_them_and_changes_nothing(three, capsys):
    before = sorted(p.name for p in three.sessions_dir.iterdir())
    for action in ("show", "delete", "pin", "verify"):
        code, out, err = sessions(three, action, "3f", capsys=capsys)
        assert code == 1 and not out and "Traceback" not in err
        assert f"at least {MIN_ID_PREFIX} characters" in err
    make_session(three.sessions_dir, "3f9cffffffff", title="Another")
    code, out, err = sessions(three, "delete", "3f9c", capsys=capsys)
    assert code == 1 and not out
    assert "'3f9c' could be any of 2 saved conversations; give more of the id:" in err
    assert "  3f9c2a7b1e04  A rather long" in err and "  3f9cffffffff  Another" in err
    assert sorted(p.name for p in three.sessions_dir.iterdir()) == sorted(before + ["3f9cffffffff.json",
                                                                                  "3f9cffffffff.00000000.kv"])


def test_no_match_is_not_found_and_paths_are_still_refused(three, capsys):
    code, _out, err = sessions(three, "show", "9999", capsys=capsys)
    assert code == 1 and "no saved session with id '9999'" in err
    code, _out, err = sessions(three, "delete", "../0123", capsys=capsys)
    assert code == 1 and "is not a session id" in err


def test_the_service_resolves_whole_ids_first(paths):
    make_session(paths.sessions_dir, "abcd")
    make_session(paths.sessions_dir, "abcdef")
    make_session(paths.sessions_dir, "ab")
    service = SessionsService(SessionStore(paths.sessions_dir), in_slots=frozenset, budget=lambda: 10**9)
    assert service.resolve_id("abcd") == "abcd", "a whole id, though it starts another"
    assert service.resolve_id("ab") == "ab" and service.resolve_id("abcde") == "abcdef"
    with pytest.raises(AmbiguousSessionId) as info:
        service.resolve_id("abc")
    assert info.value.candidates == [] and "too short" in str(info.value)
    with pytest.raises(SessionNotFound):
        service.resolve_id("abcdeg")


# -- ids that start with "-" ------------------------------------------------------------------
DASHED = "-x1f2e3d4c5b"


@pytest.mark.parametrize("action", ["show", "pin", "unpin", "verify", "delete"])
def test_an_id_that_starts_with_a_dash_goes_after_double_dash(paths, capsys, action):
    make_session(paths.sessions_dir, DASHED, title="Dashing")
    code, _out, err = sessions(paths, action, DASHED, capsys=capsys)
    assert code == 2 and "Traceback" not in err
    assert f"'{DASHED}' is not an option; if it is a session id, put -- before it: " \
           f"`slotkeeper sessions {action} -- {DASHED}`" in err
    code, out, err = sessions(paths, action, "--", DASHED, capsys=capsys)
    assert code == 0, err
    assert DASHED in out
    code, out, err = sessions(paths, action, "--", DASHED[:6], capsys=capsys)  # its start too
    assert code == (1 if action == "delete" else 0), err


def test_show_of_a_dashed_id_says_how_to_ask_for_its_json(paths, capsys):
    make_session(paths.sessions_dir, DASHED, title="Dashing")
    _code, out, _err = sessions(paths, "show", "--", DASHED, capsys=capsys)
    assert f"`slotkeeper sessions show --json -- {DASHED}`" in out
    code, out, _err = sessions(paths, "show", "--json", "--", DASHED, capsys=capsys)
    assert code == 0 and json.loads(out)["id"] == DASHED


def test_options_are_still_options(paths, capsys):
    make_session(paths.sessions_dir, "aaaaaaaaaaaa")
    code, out, _err = sessions(paths, "show", "--js", "aaaa", capsys=capsys)  # an abbreviation
    assert code == 0 and json.loads(out)["id"] == "aaaaaaaaaaaa"
    code, _out, err = sessions(paths, "show", "-v", capsys=capsys)
    assert code == 2 and "the following arguments are required: ID" in err and "not an option" not in err


def test_a_search_word_that_starts_with_a_dash(paths, capsys):
    code, _out, err = sessions(paths, "search", "-zeppelin", capsys=capsys)
    assert code == 2 and "if it is a word to find, put -- before it" in err
    code, out, _err = sessions(paths, "search", "--", "-zeppelin", capsys=capsys)
    assert code == 1 and "No saved conversation mentions '-zeppelin'" in out


def test_a_real_process_takes_double_dash_too(paths):
    make_session(paths.sessions_dir, DASHED, title="Dashing")
    r = run_cli(paths.data_dir, "show", "--", DASHED)
    assert r.returncode == 0 and r.stdout.startswith("Dashing\n"), r.stderr


def test_slotkeepers_own_ids_never_start_with_a_dash():
    from slotkeeper.core.sessions.sidecar import new_session_id

    assert all(new_session_id()[0] in "0123456789abcdef" for _ in range(200))


# -- sessions search --json -------------------------------------------------------------------
def test_search_json_lists_each_match_once(paths, capsys):
    sc = make_session(paths.sessions_dir, "aaaaaaaaaaaa", tokens=list(range(10, 90)), title="Herons")
    SearchIndex(paths.search_index_file).put(
        sc.id, sc.kv_file, sc.model_sha256, sc.title,
        "Where do herons nest? Herons nest in colonies called heronries, and herons hunt alone.")
    code, out, _err = sessions(paths, "search", "herons", "--json", capsys=capsys)
    [hit] = json.loads(out)
    assert code == 0 and hit["id"] == "aaaaaaaaaaaa"
    assert hit["matches"] == ["herons"], "each word once, whatever its case or how often the passage has it"
    assert hit["passage"].count("erons") == 3  # the passage itself is as it was
    code, out, _err = sessions(paths, "search", "herons", capsys=capsys)
    assert out.count("[herons]") == 2 and out.count("[Herons]") == 1


def test_show_and_list_count_a_conversations_restore_points(paths, capsys):
    from sessions_helpers import write_slot_save

    from slotkeeper.core.sessions import saving
    from slotkeeper.core.sessions.sidecar import POINT_PROMPT

    tokens = list(range(1, 1001))
    sc = make_session(paths.sessions_dir, "0123456789ab", tokens=tokens, title="Hybrid chat",
                      restore_mode="exact", arch="qwen35")
    store = SessionStore(paths.sessions_dir)
    incoming = write_slot_save(paths.sessions_dir / "incoming-0000000000000001.kv", tokens[:897],
                               kv_bytes=5000)
    written = saving.Written(incoming, tokens[:897], incoming.stat().st_size, 0, 0)
    after = saving.commit_point(store, written, sc.id, POINT_PROMPT)
    assert after is not None
    code, out, err = sessions(paths, "show", sc.id, capsys=capsys)
    assert code == 0, err
    assert "restore points" in out and "897 tokens (a prompt)" in out
    code, out, err = sessions(paths, "list", capsys=capsys)
    # Its save, its point's manifest and the pieces its point is made of (only it uses them).
    total = sc.size_bytes + after.points[0].size_bytes + sum(after.pieces.values())
    assert after.pieces and code == 0 and out.count("Hybrid chat") == 1  # one row, its point in it
    listed = json.loads(sessions(paths, "list", "--json", capsys=capsys)[1])
    assert [row["size_bytes"] for row in listed] == [total]
