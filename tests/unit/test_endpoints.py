"""The front door's request targets and its one table: every spelling of a path means what
llama-server would make of it, and nothing that is not in the table is forwarded.

The real front door against a real llama-server is in tests/e2e/test_door_hardening.py; these
pin the rules with many generated spellings."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.endpoints import BadTarget, canonical_target, endpoint


@pytest.mark.parametrize("target, path, query", [
    ("/slots/0?action=save", "/slots/0", "action=save"),
    ("/./slots/0?action=save", "/slots/0", "action=save"),
    ("/v1/../slots/0", "/slots/0", ""),
    ("/%2e/slots/0", "/slots/0", ""),
    ("/%2E%2E/x/../slots", None, None),  # above the root
    ("/a/%2e%2e/slots/%30", "/slots/0", ""),
    ("//slots///0", "/slots/0", ""),
    ("http://127.0.0.1:9/slots/0?x=1", "/slots/0", "x=1"),
    ("HTTP://evil.example/./lora-adapters", "/lora-adapters", ""),
    ("http://h?q=1", "/", "q=1"),
    ("/slots%2f0", None, None),  # an escaped slash has no one meaning
    ("/slots%5c0", None, None),
    ("/x\\..\\slots", None, None),
    ("/%252e/slots", None, None),  # a double escape
    ("/slots%00", None, None),
    ("/sl%ots", None, None),
    ("/slots#frag", None, None),
    ("*", None, None),
    ("slots/0", None, None),
    ("/v1/chat/completions/", "/v1/chat/completions/", ""),  # a trailing slash is another path, as upstream
    ("/", "/", ""),
    ("/.", "/", ""),
])
def test_targets_normalise_as_llama_server_would_route_them_or_are_refused(target, path, query):
    if path is None:
        with pytest.raises(BadTarget):
            canonical_target(target)
    else:
        assert canonical_target(target) == (path, query)


def test_the_table_is_an_allow_list():
    assert endpoint("POST", "/slots/0").kind == endpoints.REFUSED
    assert endpoint("POST", "/slots/123abc").kind == endpoints.REFUSED
    assert endpoint("POST", "/slots").kind == endpoints.REFUSED
    assert endpoint("POST", "/lora-adapters").kind == endpoints.REFUSED
    assert endpoint("GET", "/lora-adapters").kind == endpoints.PASS
    assert endpoint("POST", "/completion").prompt_kind == endpoints.PROMPT_TEXT
    assert endpoint("POST", "/v1/chat/completions").prompt_kind == endpoints.PROMPT_CHAT
    assert endpoint("POST", "/v1/messages").kind == endpoints.GENERATE
    assert endpoint("POST", "/v1/audio/transcriptions").kind == endpoints.REFUSED
    for path in ("/v1/audio/transcriptions", "/audio/transcriptions", "/v1/systemone"):  # refused in words
        refused = endpoint("POST", path)
        assert refused.status == 501 and "cannot be given a slot" in refused.reason
        assert refused.prompt_kind is None
    assert endpoint("HEAD", "/slots").kind == endpoints.SLOTS
    assert endpoint("GET", "/health").kind == endpoints.PUBLIC
    assert endpoint("GET", "/").kind == endpoints.PUBLIC  # the web UI, public as upstream
    assert endpoint("GET", "/bundle.js").kind == endpoints.PUBLIC
    # Not llama-server endpoints, or not with that method: never forwarded.
    for method, path in [("GET", "/completion"), ("DELETE", "/slots/0"), ("PUT", "/completion"),
                         ("GET", "/slots/0"), ("POST", "/"), ("GET", "/etc/passwd"),
                         ("GET", "/v1/chat/completions/"), ("POST", "/predict"), ("GET", "/slots.json/../x")]:
        assert endpoint(method, path) is None, (method, path)


BLOCKED = ["/slots/0", "/slots/1", "/slots", "/lora-adapters", "/models/load"]


def spellings(path: str, rng: random.Random) -> str:
    """One way of writing ``path`` that a client could send: dot segments, repeated slashes,
    percent-escapes (either case), detours through other folders, absolute form, a query."""
    out = []
    for seg in path.strip("/").split("/"):
        for _ in range(rng.randrange(3)):
            out.append(rng.choice([".", "", "%2e", "%2E", "v1/..", "x/%2e%2e", "a/b/../..", "./."]))
        out.append("".join(f"%{ord(c):02{rng.choice('xX')}}" if rng.random() < 0.3 else c for c in seg))
    target = "/" + "/".join(out)
    if rng.random() < 0.3:
        target = rng.choice(["http://127.0.0.1:1", "HTTP://localhost", "http://a.b:99"]) + target
    if rng.random() < 0.5:
        target += rng.choice(["?action=save", "?action=restore&x=1", "?"])
    return target


@pytest.mark.parametrize("blocked", BLOCKED)
def test_thousands_of_spellings_of_a_blocked_endpoint_never_reach_it(blocked):
    rng = random.Random(blocked)
    refused = 0
    for _ in range(1000):
        target = spellings(blocked, rng)
        try:
            path, _query = canonical_target(target)
        except BadTarget:
            refused += 1
            continue
        assert path == blocked, target  # whatever it looked like, it is judged as what it is
        ep = endpoint("POST", path)
        assert ep is not None and ep.kind == endpoints.REFUSED, target
    assert refused < 1000  # most spellings are valid ones, judged and refused by the table


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="/.%2eEfF5c0slotsv1?#:\\ax", min_size=1, max_size=40))
def test_any_target_is_refused_or_names_a_clean_path(target):
    try:
        path, _query = canonical_target(target)
    except BadTarget:
        return
    assert path.startswith("/")
    segments = path.strip("/").split("/")
    assert "." not in segments and ".." not in segments and "//" not in path
    assert "%" not in path and "\\" not in path
    if path.rstrip("/").startswith("/slots/"):
        assert endpoint("POST", path).kind == endpoints.REFUSED
