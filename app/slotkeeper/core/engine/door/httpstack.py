"""aiohttp (the front door's server and client), imported without loading CA certificates.

aiohttp builds its two default HTTPS contexts when it is imported (``aiohttp.connector``), and
each loads every CA certificate of the system: about 0.1 s of CPU on every start, spent while
llama-server loads its model on the same cores. The front door speaks plain HTTP only, to its
clients and to llama-server on loopback; so loading the certificates is skipped while aiohttp is
imported. Its default contexts then trust no certificate at all: an HTTPS request through them
would fail, never succeed wrongly. ``ssl.SSLContext`` is itself again as soon as aiohttp is in:
every other context (the model downloads') loads the certificates as always.
"""

from __future__ import annotations

import ssl
import sys


def _skip(self: ssl.SSLContext) -> None:
    pass


if "aiohttp" not in sys.modules and "set_default_verify_paths" not in ssl.SSLContext.__dict__:
    ssl.SSLContext.set_default_verify_paths = _skip  # type: ignore[method-assign]
    try:
        import aiohttp
        from aiohttp import web
    finally:
        del ssl.SSLContext.set_default_verify_paths
else:
    import aiohttp
    from aiohttp import web

__all__ = ["aiohttp", "web"]
