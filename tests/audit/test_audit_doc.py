"""docs/audit-format.md is normative: its example and its verifier are checked here."""

import re
import subprocess
import sys
from pathlib import Path

from visor.audit import record as rec
from visor.audit.paths import chain_files

from .helpers import lines, write_log

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit-format.md"


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def verifier_script(tmp_path: Path) -> Path:
    text = doc_text().split("<!-- standalone-verifier -->", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 25
    script = tmp_path / "verify_audit.py"
    script.write_text(code, encoding="utf-8")
    return script


def run(script: Path, files: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(script), *map(str, files)], capture_output=True, text=True
    )


def test_worked_example_matches_the_code():
    section = doc_text().split("<!-- worked-example -->", 1)[1]
    stored, body, second = (b.encode() for b in re.findall(r"```text\n(.*?)\n```", section, re.S)[:3])
    first = rec.build(
        {
            "event": "allow",
            "server": "fs",
            "tool": "write_file",
            "id": 7,
            "args": {"path": "/work/notes/été.txt", "content": "[REDACTED]"},
            "rule": "fs.write_file",
            "reason": "path under an allowed prefix",
            "policy": "4f1c" * 16,
        },
        session="3f2a9c1e0b7d4e65a1c2d3e4f5a6b7c8",
        seq=0,
        prev=rec.GENESIS,
        ts="2026-05-04T09:30:00.123456Z",
    )
    assert first.line == stored + b"\n"
    assert rec.chain_hash(rec.GENESIS, body) == first.record["hash"]
    assert first.record["hash"] in doc_text().split("sha256sum", 1)[1]
    nxt = rec.build(
        {
            "event": "result",
            "server": "fs",
            "tool": "write_file",
            "id": 7,
            "ref": 0,
            "ok": True,
            "bytes": 52,
            "duration_us": 1830,
        },
        session="3f2a9c1e0b7d4e65a1c2d3e4f5a6b7c8",
        seq=1,
        prev=first.record["hash"],
        ts="2026-05-04T09:30:00.125301Z",
    )
    assert nxt.line == second + b"\n"


def test_standalone_verifier_accepts_visor_log_and_rejects_tampering(tmp_path):
    script = verifier_script(tmp_path)
    log = tmp_path / "audit.jsonl"
    write_log(log, 40, max_bytes=4096)
    files = chain_files(log)
    assert len(files) > 2
    ok = run(script, files)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK ") and lines(log)[-1][9:73].decode() in ok.stdout

    data = lines(log)
    data[1] = data[1].replace(b'"id":', b'"id":1', 1)
    log.write_bytes(b"".join(data))
    bad = run(script, files)
    assert bad.returncode == 1 and "edited" in bad.stderr and f"{log}:2:" in bad.stderr

    del data[1]
    log.write_bytes(b"".join(data))
    bad = run(script, files)
    assert bad.returncode == 1 and "broken link" in bad.stderr

    bad = run(script, files[1:])  # the oldest file is missing
    assert bad.returncode == 1
