"""The wire rules through a real `visor run`: what the client gets, and that the server got nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import VisorProcess, received, sentinel

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


def test_valid_messages_pass_byte_for_byte(visor: VisorProcess, recorder_log: Path) -> None:
    # Odd spacing and key order survive: the relay never re-encodes what it does not change.
    line = b'{ "method" : "tools/call", "jsonrpc":"2.0", "params":{"arguments":{"b":1,"a":"\\u00e9"},"name":"echo"},"id":12345678901234567}'
    visor.send(line + b"\n")
    resp = visor.recv()
    assert resp["id"] == 12345678901234567
    sentinel(visor)
    assert received(recorder_log)[0] == line + b"\n"


def test_crlf_is_accepted_and_the_cr_is_not_forwarded(visor: VisorProcess, recorder_log: Path) -> None:
    visor.send(PING + b"\r\n")
    assert visor.recv()["id"] == 1
    assert received(recorder_log) == [PING + b"\n"]


def test_whitespace_only_lines_are_dropped(visor: VisorProcess, recorder_log: Path) -> None:
    visor.send(b"\n   \n\t\n")
    sentinel(visor)
    assert len(received(recorder_log)) == 1


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b'{"jsonrpc":"2.0",\r"id":1,"method":"ping"}', -32700),
        (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}', -32700),
        (b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', -32700),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"', -32700),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}{}', -32700),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":1.0,"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":{},"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":[1],"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email","arguments":{}}}', None),
    ],
)
def test_rejected_with_null_id_or_dropped(
    visor: VisorProcess, recorder_log: Path, line: bytes, code: int | None
) -> None:
    visor.send(line + b"\n")
    if code is not None:
        resp = visor.recv()
        assert resp["id"] is None and resp["error"]["code"] == code
    sentinel(visor)
    assert len(received(recorder_log)) == 1  # the sentinel only


@pytest.mark.parametrize(
    ("line", "code", "msg_id"),
    [
        (b'{"jsonrpc":"1.0","id":7,"method":"ping"}', -32600, 7),
        (
            '{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"s":"a\u2028b"}}}'.encode(),
            -32600,
            9,
        ),
        (
            b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo","arguments":{"n":18446744073709551616}}}',
            -32600,
            10,
        ),
        (b'{"jsonrpc":"2.0","id":7,"method":5}', -32600, 7),
        (b'{"jsonrpc":"2.0","id":7,"method":"ping","params":[1]}', -32600, 7),
        (
            b'{"jsonrpc":"2.0","id":9223372036854775807,"method":"tools/call","params":{"name":5}}',
            -32602,
            9223372036854775807,
        ),
        (
            b'{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"echo","arguments":[1]}}',
            -32602,
            "s",
        ),
        (
            b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"to":"a","to":"b"}}}',
            -32600,
            8,
        ),
        (
            b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"to":"a","TO":"b"}}}',
            -32600,
            8,
        ),
    ],
)
def test_rejected_with_the_original_id(
    visor: VisorProcess, recorder_log: Path, line: bytes, code: int, msg_id: object
) -> None:
    visor.send(line + b"\n")
    raw = visor.recv_raw()
    resp = json.loads(raw)
    assert resp["id"] == msg_id and resp["error"]["code"] == code
    if isinstance(msg_id, int):
        # The id is echoed as the same integer text, even above 2**53.
        assert f'"id":{msg_id}'.encode() in raw
    sentinel(visor)
    assert len(received(recorder_log)) == 1


def test_batch_gets_an_error_per_member_and_nothing_is_forwarded(
    visor: VisorProcess, recorder_log: Path
) -> None:
    visor.send(
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}},{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","method":"x"}]\n'
    )
    got = {visor.recv()["id"], visor.recv()["id"]}
    assert got == {1, 2}
    sentinel(visor)
    assert len(received(recorder_log)) == 1


def test_response_to_no_server_request_is_dropped(visor: VisorProcess, recorder_log: Path) -> None:
    visor.send(b'{"jsonrpc":"2.0","id":"srv-9","result":{}}\n')
    sentinel(visor)
    assert len(received(recorder_log)) == 1


def test_cancel_for_a_request_the_server_never_saw_is_absorbed(
    visor: VisorProcess, recorder_log: Path
) -> None:
    visor.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":424242}}\n')
    sentinel(visor)
    assert len(received(recorder_log)) == 1


def test_duplicate_in_flight_id_is_refused(visor: VisorProcess, recorder_log: Path) -> None:
    visor.request(
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "ask_client", "arguments": {}}}
    )
    srv_req = visor.recv()
    assert srv_req["method"] == "elicitation/create"
    visor.request({"jsonrpc": "2.0", "id": 5, "method": "ping"})
    err = visor.recv()
    assert err["id"] == 5 and err["error"]["code"] == -32600
    visor.request({"jsonrpc": "2.0", "id": "srv-1", "result": {"action": "accept"}})
    done = visor.recv()
    assert done["id"] == 5 and "accept" in done["result"]["content"][0]["text"]


def test_oversize_line_is_refused_and_the_stream_continues(recorder_log: Path, tmp_path: Path) -> None:
    import sys

    from tests.conftest import RECORDER

    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(recorder_log)},
        visor_args=["--max-message-bytes", "1000"],
    )
    try:
        big = (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"x":"'
            + b"a" * 5000
            + b'"}}}\n'
        )
        vp.send(big[:700])
        vp.send(big[700:])
        resp = vp.recv()
        assert resp["id"] is None and resp["error"]["code"] == -32600
        sentinel(vp)
        assert len(received(recorder_log)) == 1
    finally:
        vp.kill()


def test_partial_line_at_client_eof_is_never_forwarded(visor: VisorProcess, recorder_log: Path) -> None:
    sentinel(visor)
    visor.send(b'{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"echo","arguments":{}}}')
    visor.close_stdin()
    assert visor.wait() == 0
    assert len(received(recorder_log)) == 1


# --- server to client ---------------------------------------------------------


def test_server_garbage_and_unsolicited_responses_never_reach_the_client(tmp_path: Path) -> None:
    import sys

    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys\n"
        "for line in sys.stdin:\n"
        "    sys.stdout.write('not json\\n')\n"
        '    sys.stdout.write(\'{"jsonrpc":"2.0","id":4242,"result":{}}\\n\')\n'
        '    sys.stdout.write(\'{"jsonrpc":"2.0","id":1,"id":2,"result":{}}\\n\')\n'
        '    sys.stdout.write(\'[{"jsonrpc":"2.0","method":"x"}]\\n\')\n'
        '    sys.stdout.write(\'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":1}}\\n\')\n'
        "    import json; m = json.loads(line)\n"
        "    sys.stdout.write(json.dumps({'jsonrpc':'2.0','id':m['id'],'result':{}}) + '\\n')\n"
        "    sys.stdout.flush()\n"
    )
    vp = VisorProcess([sys.executable, str(script)])
    try:
        vp.send(PING + b"\n")
        first = vp.recv()
        assert first == {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": 1}}
        assert vp.recv() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert vp.no_output()
    finally:
        vp.kill()
