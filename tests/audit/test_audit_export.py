"""`visor audit export`: JSON lines and OTLP/HTTP logs, resumed from a state file.

Logs are written by the real writer (rotation included), `visor audit export`
runs as a subprocess, and the OTLP side is a real HTTP receiver (stdlib
`http.server` in a thread) that records what it was sent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.audit.helpers import write_log
from visor.audit.paths import chain_files
from visor.audit.record import GENESIS, canonical_body, chain_hash, parse_line

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """An OTLP/HTTP endpoint: keeps every request; answers from `replies`, then 200 `{}`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    reply = receiver.replies.pop(0) if receiver.replies else (200, {}, b"{}")
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "status": reply[0],
                        }
                    )
                self.send_response(reply[0])
                for k, v in reply[1].items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply[2])))
                self.end_headers()
                self.wfile.write(reply[2])

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def accepted(self) -> list[dict[str, Any]]:
        """Every log record of every request answered 200, in order."""
        with self.lock:
            bodies = [json.loads(r["body"]) for r in self.requests if r["status"] == 200]
        return [
            rec
            for b in bodies
            for rl in b["resourceLogs"]
            for sl in rl["scopeLogs"]
            for rec in sl["logRecords"]
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def home() -> Path:
    return Path(os.environ["VISOR_HOME"])


def export(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "visor", "audit", "export", *argv],
        capture_output=True,
        timeout=120,
        env={**clean, **(env or {})},
        cwd=ROOT,
    )


def stored(log: Path) -> list[bytes]:
    """Every stored line of the chain, in chain order (rotated files first)."""
    return [line for f in chain_files(log) for line in f.read_bytes().splitlines(keepends=True)]


def attrs(record: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in record["attributes"]}


# ------------------------------------------------------------- JSON lines


def test_json_lines_resume_and_never_repeat(home: Path, tmp_path: Path) -> None:
    log = home / "audit" / "fs.jsonl"
    state = tmp_path / "state" / "export.json"
    write_log(log, 3)
    first = export("--state", str(state))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines(keepends=True) == stored(log)  # byte for byte, hash included
    assert export("--state", str(state)).stdout == b""  # nothing new
    write_log(log, 2, session="s2")
    second = export("--state", str(state))
    assert second.returncode == 0, second.stderr
    assert first.stdout + second.stdout == b"".join(stored(log))
    saved = json.loads(state.read_text())["logs"][str(log.resolve())]
    last = parse_line(stored(log)[-1][:-1])
    assert saved == {"seq": last.seq, "hash": last.hash}
    # Without --state everything goes out each time.
    assert export().stdout == b"".join(stored(log))


def test_resume_survives_rotation(home: Path, tmp_path: Path) -> None:
    log = home / "audit" / "rot.jsonl"
    state = tmp_path / "st.json"
    out = b""
    for session in range(4):
        write_log(log, 6, session=f"s{session}", max_bytes=1500)
        run = export(str(log), "--state", str(state))
        assert run.returncode == 0, run.stderr
        out += run.stdout
    assert len(chain_files(log)) > 3
    assert out == b"".join(stored(log))
    hashes = [parse_line(x).hash for x in out.splitlines()]
    assert len(hashes) == len(set(hashes))


def rechain(lines: list[bytes], edit: int) -> bytes:
    recs = [parse_line(x.rstrip(b"\n")).record for x in lines]
    recs[edit]["tool"] = "rewritten"
    out, prev = [], GENESIS
    for r in recs:
        fields = {k: v for k, v in r.items() if k != "hash"}
        fields["prev"] = prev
        body = canonical_body(fields)
        prev = chain_hash(prev, body)
        out.append(b'{"hash":"' + prev.encode() + b'",' + body[1:] + b"\n")
    return b"".join(out)


def test_a_log_rewritten_since_the_last_export_stops_it(home: Path, tmp_path: Path) -> None:
    log = home / "audit" / "fs.jsonl"
    state = tmp_path / "st.json"
    write_log(log, 4)
    assert export("--state", str(state)).returncode == 0
    before = state.read_bytes()
    log.write_bytes(rechain(stored(log), 2))
    write_log(log, 1, session="s2")
    run = export("--state", str(state))
    assert run.returncode == 1 and run.stdout == b""
    assert b"is not the record exported last" in run.stderr and b"rewritten or replaced" in run.stderr
    assert state.read_bytes() == before


def test_a_log_cut_below_the_position_stops_it(home: Path, tmp_path: Path) -> None:
    log = home / "audit" / "fs.jsonl"
    state = tmp_path / "st.json"
    write_log(log, 4)
    assert export("--state", str(state)).returncode == 0
    log.write_bytes(b"".join(stored(log)[:2]))
    run = export("--state", str(state))
    assert run.returncode == 1 and run.stdout == b""
    assert b"the log ends at seq 1, before the last record exported (seq 4): it was cut" in run.stderr


