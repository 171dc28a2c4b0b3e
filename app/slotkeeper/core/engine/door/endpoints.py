"""Who can reach what through the front door: the request target made canonical, and one table
of llama-server's endpoints (b11434, tools/server/server.cpp) that routing, the key check and the
refusals all read. Pure: no I/O.

The front door decides on the path llama-server will see and forwards exactly that path: a
target is parsed (origin form ``/a/b?q`` or absolute form ``http://host/a/b?q``), its
percent-escapes decoded, repeated slashes and ``.``/``..`` segments resolved. A target that does
not come out clean (an escaped slash or backslash, a control or non-ASCII byte, a ``..`` above the
root, a double escape, a fragment) is refused with 400 rather than guessed at. So
``/./slots/0``, ``/v1/../slots/0``, ``/%2e/slots/0`` and ``http://h/slots/0`` are all
``/slots/0``, and meet the same rule.

The table is an allow-list: a (method, path) it does not name is never forwarded. Unknown paths
get llama-server's own answers: 401 without the key (when one is set), else 404 "File Not Found".
GET and HEAD of a path that looks like a web page or one of its files (``/``, ``/index.html``,
``/bundle.js``...) pass as llama-server's web UI, public as upstream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PUBLIC = "public"  # no key needed (health checks)
PASS = "pass"  # forwarded as it is (with the key, when one is set)
GENERATE = "generate"  # runs on a slot: routed by the front desk
REFUSED = "refused"  # Slotkeeper's own business, or not routable
SLOTS = "slots"  # GET /slots: forwarded unless the user started llama-server with --no-slots
METRICS = "metrics"  # GET /metrics: forwarded only when the user asked for --metrics
OWN = "own"  # Slotkeeper's own questions (its command line's), answered by the door itself

# How a generation request's prompt is known (the front door renders and tokenizes these; a
# Responses body is first converted to the chat completion llama-server makes of it: conversions).
PROMPT_CHAT = "chat"
PROMPT_TEXT = "text"
PROMPT_RESPONSES = "responses"
PROMPT_MESSAGES = "messages"  # Anthropic's


@dataclass(frozen=True)
class Endpoint:
    kind: str
    prompt_kind: str | None = None  # GENERATE: chat, text, responses, messages; None: not known to the door
    status: int = 403  # REFUSED: the answer's status
    reason: str = ""  # REFUSED: the answer's words
    json_body: bool = False  # PASS: llama-server parses the body as JSON (the door reads it first)


SLOT_FILES = ("slot files are managed by Slotkeeper: its sessions save and restore every conversation "
              "(see `slotkeeper sessions`)")
LORA = ("LoRA adapters are set at launch (extra arguments); changing them at run time would change what the "
        "saved conversations mean")
ONE_MODEL = "Slotkeeper runs one model; choose another in the app or with --model"
UNROUTABLE = ("{what} requests cannot be given a slot by Slotkeeper, so they could replace a conversation "
              "before it is saved; they are not served through Slotkeeper")

_chat = Endpoint(GENERATE, PROMPT_CHAT)
_text = Endpoint(GENERATE, PROMPT_TEXT)
_responses = Endpoint(GENERATE, PROMPT_RESPONSES)
_messages = Endpoint(GENERATE, PROMPT_MESSAGES)
_other = Endpoint(GENERATE)
_pass = Endpoint(PASS)
_pass_json = Endpoint(PASS, json_body=True)  # its body is parsed by llama-server: checked at the door first

# (method, canonical path) -> what happens. HEAD is answered as GET (as llama-server does).
ENDPOINTS: dict[tuple[str, str], Endpoint] = {
    ("GET", "/health"): Endpoint(PUBLIC), ("GET", "/v1/health"): Endpoint(PUBLIC),
    ("POST", "/slotkeeper/transcript-check"): Endpoint(OWN, json_body=True),
    ("GET", "/metrics"): Endpoint(METRICS),
    ("GET", "/props"): _pass, ("POST", "/props"): _pass_json,
    ("GET", "/models"): _pass, ("GET", "/v1/models"): _pass,
    ("POST", "/completion"): _text, ("POST", "/completions"): _text, ("POST", "/v1/completions"): _text,
    ("POST", "/chat/completions"): _chat, ("POST", "/v1/chat/completions"): _chat,
    ("POST", "/v1/chat/completions/control"): _pass_json,
    ("POST", "/v1/responses"): _responses, ("POST", "/responses"): _responses,
    ("POST", "/v1/messages"): _messages, ("POST", "/infill"): _other,
    # Embeddings and reranking need a server started for them (--embeddings, --rerank), which
    # holds no conversations; llama-server refuses them otherwise.
    ("POST", "/embedding"): _pass_json, ("POST", "/embeddings"): _pass_json,
    ("POST", "/v1/embeddings"): _pass_json,
    ("POST", "/rerank"): _pass_json, ("POST", "/reranking"): _pass_json, ("POST", "/v1/rerank"): _pass_json,
    ("POST", "/v1/reranking"): _pass_json,
    ("POST", "/tokenize"): _pass_json, ("POST", "/detokenize"): _pass_json,
    ("POST", "/apply-template"): _pass_json,
    ("POST", "/chat/completions/input_tokens"): _pass_json,
    ("POST", "/v1/chat/completions/input_tokens"): _pass_json,
    ("POST", "/responses/input_tokens"): _pass_json, ("POST", "/v1/responses/input_tokens"): _pass_json,
    ("POST", "/v1/messages/count_tokens"): _pass_json,
    ("GET", "/lora-adapters"): _pass, ("POST", "/lora-adapters"): Endpoint(REFUSED, reason=LORA),
    ("GET", "/slots"): Endpoint(SLOTS), ("POST", "/slots"): Endpoint(REFUSED, reason=SLOT_FILES),
    ("GET", "/v1/stream"): _pass, ("DELETE", "/v1/stream"): _pass, ("POST", "/v1/streams/lookup"): _pass_json,
    ("GET", "/cors-proxy"): _pass, ("POST", "/cors-proxy"): _pass,
    ("GET", "/tools"): _pass, ("POST", "/tools"): _pass_json,
    # Designed refusals: each would take a slot Slotkeeper cannot choose (no id_slot in a form
    # upload; decision tasks pick their own slot).
    ("POST", "/v1/audio/transcriptions"): Endpoint(REFUSED, status=501,
                                                   reason=UNROUTABLE.format(what="Audio transcription")),
    ("POST", "/audio/transcriptions"): Endpoint(REFUSED, status=501,
                                                reason=UNROUTABLE.format(what="Audio transcription")),
    ("POST", "/v1/systemone"): Endpoint(REFUSED, status=501, reason=UNROUTABLE.format(what="Decision-model")),
    ("POST", "/models"): Endpoint(REFUSED, reason=ONE_MODEL),
    ("DELETE", "/models"): Endpoint(REFUSED, reason=ONE_MODEL),
    ("POST", "/models/load"): Endpoint(REFUSED, reason=ONE_MODEL),
    ("POST", "/models/unload"): Endpoint(REFUSED, reason=ONE_MODEL),
    ("GET", "/models/sse"): Endpoint(REFUSED, reason=ONE_MODEL),
}

# Web UI files: a page or one of its assets, one or more plain name segments with a known suffix.
_ASSET = re.compile(r"^(/[A-Za-z0-9][A-Za-z0-9._-]*)*/[A-Za-z0-9][A-Za-z0-9._-]*"
                    r"\.(html|js|mjs|css|svg|png|ico|json|webmanifest|woff2?|ttf|map|txt|webp|jpg|jpeg|gz)$")
WEB_UI = Endpoint(PUBLIC)


def endpoint(method: str, path: str) -> Endpoint | None:
    """What the front door does with ``method`` on the canonical ``path``; None: not a
    llama-server endpoint (never forwarded)."""
    method = "GET" if method == "HEAD" else method
    found = ENDPOINTS.get((method, path))
    if found is not None:
        return found
    if method == "POST" and path.startswith("/slots/"):
        return ENDPOINTS[("POST", "/slots")]  # /slots/:id_slot, whatever the id
    if method == "GET" and (path == "/" or _ASSET.match(path)):
        return WEB_UI
    return None


class BadTarget(ValueError):
    """A request target that does not normalise cleanly (answered 400)."""


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HEX = frozenset("0123456789abcdefABCDEF")


def canonical_target(target: str) -> tuple[str, str]:
    """(path, query) of a request target as llama-server would route it: the path decoded, with
    no empty, ``.`` or ``..`` segments; the query as sent. BadTarget when that is not clean."""
    if _SCHEME.match(target):  # absolute form: the authority is not ours to judge, the path is
        rest = target[target.index("://") + 3:]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        target = rest[cut:]
        if not target.startswith("/"):
            target = "/" + target
    if not target.startswith("/"):
        raise BadTarget("the request target must be a path")
    if "#" in target:
        raise BadTarget("the request target must not carry a fragment")
    raw_path, _, query = target.partition("?")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in target):
        raise BadTarget("the request target holds a space, a control or a non-ASCII character")
    path = _decode(raw_path)
    segments: list[str] = []
    for segment in path.split("/")[1:]:
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                raise BadTarget("the request path climbs above the root")
            segments.pop()
            continue
        segments.append(segment)
    trailing = path.endswith(("/", "/.", "/..")) and bool(segments)
    return "/" + "/".join(segments) + ("/" if trailing else ""), query


def _decode(raw: str) -> str:
    if "\\" in raw:
        raise BadTarget("the request path holds a backslash")
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        code = raw[i + 1:i + 3]
        if len(code) != 2 or not set(code) <= _HEX:
            raise BadTarget("the request path holds a malformed percent-escape")
        decoded = chr(int(code, 16))
        if decoded in "/\\%" or not (0x21 <= ord(decoded) <= 0x7E):
            raise BadTarget(f"the request path holds an escaped {decoded!r}, which has no one meaning")
        out.append(decoded)
        i += 3
    return "".join(out)
