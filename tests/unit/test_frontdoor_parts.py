"""The front door's byte-level helpers: what goes upstream and what is read back.

The end-to-end behaviour is in tests/e2e/test_front_door.py; these pin the edges that a real
server rarely produces (a body that names its own slot, numbers past 64 bits, a reply whose
text mentions "timings", a stream split in the middle of an event).
"""

from __future__ import annotations

import json

import pytest

from slotkeeper.core.engine.door.frontdoor import (
    BadBody,
    parse_object,
    read_json,
    single_prompt,
    with_slot,
)
from slotkeeper.core.sessions.transcripts import ReplyCollector


def test_the_slot_goes_in_front_and_the_clients_bytes_stay_as_they_were():
    raw = b'  {"prompt": "caf\\u00e9 \xc3\xa9", "n_predict": 4}'
    body = parse_object(raw)
    sent = with_slot(raw, body, 2)
    assert json.loads(sent) == {"id_slot": 2, "prompt": "café é", "n_predict": 4}
    assert sent.endswith(b'"prompt": "caf\\u00e9 \xc3\xa9", "n_predict": 4}')


def test_a_body_that_names_a_slot_is_written_anew_with_the_key_once():
    raw = b'{"id_slot": 0, "prompt": "x"}'
    sent = with_slot(raw, parse_object(raw), 3)
    assert sent.count(b"id_slot") == 1
    assert json.loads(sent) == {"id_slot": 3, "prompt": "x"}


def test_an_empty_object_and_no_slot():
    assert json.loads(with_slot(b"{}", {}, 1)) == {"id_slot": 1}
    assert with_slot(b'{"a": 1}', {"a": 1}, None) == b'{"a": 1}'


def test_only_json_objects_are_routed_and_anything_else_is_refused_not_passed_on():
    for raw, why in [(b"[1, 2]", "must be a JSON object"), (b"{nope", "not valid JSON"),
                     (b'{"id_slot": NaN}', "NaN is not a JSON number"),
                     (b'{"n_predict": Infinity}', "Infinity is not a JSON number"),
                     (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
                     (b'{"a":' * 3000 + b"1" + b"}" * 3000, "nested too deeply"),
                     (b'{"prompt": [1, 1099511627776]}', "token id 1099511627776 is out of range"),
                     (b'{"prompt": [[5, -3]]}', "token id -3 is out of range"),
                     (b'{"prompt": ["a", 2147483648]}', "out of range")]:
        with pytest.raises(BadBody, match=why):
            parse_object(raw)
    assert parse_object(b'{"seed": 123456789012345678901234567890}').keys() == {"seed"}  # past 64 bits
    # a byte order mark, as llama-server
    assert parse_object(b'\xef\xbb\xbf{"prompt": "x"}') == {"prompt": "x"}


def test_what_llama_server_would_refuse_or_not_survive_is_refused_for_every_body_it_parses():
    for raw, why in [(b'{"content": "a \\ud800 b"}', "lone surrogate"),
                     (b'{"\\udfff": 1}', "lone surrogate"),
                     (b'{"t": 1e400}', "overflows a double"), (b'[-1e400]', "overflows a double"),
                     (b'{"t": 1' + b"0" * 400 + b"}", "overflows a double"),
                     (b'{"a": "\xff"}', "not valid JSON"), (b"", "not valid JSON"),
                     (b'{"m": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested too deeply")]:
        with pytest.raises(BadBody, match=why):
            read_json(raw)
    # what llama-server reads: a surrogate pair, a large finite number, any JSON value
    read = read_json(b'{"c": "\\ud83d\\ude00", "t": 1e300, "s": 123456789012345678901234567890}')
    assert read["c"] == "\U0001f600" and read["t"] == 1e300 and read["s"] == pytest.approx(1.2345678901e29)
    assert read_json(b"[1, 2]") == [1, 2]


def test_a_body_rewritten_with_a_huge_integer_stays_valid():
    raw = b'{"id_slot": 0, "seed": 1180591620717411303424, "prompt": "x"}'
    sent = with_slot(raw, parse_object(raw), 1)
    assert json.loads(sent) == {"id_slot": 1, "seed": 2**70, "prompt": "x"}


def test_timings_are_read_from_the_timings_key_not_from_the_reply_text():
    def timings_of(data: bytes):
        reply = ReplyCollector()
        reply.feed_body(data)
        return reply.timings

    data = json.dumps({"content": 'the "timings" were {"prompt_n": 999}',
                       "timings": {"prompt_n": 12, "cache_n": 30, "prompt_ms": 4.5}}).encode()
    assert timings_of(data) == {"prompt_n": 12, "cache_n": 30, "prompt_ms": 4.5}
    assert timings_of(b'{"content": "no figures"}') is None
    assert timings_of(b'{"timings": "broken') is None
    assert timings_of(b'{"timings": {"no": "prompt_n"}}') is None


def test_stream_timings_and_text_survive_any_split():
    events = [b'data: {"content": "a"}\n\n',
              b'data: {"content": "b", "timings": {"prompt_n": 7, "cache_n": 1}}\n\n', b"data: [DONE]\n\n"]
    stream = b"".join(events)
    for cut in range(1, len(stream)):
        reply = ReplyCollector()
        reply.feed_stream(stream[:cut])
        reply.feed_stream(stream[cut:])
        assert reply.timings == {"prompt_n": 7, "cache_n": 1}, cut
        assert reply.message().content == "ab", cut


def test_the_one_prompt_a_completion_runs_is_read_as_llama_server_reads_it():
    assert single_prompt("hello") == "hello"
    assert single_prompt(["hello"]) == "hello"  # a one-item list is that prompt
    assert single_prompt([[1, 2, 3]]) == [1, 2, 3]
    assert single_prompt([1, 2, 3]) == [1, 2, 3]
    assert single_prompt([1, "two", 3]) == [1, "two", 3]  # mixed: one prompt
    assert single_prompt({"prompt_string": "x"}) == "x"
    assert single_prompt([{"prompt_string": [4, "y"]}]) == [4, "y"]
    for several_or_media in (["a", "b"], [[1], [2]], {"prompt_string": "x", "multimodal_data": ["aGk="]},
                             [], None, 5, {"other": 1}, [1.5, 2], [True, 1, [2]]):
        assert single_prompt(several_or_media) is None, several_or_media