def test_rotated_files_deleted_before_export_are_a_gap_not_a_skip(home: Path, tmp_path: Path) -> None:
    log = home / "audit" / "gap.jsonl"
    state = tmp_path / "st.json"
    write_log(log, 2, max_bytes=1500)
    assert export("--state", str(state)).returncode == 0
    write_log(log, 20, session="s2", max_bytes=1500)
    rotated = [f for f in chain_files(log) if f != log]
    rotated[0].unlink()
    rotated[1].unlink()
    run = export("--state", str(state))
    assert run.returncode == 1
    assert b"records between them are gone" in run.stderr


def test_a_second_exporter_on_the_same_state_is_refused(home: Path, tmp_path: Path) -> None:
    write_log(home / "audit" / "fs.jsonl", 1)
    state = tmp_path / "st.json"
    follower = subprocess.Popen(
        [sys.executable, "-m", "visor", "audit", "export", "--state", str(state), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert follower.stdout is not None
        follower.stdout.readline()  # the first record: it holds the state now
        run = export("--state", str(state))
        assert run.returncode == 2
        assert b"another `visor audit export` is using this state file" in run.stderr
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait(30)
    assert follower.returncode == 0


# ------------------------------------------------------------------- OTLP


def test_otlp_records_attributes_and_resumption(home: Path, tmp_path: Path, receiver: Receiver) -> None:
    log = home / "audit" / "mail.jsonl"
    state = tmp_path / "otlp.json"
    write_log(log, 3)
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=abc%20def,tenant=t1", "OTEL_SERVICE_NAME": "visor-laptop"}
    run = export("--otlp", receiver.url, "--state", str(state), env=env)
    assert run.returncode == 0, run.stderr
    assert b"exported 4 record(s)" in run.stderr
    assert run.stdout == b""
    req = receiver.requests[0]
    assert req["path"] == "/v1/logs"
    assert req["headers"]["content-type"] == "application/json"
    assert req["headers"]["x-api-key"] == "abc def" and req["headers"]["tenant"] == "t1"
    body = json.loads(req["body"])
    resource = {
        a["key"]: a["value"]["stringValue"] for a in body["resourceLogs"][0]["resource"]["attributes"]
    }
    assert resource["service.name"] == "visor-laptop"
    assert body["resourceLogs"][0]["scopeLogs"][0]["scope"]["name"] == "visor.audit"

    got = receiver.accepted()
    lines = stored(log)
    assert [r["body"]["stringValue"].encode() + b"\n" for r in got] == lines  # the stored lines, exactly
    for rec, line in zip(got, lines, strict=True):
        parsed = parse_line(line[:-1])
        a = attrs(rec)
        assert a["visor.log"] == "mail.jsonl"
        assert a["visor.event"] == parsed.event and a["event.name"] == f"visor.audit.{parsed.event}"
        assert a["visor.seq"] == str(parsed.seq)  # OTLP/JSON writes int64 as a string
        assert a["visor.hash"] == parsed.hash and a["visor.prev"] == parsed.prev
        assert a["visor.session"] == "s1"
        when = datetime.fromisoformat(parsed.record["ts"].replace("Z", "+00:00"))
        assert int(rec["timeUnixNano"]) // 1000 == int(when.timestamp()) * 1_000_000 + when.microsecond
    allow_attrs = attrs(got[1])
    assert allow_attrs["visor.tool"] == "write_file" and allow_attrs["visor.rule"] == "fs.write_file"
    assert got[1]["severityText"] == "INFO" and got[1]["severityNumber"] == 9

    # New records only, on the next run.
    write_log(log, 1, session="s2")
    again = export("--otlp", receiver.url, "--state", str(state))
    assert again.returncode == 0, again.stderr
    got = receiver.accepted()
    assert [r["body"]["stringValue"].encode() + b"\n" for r in got] == stored(log)
    assert len(receiver.requests) == 2


def test_otlp_endpoint_from_the_environment(home: Path, receiver: Receiver) -> None:
    write_log(home / "audit" / "a.jsonl", 1)
    run = export("--otlp", env={"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": receiver.url + "/custom/logs"})
    assert run.returncode == 0, run.stderr
    assert receiver.requests[0]["path"] == "/custom/logs"
    run = export("--otlp", env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url + "/base"})
    assert run.returncode == 0, run.stderr
    assert receiver.requests[1]["path"] == "/base/v1/logs"


def test_a_deny_is_a_warning(home: Path, receiver: Receiver) -> None:
    from visor.audit.writer import AuditWriter

    w = AuditWriter.open(home / "audit" / "d.jsonl", session="s")
    w.append({"event": "deny", "server": "mail", "tool": "send_email", "rule": "r", "reason": "no"})
    w.close_sync()
    assert export("--otlp", receiver.url).returncode == 0
    deny = receiver.accepted()[-1]
    assert attrs(deny)["visor.event"] == "deny"
    assert deny["severityText"] == "WARN" and deny["severityNumber"] == 13


def test_otlp_retries_a_busy_collector(home: Path, tmp_path: Path, receiver: Receiver) -> None:
    log = home / "audit" / "a.jsonl"
    write_log(log, 2)
    receiver.replies = [(503, {"Retry-After": "0"}, b"busy"), (429, {"Retry-After": "0"}, b"slow")]
    run = export("--otlp", receiver.url, "--state", str(tmp_path / "st.json"))
    assert run.returncode == 0, run.stderr
    assert [r["status"] for r in receiver.requests] == [503, 429, 200]
    assert len(receiver.accepted()) == len(stored(log))


def test_a_refused_batch_is_not_counted_as_exported(home: Path, tmp_path: Path, receiver: Receiver) -> None:
    log = home / "audit" / "a.jsonl"
    state = tmp_path / "st.json"
    write_log(log, 2)
    receiver.replies = [(400, {}, b'{"message":"bad"}')]
    run = export("--otlp", receiver.url, "--state", str(state))
    assert run.returncode == 1
    assert b"the collector answered HTTP 400" in run.stderr
    assert not state.exists()
    receiver.replies = [(200, {}, b'{"partialSuccess":{"rejectedLogRecords":"2","errorMessage":"too old"}}')]
    run = export("--otlp", receiver.url, "--state", str(state))
    assert run.returncode == 1 and b"rejected 2 of 3 record(s): too old" in run.stderr
    assert not state.exists()
    run = export("--otlp", receiver.url, "--state", str(state))
    assert run.returncode == 0
    assert [r["body"]["stringValue"].encode() + b"\n" for r in receiver.accepted()[-3:]] == stored(log)


def test_otlp_configuration_errors_are_clear(home: Path) -> None:
    write_log(home / "audit" / "a.jsonl", 1)
    run = export("--otlp")
    assert run.returncode == 2 and b"--otlp needs a URL, or OTEL_EXPORTER_OTLP_ENDPOINT" in run.stderr
    run = export("--otlp", "ftp://x")
    assert run.returncode == 2 and b"is not an http:// or https:// URL" in run.stderr
    run = export("--otlp", "http://127.0.0.1:9", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert run.returncode == 2 and b"http/json only" in run.stderr


def test_follow_sends_new_records_across_rotation(home: Path, tmp_path: Path, receiver: Receiver) -> None:
    log = home / "audit" / "live.jsonl"
    state = tmp_path / "st.json"
    write_log(log, 2, max_bytes=1500)
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "visor",
            "audit",
            "export",
            "--otlp",
            receiver.url,
            "--state",
            str(state),
            "--follow",
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        cwd=ROOT,
    )

    def wait_for_all() -> None:
        deadline = time.monotonic() + 60
        while len(receiver.accepted()) < len(stored(log)):
            assert follower.poll() is None, follower.stderr.read() if follower.stderr else ""
            assert time.monotonic() < deadline, "the follower did not send every record"
            time.sleep(0.05)

    try:
        wait_for_all()
        for session in range(3):
            write_log(log, 8, session=f"f{session}", max_bytes=1500)
            wait_for_all()
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait(30)
    assert follower.returncode == 0
    assert len(chain_files(log)) > 2
    got = [r["body"]["stringValue"].encode() + b"\n" for r in receiver.accepted()]
    assert got == stored(log)  # each record once, in chain order, across rotated files
    last = parse_line(stored(log)[-1][:-1])
    assert json.loads(state.read_text())["logs"][str(log.resolve())] == {"seq": last.seq, "hash": last.hash}


def test_a_follow_seeks_to_where_it_left_off_and_falls_back_to_reading(home: Path) -> None:
    from dataclasses import replace

    from visor.audit.export import Cursor, CursorError, new_records

    log = home / "audit" / "seek.jsonl"
    write_log(log, 3)
    first = list(new_records(log, None))
    last = first[-1]
    assert last.place.offset == log.stat().st_size
    write_log(log, 2, session="s2")
    cursor = Cursor(last.seq, last.hash)
    new = stored(log)[len(first) :]
    assert [i.line + b"\n" for i in new_records(log, cursor)] == new  # read from the start
    # Damage before the place, in the same file (inode): a follow that seeks never reads it again...
    with open(log, "r+b") as fh:
        fh.seek(20)
        old = fh.read(1)
        fh.seek(20)  # the read moved past it: write over that very byte, never a copy of its neighbour
        fh.write(b"0" if old != b"0" else b"1")
    assert [i.line + b"\n" for i in new_records(log, cursor, last.place)] == new
    # ...while a place in another file (a log replaced under the same name), or one that is not
    # the cursor's record, is not trusted: the file is read from the start, and the damage found.
    for untrusted in (replace(last.place, ino=last.place.ino + 1), replace(last.place, seq=last.seq - 1)):
        with pytest.raises(CursorError, match=r"seek.jsonl:1: hash does not match"):
            list(new_records(log, cursor, untrusted))
