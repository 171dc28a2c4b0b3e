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
