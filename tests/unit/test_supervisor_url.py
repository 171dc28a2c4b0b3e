"""LaunchSpec.base_url: the URL the supervisor polls, the same as the profile's."""

import pytest

from slotkeeper.core.server.supervisor import LaunchSpec
from slotkeeper.core.settings import ServerProfile


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:9000"),
        ("0.0.0.0", "http://127.0.0.1:9000"),
        ("::", "http://127.0.0.1:9000"),
        ("", "http://127.0.0.1:9000"),
        ("::1", "http://[::1]:9000"),
        ("[::1]", "http://[::1]:9000"),  # was http://[[::1]]:9000
        ("[::]", "http://127.0.0.1:9000"),
    ],
)
def test_launch_spec_base_url(host, url):
    spec = LaunchSpec(argv=("llama-server",), host=host, port=9000)
    assert spec.base_url == url
    assert spec.base_url == ServerProfile(host=host, port=9000).base_url


def test_the_log_names_llama_servers_own_address_as_private(tmp_path, caplog):
    """It answers 401 to anyone but Slotkeeper: the log must not offer it as the server's address."""
    import logging

    from slotkeeper.core.server.supervisor import ServerState, Supervisor

    sup = Supervisor(log_path=tmp_path / "llama-server.log", state_file=tmp_path / "server.json")
    with caplog.at_level(logging.INFO, logger="slotkeeper.core.server.supervisor"):
        sup._set_state(ServerState.READY, "http://127.0.0.1:49227")
    [line] = [r.getMessage() for r in caplog.records]
    assert "private address http://127.0.0.1:49227" in line and "clients use Slotkeeper's address" in line
    assert "server ready: http" not in line
