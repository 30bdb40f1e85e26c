"""`--header 'Name: value'` options for an HTTP upstream, with ``${VAR}`` from the environment;
and the check every header field written by Visor's HTTP client and server passes.

Tokens stay out of client configs: ``--header 'Authorization: Bearer ${GITHUB_TOKEN}'`` takes the
token from Visor's environment when it starts. A variable that is not set is an error naming the
variable; a header value is never logged, shown in an error or kept in a repr.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# RFC 9110 5.6.2: the only characters a field name may hold.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII, space and tab: what an HTTP field value may hold (no CR, LF or NUL).
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
# CR, LF and NUL are never valid in a field (RFC 9110 5.5), nor a colon in its name: written into
# a head, they would start a header or a message of the sender's choosing.
_UNSAFE_NAME = re.compile(r"[\r\n\0:]")
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Headers the transport itself sets from the protocol: an option may not replace them, since a
#: wrong session id, version or content type would be a different conversation than Visor judged.
RESERVED = frozenset(
    name.lower()
    for name in (
        "Accept", "Content-Type", "Content-Length", "Content-Encoding", "Transfer-Encoding", "Host",
        "Connection", "Mcp-Session-Id", "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Last-Event-ID",
    )
)  # fmt: skip


class HeaderError(ValueError):
    """A --header option that cannot be used; the message never holds the value."""


@dataclass(frozen=True, slots=True)
class ExtraHeader:
    name: str
    value: str = field(repr=False)


def parse_headers(options: Sequence[str], environ: Mapping[str, str]) -> tuple[ExtraHeader, ...]:
    """Read ``Name: value`` options, taking every ``${VAR}`` in a value from `environ`."""
    out: list[ExtraHeader] = []
    seen: set[str] = set()
    for option in options:
        name, colon, raw = option.partition(":")
        name = name.strip()
        if not colon or not _TOKEN.fullmatch(name):
            shown = name if _TOKEN.fullmatch(name) else "the header"
            raise HeaderError(f"--header needs 'Name: value' with a valid header name ({shown!s} given)")
        key = name.lower()
        if key in RESERVED or key.startswith("mcp-param-"):
            raise HeaderError(f"--header {name}: Visor sets this header itself from the protocol")
        if key in seen:
            raise HeaderError(f"--header {name} given twice")
        seen.add(key)
        # HTTP drops whitespace around a field value: say the value as it will be read.
        value = _substitute(name, raw.strip(), environ).strip(" \t")
        if not _FIELD_VALUE.fullmatch(value):
            raise HeaderError(
                f"--header {name}: the value (after ${{VAR}} substitution) holds a character an HTTP "
                "header cannot carry (a control character or non-ASCII)"
            )
        out.append(ExtraHeader(name, value))
    return tuple(out)


def _substitute(header: str, raw: str, environ: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        var = m.group(1)
        if not _NAME.fullmatch(var):
            raise HeaderError(f"--header {header}: ${{{var}}} is not a valid environment variable name")
        if var not in environ:
            raise HeaderError(f"--header {header}: environment variable {var} is not set")
        return environ[var]

    return _VARIABLE.sub(one, raw)


def encode_header_value(value: str) -> str:
    """A value as the MCP transport mirrors it into a header: as is when it is plain visible
    ASCII, else (or when it looks like the sentinel itself) ``=?base64?...?=`` of its UTF-8."""
    plain = (
        _FIELD_VALUE.fullmatch(value)
        and "\t" not in value
        and value == value.strip(" ")
        and not (value.startswith("=?base64?") and value.endswith("?="))
    )
    if plain:
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii") + "?="


def unsafe_field(name: str, value: str) -> bool:
    """Whether a field cannot be written into a head as it is (a line break, a NUL, a colon in
    the name). One regex search each: the fields of every request and answer pass here."""
    return _UNSAFE_NAME.search(name) is not None or _UNSAFE_VALUE.search(value) is not None
