"""A minimal MCP client over a child's stdio, for scaffold and doctor.

The mcp SDK is a test dependency only, so this speaks the few messages it
needs itself: initialize, notifications/initialized, tools/list (every page),
resources/list and prompts/list. Every wait has a deadline; the child is
always shut down (stdin closed, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "2025-06-18"
_MAX_PAGES = 1000
_STDERR_KEEP = 16_384


class ClientError(Exception):
    """The server did not answer as an MCP server should; the message says how."""


@dataclass(frozen=True, slots=True)
class Listing:
    server_info: dict[str, Any]
    protocol_version: str
    capabilities: dict[str, Any]
    tools: tuple[dict[str, Any], ...]
    resources: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())


class StdioClient:
    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.timeout = timeout
        self._next_id = 0
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr = bytearray()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
            )
        except OSError as e:
            raise ClientError(f"cannot start {argv[0]!r}: {e.strerror or e}") from None
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_thread.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in self.proc.stderr:
            self._stderr += chunk
            if len(self._stderr) > 2 * _STDERR_KEEP:
                del self._stderr[:-_STDERR_KEEP]

    def stderr_tail(self, lines: int = 5) -> str:
        text = bytes(self._stderr[-_STDERR_KEEP:]).decode("utf-8", "replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def _send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._gone("while sending") from None

    def _gone(self, when: str) -> ClientError:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        # the exit may be reported before stderr is fully read
        self._stderr_thread.join(timeout=2)
        status = f"exited with code {code}" if code is not None else "closed its output"
        tail = self.stderr_tail()
        return ClientError(f"the server {status} {when}" + (f"; its stderr ends:\n{tail}" if tail else ""))

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        rid = self._next_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientError(f"no answer to {method} within {self.timeout:g}s")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise self._gone(f"before answering {method}")
            try:
                reply = json.loads(line)
            except ValueError:
                continue  # not ours to judge here; a proxy in between reports it
            if not isinstance(reply, dict):
                continue
            if "method" in reply:
                self._answer_server(reply)
                continue
            if reply.get("id") != rid:
                continue
            if "error" in reply:
                err = reply["error"] if isinstance(reply["error"], dict) else {}
                raise ClientError(f"{method} failed: {err.get('message', err)} (code {err.get('code')})")
            result = reply.get("result")
            if not isinstance(result, dict):
                raise ClientError(f"{method}: the result is not an object")
            return result

    def _answer_server(self, msg: dict[str, Any]) -> None:
        """Server-to-client requests: answer ping, refuse the rest; notifications are ignored."""
        if "id" not in msg:
            return
        if msg.get("method") == "ping":
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
        else:
            self._send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "error": {"code": -32601, "message": "not supported by this client"},
                }
            )

    def close(self, grace: float = 5.0) -> int | None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for stop in (None, self.proc.terminate, self.proc.kill):
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            try:
                return self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        return None

    def __enter__(self) -> StdioClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _paged(client: StdioClient, method: str, key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_PAGES):
        result = client.request(method, {"cursor": cursor} if cursor else {})
        page = result.get(key, [])
        if not isinstance(page, list):
            raise ClientError(f"{method}: {key} is not a list")
        items.extend(x for x in page if isinstance(x, dict))
        cursor = result.get("nextCursor")
        if not cursor:
            return items
        if not isinstance(cursor, str) or cursor in seen:
            raise ClientError(f"{method}: the server repeats the cursor {cursor!r}")
        seen.add(cursor)
    raise ClientError(f"{method}: more than {_MAX_PAGES} pages")


def list_server(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 30.0,
) -> Listing:
    """Start the server, list what it offers, shut it down."""
    with StdioClient(argv, env=env, cwd=cwd, timeout=timeout) as client:
        init = client.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "visor", "version": _version()},
            },
        )
        client.notify("notifications/initialized")
        caps = init.get("capabilities") if isinstance(init.get("capabilities"), dict) else {}
        assert isinstance(caps, dict)
        notes: list[str] = []
        tools = _paged(client, "tools/list", "tools")
        extra: dict[str, list[dict[str, Any]]] = {"resources": [], "prompts": []}
        # Only ask for what the server says it has: asking otherwise is a -32601 at best.
        for kind in ("resources", "prompts"):
            if kind in caps:
                try:
                    extra[kind] = _paged(client, f"{kind}/list", kind)
                except ClientError as e:
                    notes.append(str(e))
        info = init.get("serverInfo")
        return Listing(
            server_info=info if isinstance(info, dict) else {},
            protocol_version=str(init.get("protocolVersion", "")),
            capabilities=caps,
            tools=tuple(tools),
            resources=tuple(extra["resources"]),
            prompts=tuple(extra["prompts"]),
            notes=tuple(notes),
        )


def _version() -> str:
    from visor import __version__

    return __version__


def child_env(extra: Mapping[str, object] | None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in (extra or {}).items():
        if isinstance(v, str):
            env[str(k)] = v
    return env
