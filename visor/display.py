"""Text for a person's eyes: every control character made visible. Pure, no I/O.

Tool names, arguments, reasons and client names come from the agent, the
client or the server. Printed raw, an ESC or CSI sequence can clear the
operator's screen and paint a fake prompt, an OSC sequence can retitle the
window or plant a hyperlink, a carriage return or backspace can overwrite
what was printed before it, and a bidi override can reverse the order of
what follows. Everything Visor shows a person (the terminal prompt, stderr
log lines, `visor approve`, `visor audit show`, `visor report`) goes
through `escape`, which turns every such character into a visible escape
(`\\x1b`, `\\u202e`) and leaves the rest of the text alone. Colour is added
after escaping, by Visor, and only on a terminal without NO_COLOR.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# Control (C0, DEL, C1), format (bidi overrides and isolates, zero-width
# characters), line/paragraph separators, surrogates, private use, unassigned.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
# Printable to Python yet drawn as nothing (Unicode's default-ignorable marks and fillers, and
# the braille blank): two arguments that differ only by one would look the same in a prompt.
_INVISIBLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_unsafe(ch: str) -> bool:
    """True for a character that must never reach a terminal raw (or reaches it as nothing)."""
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES or _INVISIBLE.match(ch) is not None


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def escape(text: str, *, keep: str = "") -> str:
    """`text` with every unsafe character as a visible escape; characters in `keep` stay raw.

    `keep` is for layout Visor itself adds (a newline between lines it
    built); values from outside are escaped with nothing kept.
    """
    if text.isprintable() and _INVISIBLE.search(text) is None:  # the common case: nothing to do
        return text
    return "".join(_escape_char(ch) if ch not in keep and is_unsafe(ch) else ch for ch in text)


def escape_value(value: Any) -> str:
    """A value of any type as one safe line: strings as they are (escaped), the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return escape(value)
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return escape(text)


def json_text(value: Any) -> str:
    """`value` as JSON for display: a string's quotes and backslashes are JSON's, controls visible."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return escape(text)


def has_unsafe(text: str) -> bool:
    """True if `text` holds a character `escape` would change."""
    if text.isprintable() and _INVISIBLE.search(text) is None:
        return False
    return any(is_unsafe(ch) for ch in text)


# ------------------------------------------------------------------ colour
# The one place that looks at the outside world: whether a stream is a
# terminal that wants colour. https://no-color.org: NO_COLOR set to anything
# non-empty means none; a pipe or a file never gets escape sequences.

_SGR = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}
#: The colour of each verdict and check level.
LEVEL_COLOURS = {
    "deny": "red",
    "reject": "red",
    "fail": "red",
    "error": "red",
    "ask": "yellow",
    "warn": "yellow",
    "warning": "yellow",
    "allow": "green",
    "ok": "green",
}


def use_colour(stream: Any, environ: Any = None) -> bool:
    import os

    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def paint(text: str, colour: str | None, on: bool) -> str:
    """`text` in `colour` when `on`; the escape sequences are Visor's own, never from the text."""
    code = _SGR.get(colour or "")
    return f"\x1b[{code}m{text}\x1b[0m" if on and code else text


def colour_level(text: str, level: str, stream: Any = None) -> str:
    """A line whose colour says its level (deny, ask, FAIL, WARN, ...), on a colour terminal only."""
    import sys

    return paint(text, LEVEL_COLOURS.get(level.lower()), use_colour(stream or sys.stdout))
