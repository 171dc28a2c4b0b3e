"""The front door's aiohttp is imported without loading CA certificates (core/engine/door/httpstack.py),
and nothing else is changed by that: other HTTPS contexts load them as always."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, ssl
    from slotkeeper.core.engine.door import frontdoor
    from slotkeeper.core.engine.door.httpstack import aiohttp
    print(json.dumps({
        "aiohttp": aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
        "after": ssl.create_default_context().cert_store_stats()["x509_ca"],
        "patched": "set_default_verify_paths" in ssl.SSLContext.__dict__,
        "same_web": frontdoor.web is __import__("aiohttp.web").web,
    }))
""")


def test_aiohttp_loads_no_certificates_and_the_ssl_module_is_left_as_it_was():
    if ssl.create_default_context().cert_store_stats()["x509_ca"] == 0:
        pytest.skip("this system has no CA certificates to skip")
    out = json.loads(subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    assert out["aiohttp"] == 0  # its default HTTPS contexts (unused: the front door is plain HTTP)
    assert out["after"] > 0 and out["patched"] is False  # everyone else's contexts are as before
    assert out["same_web"] is True
