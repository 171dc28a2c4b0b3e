import json

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


def test_a_profile_round_trips_through_json():
    from slotkeeper.core.settings import ServerProfile

    p = ServerProfile(model_path="/m.gguf", extra_args=("-t", "4"), swa_full=True)
    assert ServerProfile.from_json(p.to_json()) == p
    assert ServerProfile.from_json({**p.to_json(), "from_a_newer_version": 1}) == p
