"""The 2026-07-28 revision over HTTP at the gateway: requests without a session.

That revision has no `initialize` and no `Mcp-Session-Id`: every request carries its revision and
the client's capabilities in `params._meta`, and mirrors its method (and the tool, prompt or
resource it names) into the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers so that
load balancers can route without reading bodies. Two rules follow for a gateway that judges bodies:

* **One reading.** A header that says something other than the body is refused (HTTP 400,
  JSON-RPC -32020), before anything is judged: a router that sent the request by its headers and
  Visor that judged its body must be reading the same request.
* **State needs a conversation.** Visor's checks are about a conversation (what the server showed,
  what was called before, how many calls were made); without a session, every request made with
  one client credential (the `Authorization` header, or none) is one conversation with one Visor
  session state and one upstream. Clients that share a credential share a budget and a
  provenance index: stricter, never looser. Their JSON-RPC ids and progress tokens are their
  own, so the gateway gives each request an id (and token) of its own on the way in and restores
  the client's on the way out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from visor.wire import errors

#: JSON-RPC error code for a header that does not match the body (the revision's own code).
HEADER_MISMATCH = -32020
#: Error code for a revision this gateway does not serve on this path.
UNSUPPORTED_PROTOCOL_VERSION = -32022

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
# Methods whose name or uri the revision mirrors into Mcp-Name.
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_SENTINEL_HEAD, _SENTINEL_TAIL = "=?base64?", "?="
#: What every conversation's key begins with (never a minted session id, which is hex).
CONVERSATION_PREFIX = "conversation-"


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int
    message: str


def decode_header_value(value: str | None) -> str | None:
    """A mirrored header value as the client meant it (`=?base64?...?=` decoded). None when it
    is absent or its encoding is not exactly what an encoder writes (never a lenient reading)."""
    if value is None:
        return None
    if not (
        len(value) >= len(_SENTINEL_HEAD) + len(_SENTINEL_TAIL)
        and value.startswith(_SENTINEL_HEAD)
        and value.endswith(_SENTINEL_TAIL)
    ):
        # ("=?base64?=" is a plain value: its head and tail overlap, as the SDK's reader sees it)
        return value
    payload = value[len(_SENTINEL_HEAD) : -len(_SENTINEL_TAIL)]
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != payload:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_request(headers: Mapping[str, str], obj: Mapping[str, Any]) -> Refusal | None:
    """Whether a sessionless request says the same thing in its headers and its body."""
    params = obj.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or VERSION_KEY not in meta or CAPABILITIES_KEY not in meta:
        return Refusal(
            errors.INVALID_PARAMS,
            f"params._meta must carry {VERSION_KEY!r} and {CAPABILITIES_KEY!r} on this revision",
        )
    version = meta[VERSION_KEY]
    header_version = headers.get("MCP-Protocol-Version")
    if header_version is None or header_version != version:
        return Refusal(
            HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta's protocol version"
        )
    method = obj.get("method")
    if headers.get("Mcp-Method") != method:
        return Refusal(HEADER_MISMATCH, "Mcp-Method header does not match the request's method")
    key = NAME_BEARING.get(method) if isinstance(method, str) else None
    if key is not None:
        named = params.get(key) if isinstance(params, dict) else None
        if named is not None and decode_header_value(headers.get("Mcp-Name")) != named:
            return Refusal(HEADER_MISMATCH, f"Mcp-Name header does not match the request's {key!r}")
    if version not in errors.MODERN_PROTOCOL_VERSIONS:
        return Refusal(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"protocol version {str(version)[:40]!r} is not served without a session "
            f"(supported: {', '.join(sorted(errors.MODERN_PROTOCOL_VERSIONS))})",
        )
    return None


def conversation_key(authorization: str | None) -> str:
    """The conversation of every sessionless request made with this credential (a digest: the
    key names the conversation in audit records and in the shared store, never the token)."""
    if not authorization:
        return CONVERSATION_PREFIX + "anonymous"
    digest = hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return CONVERSATION_PREFIX + digest


@dataclass(frozen=True, slots=True)
class Renamed:
    """One request with the gateway's own id (and progress token): what to restore on the way out."""

    line: bytes
    internal_id: str
    client_id: Any
    internal_token: str | None
    client_token: Any

    def restore(self, line: bytes) -> bytes:
        """A line routed to this request, with the client's id or progress token back. Only that
        member changes: the rest of the server's bytes are passed on as they are (numbers that
        orjson would read inexactly, the server's own spacing)."""
        obj = orjson.loads(line)
        if not isinstance(obj, dict):
            return line
        if "method" not in obj and obj.get("id") == self.internal_id:
            return _splice(line, b"id", self.internal_id, self.client_id, ("id",))
        params = obj.get("params")
        if (
            self.internal_token is not None
            and obj.get("method") == "notifications/progress"
            and isinstance(params, dict)
            and params.get("progressToken") == self.internal_token
        ):
            return _splice(
                line, b"progressToken", self.internal_token, self.client_token, ("params", "progressToken")
            )
        return line

    def cancellation(self, reason: str) -> bytes:
        """The revision cancels a request by closing its stream: told to the relay as a cancel."""
        return orjson.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": self.internal_id, "reason": reason},
            }
        )


class Renamer:
    """Ids of one conversation's requests: unique among every client that shares it."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def rename(self, obj: dict[str, Any]) -> Renamed:
        n = next(self._counter)
        internal = f"visor-c{n}"
        out = dict(obj)
        out["id"] = internal
        params = obj.get("params")
        token: str | None = None
        client_token: Any = None
        if isinstance(params, dict):
            meta = params.get("_meta")
            if isinstance(meta, dict) and meta.get("progressToken") is not None:
                client_token = meta["progressToken"]
                token = f"visor-p{n}"
                out["params"] = {**params, "_meta": {**meta, "progressToken": token}}
        return Renamed(orjson.dumps(out), internal, obj.get("id"), token, client_token)


def _splice(line: bytes, key: bytes, internal: str, value: Any, path: tuple[str, str] | tuple[str]) -> bytes:
    """``line`` with the member ``key`` that holds ``internal`` set to ``value``. The exact bytes
    Visor's own serialiser would write are replaced where they occur once; the result is read
    back and must hold ``value`` at ``path``, else the line is rewritten whole by the standard
    library's reader, which keeps every integer exact."""
    written = orjson.dumps(internal)
    replacement = orjson.dumps(value)
    for sep in (b":", b": "):
        pattern = b'"' + key + b'"' + sep + written
        if line.count(pattern) == 1:
            spliced = line.replace(pattern, b'"' + key + b'"' + sep + replacement)
            try:
                node: Any = orjson.loads(spliced)
                for part in path:
                    node = node[part]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                break
            if node == value and type(node) is type(value):
                return spliced
            break
    obj = json.loads(line)
    target = obj
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
