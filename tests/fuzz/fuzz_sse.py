"""atheris target: the event-stream reader and the body checks (visor/http/) on arbitrary bytes.

Invariants: any chunking gives the events one whole feed gives (CRLF split across reads
included); the reader holds at most the cap of one line; no dispatched event is over the
cap; `classify_body` never raises, and a message it accepts is newline-free and parses to
the same value as the bytes received.

Run through `make fuzz` (target "sse"), or by hand:
    python -m tests.fuzz.fuzz_sse WORK_CORPUS tests/fuzz/corpus/sse -max_total_time=60
"""

from __future__ import annotations

import sys

import orjson

try:
    import atheris
except ImportError:  # the hypothesis fallback imports check() without it
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["visor"]):
        from visor.http.bodies import classify_body
        from visor.http.sse import Event, EventReader
        from visor.wire.message import Message, Rejected
else:
    from visor.http.bodies import classify_body
    from visor.http.sse import Event, EventReader
    from visor.wire.message import Message, Rejected

from tests.fuzz.invariants import chunks_of

CAPS = (16 * 1024 * 1024, 1, 16, 64, 300)


def check(data: bytes) -> set[str]:
    """The invariants for one input; an AssertionError is a violation. Returns the
    known open issues hit (none: the fuzz runner's interface)."""
    if len(data) < 2:
        return set()
    cap = CAPS[data[0] % len(CAPS)]
    stream = data[2:]
    whole = EventReader(cap)
    want = whole.feed(stream)
    want_pending = whole.eof()
    chunked = EventReader(cap)
    got = []
    for chunk in chunks_of(stream, data[1]):
        got.extend(chunked.feed(chunk))
        # (up to two bytes of a possible byte order mark are held whatever the cap)
        assert len(chunked._line) <= max(cap, 2), f"reader holds a {len(chunked._line)}-byte line, cap {cap}"
    assert got == want, f"chunking {data[1]} changed the events: {got!r} != {want!r}"
    assert chunked.last_event_id == whole.last_event_id and chunked.retry == whole.retry
    assert chunked.eof() == want_pending
    for item in want:
        if type(item) is Event:
            assert len(item.data) <= cap
            _check_body(item.data)
    _check_body(stream)
    return set()


def _check_body(body: bytes) -> None:
    result = classify_body(body)
    assert type(result) in (Message, Rejected)
    if type(result) is Message:
        assert b"\n" not in result.raw and b"\r" not in result.raw
        assert orjson.loads(result.raw) == orjson.loads(body)


def test_one_input(data: bytes) -> None:
    check(data)


def main() -> None:
    assert atheris is not None, "atheris is not installed (pip install -e '.[fuzz]')"
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
