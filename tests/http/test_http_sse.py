"""The event-stream reader: the HTML standard's rules, any chunking, bounded memory."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from visor.http.sse import Event, EventReader, EventTooLarge, SseItem


def feed_all(reader: EventReader, chunks: list[bytes]) -> list[SseItem]:
    out: list[SseItem] = []
    for c in chunks:
        out.extend(reader.feed(c))
    return out


def reference(stream: bytes) -> tuple[list[Event], str, int | None]:
    """The standard's algorithm written the plain way, over the whole stream at once."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    parts = re.split(rb"\r\n|\r|\n", stream)
    lines = parts[:-1]  # the last part has no line end: an incomplete line, never processed
    events: list[Event] = []
    data: list[bytes] = []
    kind, id_buffer, last_id, retry = "", "", "", None
    for line in lines:
        if line == b"":
            last_id = id_buffer
            if data:
                events.append(Event(b"\n".join(data), kind or "message", id_buffer))
            data, kind = [], ""
            continue
        if line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            kind = value.decode("utf-8", "replace")
        elif field == b"id" and b"\0" not in value:
            id_buffer = value.decode("utf-8", "replace")
        elif field == b"retry" and value and all(48 <= b <= 57 for b in value):
            retry = int(value)
    return events, last_id, retry


def test_line_ends_crlf_cr_and_lf_all_end_lines() -> None:
    out = EventReader().feed(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")
    assert out == [Event(b"a"), Event(b"b"), Event(b"c")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    # Were the LF read as a second line end, "data: a" would be dispatched
    # at once and "data: b" would become a separate event.
    r = EventReader()
    assert r.feed(b"data: a\r") == []
    assert r.feed(b"\ndata: b\n\n") == [Event(b"a\nb")]


def test_multi_line_data_joined_with_lf_and_one_space_after_colon_removed() -> None:
    out = EventReader().feed(b"data:first\ndata:  second\ndata\n\n")
    assert out == [Event(b"first\n second\n")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    out = EventReader().feed(b": keep-alive\nfoo: bar\ndata: x\n:another\n\n")
    assert out == [Event(b"x")]


def test_event_type_and_id_and_the_id_persists() -> None:
    r = EventReader()
    out = r.feed(b"event: custom\nid: 7\ndata: a\n\ndata: b\n\n")
    assert out == [Event(b"a", "custom", "7"), Event(b"b", "message", "7")]
    assert r.last_event_id == "7"


def test_event_without_data_is_not_dispatched_but_its_id_counts() -> None:
    # How an MCP server primes a stream for resumption: an id with empty data.
    r = EventReader()
    assert r.feed(b"id: prime-1\ndata:\n\n") == [Event(b"", "message", "prime-1")]
    r2 = EventReader()
    assert r2.feed(b"id: prime-2\n\n") == []
    assert r2.last_event_id == "prime-2"


def test_an_id_with_nul_is_ignored_and_an_empty_id_resets() -> None:
    r = EventReader()
    r.feed(b"id: 1\n\n")
    r.feed(b"id: 2\x003\n\n")
    assert r.last_event_id == "1"
    r.feed(b"id\n\n")
    assert r.last_event_id == ""


def test_id_seen_but_event_not_finished_is_not_the_last_event_id() -> None:
    # Resuming from an id whose event never arrived whole would skip that event.
    r = EventReader()
    r.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b\n")
    assert r.last_event_id == "1"


def test_retry_only_when_all_ascii_digits() -> None:
    r = EventReader()
    r.feed(b"retry: 1500\n\n")
    assert r.retry == 1500
    for bad in (b"retry: 15x\n\n", b"retry: -1\n\n", b"retry:\n\n", "retry: ١٢\n\n".encode()):
        r.feed(bad)
        assert r.retry == 1500


def test_bom_skipped_once_at_start_even_split() -> None:
    r = EventReader()
    assert r.feed(b"\xef") == []
    assert r.feed(b"\xbb\xbfdata: a\n\n") == [Event(b"a")]
    # A second BOM is content: here it makes the field name unknown.
    assert EventReader().feed(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n") == []


def test_incomplete_event_at_eof_is_dropped_and_reported() -> None:
    r = EventReader()
    assert r.feed(b"data: a\n\ndata: half") == [Event(b"a")]
    assert r.eof() > 0
    assert EventReader().eof() == 0


def test_event_over_the_cap_is_discarded_then_the_stream_goes_on() -> None:
    r = EventReader(max_event_bytes=32)
    out = r.feed(b"data: " + b"x" * 20 + b"\ndata: " + b"y" * 20 + b"\n\ndata: ok\n\n")
    assert len(out) == 2
    assert isinstance(out[0], EventTooLarge) and out[0].size > 32
    assert out[1] == Event(b"ok")


def test_one_endless_line_is_held_to_the_cap_while_it_streams() -> None:
    r = EventReader(max_event_bytes=1024)
    r.feed(b"data: ")
    for _ in range(1000):
        assert r.feed(b"z" * 4096) == []
        assert len(r._line) <= 1024  # nothing of the line is kept past the cap
    out = r.feed(b"\n\ndata: next\n\n")
    assert isinstance(out[0], EventTooLarge) and out[0].size > 4_000_000
    assert out[1:] == [Event(b"next")]


def test_keep_alive_comments_never_add_up_to_the_cap() -> None:
    r = EventReader(max_event_bytes=64)
    for _ in range(1000):
        r.feed(b": keep-alive\n")
    assert r.feed(b"data: real\n\n") == [Event(b"real")]


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventReader(0)


_PIECES = st.sampled_from(
    [b"data", b"data:", b"data: ", b"id: 4", b"id:\x00", b"event: e", b"retry: 30", b"retry: x",
     b":", b" ", b"x", b"{}", b"\r", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\xff", b"\x00"]
)  # fmt: skip


@given(st.lists(_PIECES, max_size=40), st.lists(st.integers(0, 400), max_size=8))
def test_any_chunking_gives_what_the_plain_algorithm_gives(pieces: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pieces)
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    r = EventReader()
    got = feed_all(r, chunks)
    events, last_id, retry = reference(stream)
    assert got == events
    assert r.last_event_id == last_id
    assert r.retry == retry
    bytewise = EventReader()
    assert feed_all(bytewise, [stream[i : i + 1] for i in range(len(stream))]) == events
    assert bytewise.last_event_id == last_id


@given(st.binary(max_size=600), st.integers(1, 64))
def test_bounded_for_any_bytes_and_one_byte_at_a_time_agrees(stream: bytes, cap: int) -> None:
    whole = EventReader(cap)
    bytewise = EventReader(cap)
    a = whole.feed(stream)
    b = feed_all(bytewise, [stream[i : i + 1] for i in range(len(stream))])
    assert a == b
    for item in a:
        if isinstance(item, Event):
            assert len(item.data) <= cap
