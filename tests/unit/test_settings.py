import json
from dataclasses import replace
from pathlib import Path

import pytest

from slotkeeper.core import settings as st


def test_roundtrip_and_defaults(tmp_path):
    path = tmp_path / "settings.json"
    assert st.load_settings(path) == st.Settings()
    s = st.Settings(idle_save_seconds=3, budget_bytes=1024).with_profile(
        port=9100, extra_args=("--threads", "2")
    )
    st.save_settings(path, s)
    assert st.load_settings(path) == s
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_newer_schema_and_bad_types_are_refused_and_file_kept(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(st.SettingsError, match="newer Slotkeeper"):
        st.load_settings(path)
    assert json.loads(path.read_text()) == {"schema_version": 99}
    path.write_text(json.dumps({"schema_version": 1, "profile": {"port": "80"}}))
    with pytest.raises(st.SettingsError, match="port"):
        st.load_settings(path)
    path.write_text("{not json")
    with pytest.raises(st.SettingsError, match="cannot read"):
        st.load_settings(path)


def test_migrations_chain(monkeypatch):
    monkeypatch.setattr(st, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(st.MIGRATIONS, 1, lambda d: {**d, "renamed": True})
    out = st.migrate({"schema_version": 1})
    assert out == {"schema_version": 2, "renamed": True}


def test_stored_v1_file_still_loads():
    from pathlib import Path

    data = Path(__file__).parent.parent / "data" / "settings_v1.json"
    s = st.load_settings(data)
    assert s.profile.port == 8789 and s.budget_bytes == 20 * 1024**3
    assert s.start_server_on_launch is True  # version 1's off was its default, not a choice


def test_the_server_starts_with_the_app_by_default():
    """Once a model is chosen a relaunch serves it (with no model nothing starts anyway)."""
    assert st.Settings().start_server_on_launch is True
    assert st.Settings.from_json({"schema_version": st.SCHEMA_VERSION}).start_server_on_launch is True


def test_a_stored_v2_file_starts_the_server_with_the_app(tmp_path):
    """A version-2 file as the first run's "Use this model" wrote it: a model, and the old default
    (off) written out. It loads with the server started at launch; saved again it is version 3."""
    from pathlib import Path

    data = Path(__file__).parent.parent / "data" / "settings_v2.json"
    raw = json.loads(data.read_text())
    assert raw["schema_version"] == 2 and raw["start_server_on_launch"] is False
    s = st.load_settings(data)
    assert s.profile.model_path == "/models/SmolLM2-135M-Instruct-Q8_0.gguf" and len(s.models) == 1
    assert s.start_server_on_launch is True
    path = tmp_path / "settings.json"
    st.save_settings(path, s)
    assert json.loads(path.read_text())["schema_version"] == 4


def test_turned_off_in_a_v3_file_it_stays_off(tmp_path):
    path = tmp_path / "settings.json"
    st.save_settings(path,
                     st.Settings(start_server_on_launch=False).with_profile(model_path="/models/a.gguf"))
    assert json.loads(path.read_text())["schema_version"] == 4
    assert st.load_settings(path).start_server_on_launch is False


def test_a_v3_file_leaves_flash_attention_to_auto_unless_it_was_turned_on(tmp_path):
    """Version 3 wrote its default (off) into every file: an off there becomes auto, for the profile
    and each remembered model; an on stays on. Auto written by version 4 stays auto, a choice stays."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({
        "schema_version": 3, "profile": {"model_path": "/models/a.gguf", "flash_attn": False},
        "models": [{"model_path": "/models/a.gguf", "flash_attn": False},
                   {"model_path": "/models/b.gguf", "flash_attn": True}]}))
    s = st.load_settings(path)
    assert s.profile.flash_attn is None
    assert [m.flash_attn for m in s.models] == [None, True]
    for chosen in (None, False, True):
        st.save_settings(path, s.with_profile(flash_attn=chosen))
        assert st.load_settings(path).profile.flash_attn is chosen
    assert st.Settings().profile.flash_attn is None  # a new installation: auto


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8789"),
        ("localhost", "http://localhost:8789"),
        ("192.168.1.5", "http://192.168.1.5:8789"),
        # Wildcards listen everywhere; a local client reaches them over loopback.
        ("0.0.0.0", "http://127.0.0.1:8789"),
        ("", "http://127.0.0.1:8789"),
        ("::", "http://127.0.0.1:8789"),
        ("[::]", "http://127.0.0.1:8789"),
        # IPv6 literals are bracketed exactly once.
        ("::1", "http://[::1]:8789"),
        ("[::1]", "http://[::1]:8789"),
        ("fe80::1", "http://[fe80::1]:8789"),
        ("[fe80::1]", "http://[fe80::1]:8789"),
    ],
)
def test_connect_url(host, url):
    assert st.connect_url(host, 8789) == url
    assert st.ServerProfile(host=host).base_url == url


def test_malformed_settings_are_clear_errors_not_tracebacks(tmp_path):
    import json

    import pytest

    from slotkeeper.core.settings import SettingsError, load_settings

    path = tmp_path / "settings.json"
    for bad, words in (({"profile": "default"}, "profile"),
                       ({"profile": {"extra_args": "--threads 4"}}, "list of arguments"),
                       ({"profile": {"cache_type_k": 8}}, "cache_type_k"),
                       ({"restore_on_start": "all"}, "restore_on_start"),
                       ({"start_at_login": "yes"}, "start_at_login")):
        path.write_text(json.dumps({"schema_version": 1, **bad}))
        with pytest.raises(SettingsError, match=words):
            load_settings(path)


def test_a_host_list_is_refused_with_a_clear_message():
    import pytest

    from slotkeeper.core.settings import ServerProfile, SettingsError

    for host in ("127.0.0.1,::1", " "):
        with pytest.raises(SettingsError, match="one address"):
            ServerProfile(host=host).validate()
    ServerProfile(host="::1").validate()


def test_a_profile_round_trips_through_json():
    from slotkeeper.core.settings import ServerProfile

    p = ServerProfile(model_path="/m.gguf", extra_args=("-t", "4"), swa_full=True)
    assert ServerProfile.from_json(p.to_json()) == p
    assert ServerProfile.from_json({**p.to_json(), "from_a_newer_version": 1}) == p


def test_restore_points_are_on_by_default_and_a_file_without_them_reads_as_on(tmp_path):
    data = Path(__file__).parent.parent / "data" / "settings_v2.json"
    s = st.load_settings(data)  # written before restore points existed
    assert s.restore_points is True and s.point_spacing_tokens == st.DEFAULT_POINT_SPACING_TOKENS
    path = tmp_path / "settings.json"
    st.save_settings(path, replace(s, restore_points=False, point_spacing_tokens=1024))
    again = st.load_settings(path)
    assert again.restore_points is False and again.point_spacing_tokens == 1024
    with pytest.raises(st.SettingsError, match="point_spacing_tokens"):
        st.Settings(point_spacing_tokens=3).check_types()
