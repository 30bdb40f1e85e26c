"""visor/display.py: what a person is shown has every control character made visible."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from visor import display
from visor.logs import escape_controls


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcödé, 日本語, emoji 😀", "plain text, ünïcödé, 日本語, emoji 😀"),
        ("\x1b[2J\x1b[1;1HApprove? [y/N]", "\\x1b[2J\\x1b[1;1HApprove? [y/N]"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # OSC + BEL
        ("\x1b]8;;http://x\x1b\\link", "\\x1b]8;;http://x\\x1b\\link"),  # OSC 8 hyperlink, ST
        ("abc\x08\x08\x08xyz", "abc\\x08\\x08\\x08xyz"),  # backspace
        ("ok\rEVIL", "ok\\rEVIL"),
        ("a\nb\tc", "a\\nb\\tc"),
        ("\x9b31m\x85\x7f\x00", "\\x9b31m\\x85\\x7f\\x00"),  # C1 CSI, NEL, DEL, NUL
        ("\u202eevil\u202a\u202b\u202c\u202d", "\\u202eevil\\u202a\\u202b\\u202c\\u202d"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),  # bidi isolates
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("\udcff", "\\udcff"),  # a lone surrogate (surrogateescape)
        ("\U000e0041", "\\U000e0041"),  # tag character
    ],
)
def test_escape(raw: str, shown: str) -> None:
    assert display.escape(raw) == shown


def test_keep_leaves_layout_alone() -> None:
    assert display.escape("a\nb\x1b", keep="\n") == "a\nb\\x1b"


@given(st.text())
def test_nothing_a_terminal_acts_on_survives(text: str) -> None:
    out = display.escape(text)
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") for c in out)
    assert not display.has_unsafe(out)
    # printable text is untouched, but for what a terminal draws as nothing
    if text.isprintable() and not any(display.is_unsafe(c) for c in text):
        assert out == text


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))))
def test_safe_text_is_unchanged(text: str) -> None:
    # (printable characters a terminal draws as nothing are made visible: the next test)
    if not any(display.is_unsafe(c) for c in text):
        assert display.escape(text) == text


def test_values_and_json_text() -> None:
    assert display.escape_value(None) == ""
    assert display.escape_value({"k": "\x1b"}) == '{"k": "\\u001b"}'
    assert display.escape_value({"k": "\u202e"}) == '{"k": "\\u202e"}'
    assert display.json_text("a\u202eb\x1b") == '"a\\u202eb\\u001b"'
    assert json.loads(display.json_text("plain")) == "plain"


def test_console_log_processor_escapes_every_value() -> None:
    event = {
        "event": "x\x1b[2J",
        "method": "\x1b]0;t\x07",
        "nested": {"k": "\u202e"},
        "n": 3,
        "exception": "a\nb\x1b",
    }
    out = escape_controls(None, "info", event)
    assert out["event"] == "x\\x1b[2J" and out["method"] == "\\x1b]0;t\\x07" and out["n"] == 3
    assert "\u202e" not in out["nested"] and "\\u202e" in out["nested"]
    assert out["exception"] == "a\nb\\x1b"  # a traceback keeps its line breaks


@pytest.mark.parametrize(
    "ch",
    [
        "\u034f",
        "\u115f",
        "\u1160",
        "\u17b4",
        "\u180b",
        "\u2800",
        "\u3164",
        "\ufe00",
        "\ufe0f",
        "\uffa0",
        "\U000e0100",
    ],
)
def test_a_printable_character_drawn_as_nothing_is_made_visible(ch: str) -> None:
    # Two arguments that differ only by such a character (bob@exam<CGJ>ple.com) must not look the
    # same in an approval prompt: Python calls them printable, a terminal draws nothing.
    shown = display.escape(f"bob@exam{ch}ple.com")
    assert shown != "bob@example.com" and "\\" in shown and ch not in shown
    assert display.has_unsafe(f"x{ch}")
