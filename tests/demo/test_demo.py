"""`visor demo` end to end: it must pass its own proof, and its claims must hold on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_its_proof_holds(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "demo", "--keep", str(keep)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "\033[" not in out  # not a terminal: no colour codes
    assert "provenance.untrusted_output" in out
    assert "budget.max_calls" in out
    assert "pin.new_tool" in out
    assert "APPROVE" in out and "the approved mail reached carol@partner.example" in out
    assert "the cloud key was redacted before it reached the server" in out
    # Check the state ourselves rather than trusting the demo's own words.
    ws = keep / "workspace"
    mails = [p.read_text() for p in (ws / "outbox").glob("*.eml")]
    assert mails and not any("exfil-collector.example" in m for m in mails)
    assert any(m.startswith("To: carol@partner.example") for m in mails)
    assert "AKIA" not in (ws / "notes" / "summary.md").read_text()
    assert (ws / "records" / "r-2.json").exists() and not (ws / "records" / "r-1.json").exists()
    records = [json.loads(line) for line in (keep / "audit" / "audit.jsonl").read_bytes().splitlines()]
    denied_tools = {r["tool"] for r in records if r["event"] == "deny"}
    events = [
        r["event"]
        for r in records
        if r.get("tool") == "send_email" and r["event"] in ("ask", "approve", "allow")
    ]
    # The new contact: asked, approved, then the durable allow; then the owner's mail.
    assert events == ["ask", "approve", "allow", "allow"]
    assert {"send_email", "read_file", "delete_record", "export_all_records", "run_command"} <= denied_tools
    pack = (keep / "review-pack.md").read_text()
    assert "helpdesk" in pack
    # The review pack never prints argument values.
    assert "exfil-collector" not in pack and "customer list" not in pack


def test_demo_refuses_a_non_empty_keep_dir(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "demo", "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not empty" in proc.stderr
