"""adapters.providers.sse: the WHATWG event-stream rules, byte by byte.

The parser is pure, so every place the network could cut the body is tried
here; the provider tests (test_provider_openai_chat.py,
test_provider_responses.py) check the same rules over real sockets.
"""

from __future__ import annotations

import pytest

from adapters.providers.sse import SSEEvent, SSEParser


def parse(*reads: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for read in reads:
        events += parser.feed(read)
    return events + parser.close()


def datas(*reads: bytes) -> list[bytes]:
    return [data for _, data, _ in parse(*reads)]


def every_cut(body: bytes) -> list[tuple[bytes, ...]]:
    """The body as one read, cut once at every position, and byte by byte."""
    cuts: list[tuple[bytes, ...]] = [(body,)]
    cuts += [(body[:i], body[i:]) for i in range(1, len(body))]
    cuts.append(tuple(body[i : i + 1] for i in range(len(body))))
    return cuts


# -- the examples of the WHATWG spec ("Event stream interpretation") -----------------


def test_spec_example_stock_ticker() -> None:
    assert datas(b"data: YHOO\ndata: +2\ndata: 10\n\n") == [b"YHOO\n+2\n10"]


def test_spec_example_comments_and_ids() -> None:
    body = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
    assert datas(body) == [b"first event", b"second event", b" third event"]  # one space only is stripped


def test_spec_example_empty_data() -> None:
    # "data" with no colon is a data field with an empty value; an event
    # without any data field is not dispatched.
    assert datas(b"data\n\ndata\ndata\n\n") == [b"", b"\n"]
    assert datas(b"id: 3\n\nevent: x\n\n: c\n\n") == []


def test_spec_example_space_after_colon_is_optional() -> None:
    assert datas(b"data:test\n\ndata: test\n\n") == [b"test", b"test"]


# -- line endings and network reads -------------------------------------------------

LF_BODY = b': keep-alive\nevent: response.output_text.delta\nid: 7\nretry: 1000\ndata: {"a":\ndata:  1}\n\ndata: [DONE]\n\n'
EXPECTED = [(b"response.output_text.delta", b'{"a":\n 1}'), (None, b"[DONE]")]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_ending_at_every_cut(ending: bytes) -> None:
    body = LF_BODY.replace(b"\n", ending)
    for reads in every_cut(body):
        assert [(kind, data) for kind, data, _ in parse(*reads)] == EXPECTED, reads


def test_mixed_line_endings() -> None:
    assert datas(b"data: a\r\ndata: b\rdata: c\n\r\n\r\rdata: d\n\n") == [b"a\nb\nc", b"d"]


def test_crlf_cut_between_cr_and_lf_is_one_line_end() -> None:
    # Taken for two line ends, the LF would be a blank line and dispatch "{".
    assert datas(b"data: {\r", b"\ndata: }\r\n\r\n") == [b"{\n}"]
    assert datas(b"data: {\r", b"\n", b"data: }\r\n\r\n") == [b"{\n}"]


def test_a_lone_cr_at_the_end_of_a_read_ends_its_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r\r") == [(None, b"x", b"data: x")]
    assert parser.feed(b"data: y\r") == []
    assert parser.feed(b"\r") == [(None, b"y", b"data: y")]


def test_events_complete_with_the_read_that_ends_them() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: 1\n\ndata: 2\n") == [(None, b"1", b"data: 1")]
    assert parser.feed(b"\nda") == [(None, b"2", b"data: 2")]
    assert parser.feed(b"ta: 3\n\n") == [(None, b"3", b"data: 3")]


def test_a_long_line_in_many_reads() -> None:
    big = b"x" * 300_000
    body = b"data: " + big + b"\n\ndata: small\n\n"
    reads = [body[i : i + 8192] for i in range(0, len(body), 8192)]
    assert datas(*reads) == [big, b"small"]


# -- fields ------------------------------------------------------------------------


def test_event_type_applies_to_one_event_only() -> None:
    events = parse(b"event: first\ndata: 1\n\ndata: 2\n\nevent: lost\n\ndata: 3\n\nevent:\ndata: 4\n\n")
    assert [(kind, data) for kind, data, _ in events] == [(b"first", b"1"), (None, b"2"), (None, b"3"), (None, b"4")]


def test_the_last_event_field_wins() -> None:
    assert parse(b"event: a\nevent: b\ndata: 1\n\n")[0][0] == b"b"


def test_ignored_fields_and_comments() -> None:
    body = b":\n: ping\nid: 1\nid\nretry: 3000\nretry: soon\nfoo: bar\nDATA: no\ndata : no\ndatax: no\n data: no\ndata: yes\n\n"
    assert datas(body) == [b"yes"]


def test_only_one_leading_space_is_stripped_and_nothing_else() -> None:
    assert datas(b"data:   a  \n\ndata:\tb\n\n") == [b"  a  ", b"\tb"]


def test_a_colon_in_the_value_is_kept() -> None:
    assert datas(b'data: {"url": "http://x"}\n\n') == [b'{"url": "http://x"}']


def test_raw_keeps_the_data_lines_as_received() -> None:
    assert parse(b"data: {broken\n\n") == [(None, b"{broken", b"data: {broken")]
    assert parse(b"data:a\r\n: c\r\ndata: b\r\n\r\n") == [(None, b"a\nb", b"data:a\ndata: b")]


def test_a_byte_order_mark_is_skipped_once() -> None:
    bom = b"\xef\xbb\xbf"
    for reads in every_cut(bom + b"data: 1\n\n"):
        assert datas(*reads) == [b"1"]
    # Not at the start of the stream it is part of the line (an unknown field here).
    assert datas(b"data: 1\n\n" + bom + b"data: 2\n\n") == [b"1"]


# -- the end of the body -----------------------------------------------------------


def test_the_last_event_counts_without_its_blank_line() -> None:
    """turnlog's one difference from the spec (which drops it): the transport
    decides from the events whether the stream ended properly."""
    assert datas(b"data: 1\n\ndata: 2") == [b"1", b"2"]
    assert datas(b"data: 1\n\ndata: 2\n") == [b"1", b"2"]
    assert datas(b"data: 1\n\ndata: 2\r") == [b"1", b"2"]
    assert datas(b"data: 1\n\n: bye") == [b"1"]
    assert datas(b"") == []


def test_close_returns_nothing_twice() -> None:
    parser = SSEParser()
    parser.feed(b"data: 1")
    assert parser.close() == [(None, b"1", b"data: 1")]
    assert parser.close() == []
