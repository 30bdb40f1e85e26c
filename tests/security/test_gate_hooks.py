"""An exception in a gate hook drops or answers that one message; the session goes on.

The relay runs in-process on uvloop, as `visor run` does, with a gate whose
hooks raise. The client's whole conversation is written before the relay
starts, then the client's pipe is closed: what comes back is read after the
relay has finished, so nothing here depends on timing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import uvloop

from tests.conftest import RECORDER
from visor.core.calls import CallContext
from visor.core.checks import Checks as Gate
from visor.core.checks import Verdict
from visor.relay.proxy import Relay, RelayConfig
from visor.wire.message import Message


class Boom(Exception):
    pass


class RaisingGate(Gate):
    def __init__(self, hooks: set[str]) -> None:
        self.hooks = hooks

    def _maybe(self, name: str) -> None:
        if name in self.hooks:
            raise Boom(name)

    def on_tool_call(self, msg: Message, ctx: CallContext) -> Verdict:
        self._maybe("on_tool_call")
        return super().on_tool_call(msg, ctx)

    def on_tool_result(self, request: Message | None, tool: str | None, response: Message) -> bytes | None:
        self._maybe("on_tool_result")
        return None

    def on_tools_list(self, response: Message) -> bytes | None:
        self._maybe("on_tools_list")
        return None

    def on_client_request(self, msg: Message) -> bytes | None:
        if msg.method != "ping":  # every request comes here now; the ping shows the session lives on
            self._maybe("on_client_request")
        return None

    def on_reject(self, direction: str, reason: str, rejected: Any, **record: Any) -> None:
        self._maybe("on_reject")


def run_relay(gate: Gate, lines: list[dict | bytes], tmp_path: Any) -> tuple[list[dict], list[bytes]]:
    """Relay `lines` from a client to the recorder; (what the client got, what the server got)."""
    log = tmp_path / "received.jsonl"
    os.environ["RECORDER_LOG"] = str(log)
    try:
        in_r, in_w = os.pipe()
        out_path = tmp_path / "client_out"
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        data = b"".join(
            (x if isinstance(x, bytes) else json.dumps(x, separators=(",", ":")).encode()) + b"\n"
            for x in lines
        )
        assert len(data) < 60000  # fits in the pipe: written before the relay starts
        os.write(in_w, data)
        os.close(in_w)
        relay = Relay([sys.executable, str(RECORDER)], RelayConfig(shutdown_grace=5.0), gate)
        uvloop.run(relay.run(in_r, out_fd))
        os.close(out_fd)
    finally:
        del os.environ["RECORDER_LOG"]
    out = [json.loads(x) for x in out_path.read_bytes().splitlines()]
    got = log.read_bytes().splitlines() if log.exists() else []
    return out, got


CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
READ = {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///x"}}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


def by_id(out: list[dict]) -> dict[Any, dict]:
    return {m.get("id"): m for m in out}


def test_a_raising_on_tool_call_denies_that_call_and_the_server_gets_nothing(tmp_path: Any) -> None:
    out, got = run_relay(RaisingGate({"on_tool_call"}), [CALL, PING], tmp_path)
    answers = by_id(out)
    assert answers[1]["result"]["isError"] is True
    assert "result" in answers[2]
    assert not any(b"tools/call" in line for line in got)


@pytest.mark.parametrize(("hook", "first"), [("on_tool_result", CALL), ("on_tools_list", LIST)])
def test_a_raising_result_hook_answers_an_error_never_the_unchecked_result(
    tmp_path: Any, hook: str, first: dict
) -> None:
    out, _ = run_relay(RaisingGate({hook}), [first, PING], tmp_path)
    answers = by_id(out)
    assert "error" in answers[1] and "result" not in answers[1]
    assert "result" in answers[2]


def test_a_raising_request_gate_answers_an_error_and_forwards_nothing(tmp_path: Any) -> None:
    out, got = run_relay(RaisingGate({"on_client_request"}), [READ, PING], tmp_path)
    answers = by_id(out)
    assert "error" in answers[1]
    assert "result" in answers[2]
    assert not any(b"resources/read" in line for line in got)


def test_a_raising_reject_record_does_not_stop_the_session(tmp_path: Any) -> None:
    out, _ = run_relay(RaisingGate({"on_reject"}), [b"not json", PING], tmp_path)
    assert [m.get("id") for m in out] == [None, 2]
