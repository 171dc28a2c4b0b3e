import pytest

from slotkeeper.core.server.command import CommandError, build_argv
from slotkeeper.core.settings import ServerProfile, SettingsError


def test_defaults_are_explicit_and_loopback():
    argv = build_argv(("/bin/llama-server",), ServerProfile(), "/m/model.gguf", "/data/sessions")
    assert argv[0] == "/bin/llama-server"
    pairs = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--") and not b.startswith("--")}
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--parallel"] == "1"  # explicit -np: KV stays per slot (not unified)
    assert pairs["--flash-attn"] == "off"  # explicit, never "auto"
    assert pairs["--slot-save-path"] == "/data/sessions"
    assert pairs["--model"] == "/m/model.gguf"
    assert "--metrics" in argv
    assert "--swa-full" not in argv


def test_profile_fields_map_to_flags():
    prof = ServerProfile(
        host="0.0.0.0", port=9000, ctx=16384, parallel=4, flash_attn=True,
        cache_type_k="q8_0", cache_type_v="q4_0", swa_full=True, extra_args=("--threads", "2"),
    )
    argv = build_argv(("llama", "serve"), prof, "m.gguf", "s")
    assert argv[:2] == ["llama", "serve"]
    joined = " ".join(argv)
    for part in ("--port 9000", "--ctx-size 16384", "--parallel 4", "--flash-attn on",
                 "--cache-type-k q8_0", "--cache-type-v q4_0", "--swa-full"):
        assert part in joined
    assert argv[-2:] == ["--threads", "2"]


def test_extra_args_cannot_override_managed_flags():
    prof = ServerProfile(extra_args=("-np", "3"))
    with pytest.raises(CommandError, match="-np"):
        build_argv(("x",), prof, "m", "s")
    with pytest.raises(CommandError, match="--slot-save-path"):
        build_argv(("x",), ServerProfile(extra_args=("--slot-save-path=/tmp",)), "m", "s")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(port=0), "port"),
        (dict(parallel=0), "slots"),
        (dict(ctx=3, parallel=4), "too small"),
        (dict(cache_type_k="q3_x"), "unknown cache type"),
    ],
)
def test_invalid_profiles_are_refused(bad, match):
    with pytest.raises(SettingsError, match=match):
        build_argv(("x",), ServerProfile(**bad), "m", "s")


def test_optional_flags_only_when_the_build_knows_them():
    old = build_argv(("x",), ServerProfile(), "m", "s", supported_flags=frozenset())
    assert "--no-cache-idle-slots" not in old and "--cache-ram" not in old
    new = build_argv(("x",), ServerProfile(), "m", "s",
                     supported_flags=frozenset({"--no-cache-idle-slots", "--cache-ram", "--no-kv-unified"}))
    assert "--no-cache-idle-slots" in new and "--no-kv-unified" in new
    assert new[new.index("--cache-ram") + 1] == "0"  # Slotkeeper keeps conversations that leave a slot
    assert "--log-verbosity" not in new  # the figures come from the responses, not the log


def test_probe_flags_reads_the_real_help(server_bin):
    from slotkeeper.core.server.locate import ServerBinary, probe_flags

    flags = probe_flags(ServerBinary((server_bin,), "test"))
    assert {"--slot-save-path", "--swa-full", "--metrics", "--no-cache-idle-slots"} <= flags


def test_kv_affecting_arguments_are_picked_out_with_their_values():
    from slotkeeper.core.server.command import kv_affecting_args

    args = ("--threads", "4", "--lora", "a.gguf", "--rope-freq-scale=0.5", "--yarn-orig-ctx", "4096", "-v")
    assert kv_affecting_args(args) == ("--lora", "a.gguf", "--rope-freq-scale=0.5", "--yarn-orig-ctx", "4096")
    assert kv_affecting_args(("--threads", "2")) == ()


@pytest.mark.parametrize("flag", ["--cache-idle-slots", "--api-prefix", "-kvu", "--no-swa-full"])
def test_extra_args_cannot_undo_what_slotkeeper_relies_on(flag):
    with pytest.raises(CommandError, match=flag):
        build_argv(("x",), ServerProfile(extra_args=(flag,)), "m", "s")


def test_the_api_key_goes_in_the_environment_never_on_the_command_line():
    from slotkeeper.core.server.command import without_api_key
    from slotkeeper.core.server.spawn import launch_environment

    extra = ("-t", "4", "--api-key", "s3cret", "--api-key=other", "--api-key-file", "k.txt", "--alias", "x")
    argv = build_argv(("x",), ServerProfile(extra_args=extra), "m", "s")
    assert "s3cret" not in " ".join(argv) and "other" not in " ".join(argv) and "k.txt" not in argv
    assert argv[-4:] == ["-t", "4", "--alias", "x"]
    assert without_api_key(extra) == ("-t", "4", "--alias", "x")
    # llama-server gets the private key only Slotkeeper knows; the user's key guards the front door
    env = launch_environment("private-key", environ={"PATH": "/bin", "LLAMA_API_KEY": "users"})
    assert env == {"PATH": "/bin", "LLAMA_API_KEY": "private-key"}


def test_slotkeeper_finds_the_key_wherever_llama_server_does(tmp_path):
    from slotkeeper.core.server.apikey import DoorKeys

    keys = tmp_path / "keys.txt"
    keys.write_text("\n# a comment\nfirst-key\n second-key \n")  # lines as llama-server reads them
    assert DoorKeys(("--api-key", "a"), environ={}).first() == "a"
    assert DoorKeys(("--api-key-file", str(keys)), environ={}).keys() == ("first-key", " second-key ")
    assert DoorKeys((f"--api-key-file={keys}",), environ={}).first() == "first-key"
    assert DoorKeys((), environ={"LLAMA_API_KEY": "env"}).first() == "env"
    assert DoorKeys((), environ={}).first() is None
    assert DoorKeys(("--api-key-file", str(tmp_path / "missing")), environ={}).first() is None

def test_the_projector_setting_becomes_mmproj_and_extra_args_cannot_name_another(tmp_path) -> None:
    from slotkeeper.core.server.command import CommandError, build_argv
    from slotkeeper.core.settings import ServerProfile

    argv = build_argv(["llama-server"], ServerProfile(mmproj_path="~/models/mmproj-x.gguf"), "m.gguf",
                      tmp_path)
    i = argv.index("--mmproj")
    assert argv[i + 1].endswith("models/mmproj-x.gguf") and "~" not in argv[i + 1]
    assert "--mmproj" not in build_argv(["llama-server"], ServerProfile(), "m.gguf", tmp_path)
    with pytest.raises(CommandError, match="--mmproj"):
        build_argv(["llama-server"], ServerProfile(extra_args=("--mmproj", "p.gguf")), "m.gguf", tmp_path)


def test_the_sse_ping_interval_is_read_as_llama_server_reads_it():
    from slotkeeper.core.server.command import SSE_PING_DEFAULT, sse_ping_interval

    assert sse_ping_interval((), {}) == SSE_PING_DEFAULT == 30
    assert sse_ping_interval(("--threads", "2", "--sse-ping-interval", "5"), {}) == 5
    assert sse_ping_interval(("--sse-ping-interval=7", "--sse-ping-interval", "-1"), {}) == -1
    assert sse_ping_interval((), {"LLAMA_ARG_SSE_PING_INTERVAL": "4"}) == 4
    assert sse_ping_interval(("--sse-ping-interval", "3"), {"LLAMA_ARG_SSE_PING_INTERVAL": "4"}) == 3
    assert sse_ping_interval(("--sse-ping-interval", "soon"), {}) == SSE_PING_DEFAULT
