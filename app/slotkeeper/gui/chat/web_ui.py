"""Whether the running llama-server serves its own chat page (builds may leave it out, or a user
may start it with --no-webui): asked once it is ready, off the GUI thread, with the standard
library (the app does not load httpx until a download needs it)."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from urllib.parse import urlsplit

TIMEOUT_S = 5.0


def serves_web_ui(base_url: str, api_key: Callable[[], str | None] | None = None) -> bool:
    """GET ``{base_url}/`` answers 200 with an HTML page (any failure: no)."""
    url = urlsplit(base_url)
    if url.scheme != "http" or not url.hostname:
        return False
    headers = {"Accept": "text/html"}
    key = api_key() if api_key is not None else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=TIMEOUT_S)
    try:
        conn.request("GET", "/", headers=headers)
        r = conn.getresponse()
        r.read(64 * 1024)
        return r.status == 200 and (r.getheader("Content-Type") or "").lower().startswith("text/html")
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
