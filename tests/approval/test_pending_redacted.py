"""A secret in a call's arguments never reaches the approval directory: the pending file (and so
`visor approve --show`) shows it redacted, as the audit log does, while an answer is still bound
to the real call."""

from __future__ import annotations

from pathlib import Path

from tests.approval import helpers as ap

SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def test_the_pending_file_holds_no_secret_and_a_yes_still_binds(tmp_path: Path) -> None:
    approvals = tmp_path / "approvals"
    vp, log, audit = ap.start(tmp_path, echo_approval=True, approval_dir=approvals)
    try:
        ap.call(vp, 7, "echo", {"text": f"token={SECRET}"})
        (approval_id, pending), *_ = ap.wait_pending(approvals).items()
        files = b"".join(p.read_bytes() for p in approvals.iterdir() if p.is_file())
        assert SECRET.encode() not in files
        assert "REDACTED" in str(pending["arguments"]), pending["arguments"]
        shown = ap.cli("approve", "--show", approval_id, "--approval-dir", str(approvals))
        assert SECRET not in shown.stdout + shown.stderr
        answered = ap.cli("approve", approval_id, "--approval-dir", str(approvals))
        assert answered.returncode == 0, answered.stderr
        assert not ap.recv_id(vp, 7)["result"].get("isError")
    finally:
        vp.close_stdin()
        vp.wait()
    assert SECRET.encode() not in log.read_bytes()  # the server got the redacted call
    assert SECRET.encode() not in audit.read_bytes()
    assert [e for e in ap.events_for(audit, 7) if e != "redact"] == ["ask", "approve", "allow"]
