from hypothesis import given
from hypothesis import strategies as st

from visor.wire.framer import Framer, Oversize, Truncated


def feed_all(framer: Framer, chunks: list[bytes]) -> list:
    out = []
    for c in chunks:
        out.extend(framer.feed(c))
    return out


def test_lines_split_on_newline_and_one_trailing_cr_stripped() -> None:
    f = Framer()
    assert f.feed(b'{"a":1}\n{"b":2}\r\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert f.feed(b":3}\n") == [b'{"c":3}']


def test_only_one_trailing_cr_is_stripped() -> None:
    # The second CR stays in the line, where the validator refuses it.
    assert Framer().feed(b"x\r\r\n") == [b"x\r"]


def test_empty_lines_are_lines_the_relay_drops() -> None:
    assert Framer().feed(b"\n\n") == [b"", b""]


def test_partial_line_at_eof_is_reported_never_returned() -> None:
    f = Framer()
    assert f.feed(b'{"jsonrpc":"2.0"') == []
    assert f.eof() == [Truncated(16)]
    assert f.eof() == []


def test_oversize_line_is_discarded_while_streaming_and_reported_once() -> None:
    f = Framer(max_bytes=10)
    events = []
    for _ in range(1000):
        events.extend(f.feed(b"y" * 7))
        assert f.buffered <= 10
    events.extend(f.feed(b"yy\nok\n"))
    assert events == [Oversize(7002), b"ok"]


def test_oversize_line_within_one_chunk() -> None:
    assert Framer(max_bytes=4).feed(b"12345\nabcd\n") == [Oversize(5), b"abcd"]


def test_oversize_at_eof() -> None:
    f = Framer(max_bytes=4)
    f.feed(b"123456789")
    assert f.eof() == [Oversize(9)]


def test_line_exactly_at_limit_passes() -> None:
    assert Framer(max_bytes=4).feed(b"1234\n") == [b"1234"]
    f = Framer(max_bytes=4)
    assert f.feed(b"12") == []
    assert f.feed(b"34\n") == [b"1234"]


lines = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@given(lines, st.data())
def test_any_chunking_gives_the_same_frames(items: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(i + b"\n" for i in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    chunks, prev = [], 0
    for c in [*cuts, len(stream)]:
        chunks.append(stream[prev:c])
        prev = c
    whole = feed_all(Framer(max_bytes=32), [stream])
    assert feed_all(Framer(max_bytes=32), chunks) == whole
    byte_by_byte = feed_all(Framer(max_bytes=32), [stream[i : i + 1] for i in range(len(stream))])
    assert byte_by_byte == whole
    expected = [
        (i[:-1] if i.endswith(b"\r") else i) if len(i[:-1] if i.endswith(b"\r") else i) <= 32 else None
        for i in items
    ]
    for got, want in zip(whole, expected, strict=True):
        if want is None:
            assert isinstance(got, Oversize)
        else:
            assert got == want
