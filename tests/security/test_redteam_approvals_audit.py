"""Red-team findings on approvals and the audit evidence, each through a real `visor run`.

Every test here drives the real CLI (`visor run`, `visor approve`, `visor audit verify`)
over real pipes and files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.approval.helpers import (
    call,
    cli,
    events_for,
    records,
    recv_id,
    start,
    wait_gone,
    wait_pending,
)


def _approvals(tmp_path: Path) -> Path:
    adir = tmp_path / "approvals"
    adir.mkdir(mode=0o700)
    return adir


def _received(log: Path) -> list[bytes]:
    return log.read_bytes().splitlines() if log.exists() else []


def test_a_short_id_prefix_cannot_approve_a_call_the_human_never_saw(tmp_path: Path) -> None:
    """`visor approve PREFIX` resolves the prefix among the requests pending *when it runs*.

    The human lists the requests and sees A (harmless). The client cancels A and sends B
    (harmful) until B's random id starts like A's. The human types the prefix they saw
    for A: with a one- or two-digit prefix, that is B's, and B is relayed though no one
    ever saw it. A prefix must be long enough that a request created after the human
    looked cannot take it (and collisions are then refused as ambiguous).
    """
    adir = _approvals(tmp_path)
    vp, log, audit = start(tmp_path, approval_dir=adir, echo_approval=True)
    try:
        call(vp, "a", "echo", {"text": "harmless"})
        ((seen, _),) = wait_pending(adir).items()
        vp.request({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}})
        wait_gone(adir / f"{seen}.pending")
        # Cycle harmful requests until one's id starts with the digit the human saw.
        harmful = None
        for n in range(400):
            call(vp, n, "echo", {"text": "HARMFUL"})
            ((pid, _),) = wait_pending(adir).items()
            if pid[0] == seen[0]:
                harmful = n
                break
            vp.request({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": n}})
            wait_gone(adir / f"{pid}.pending")
        assert harmful is not None
        done = cli("approve", "--approval-dir", str(adir), seen[0])
        assert done.returncode != 0, done.stdout
        assert "too short" in done.stderr
        # The full id of what the human saw names nothing pending; B is still waiting.
        assert cli("approve", "--approval-dir", str(adir), seen).returncode == 1
        assert cli("deny", "--approval-dir", str(adir), pid).returncode == 0
        resp = recv_id(vp, harmful)
        assert "declined" in resp["result"]["content"][0]["text"]
    finally:
        vp.kill()
    assert not any(b"HARMFUL" in line for line in _received(log))
    assert events_for(audit, harmful) == ["ask", "decline", "deny"]
    assert not any(r["event"] == "allow" and r.get("id") == harmful for r in records(audit))


def test_the_run_registry_visor_approve_reads_is_protected_from_tool_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `visor approve` without --approval-dir lists the directories named in $VISOR_HOME/run: an
    # entry a tool wrote would list a directory of the tool's own, or drop the real one.
    import argparse

    from visor.run import _protected_paths

    monkeypatch.setenv("VISOR_HOME", str(tmp_path / "home"))
    names = argparse.Namespace(approval_dir=None, pin_file=None, policy=None, signing_key=None)
    prot = _protected_paths(names, tmp_path / "audit" / "a.jsonl", [])
    run = tmp_path / "home" / "run"
    assert prot.named_by({"path": str(run / "12345.json")})
    assert prot.named_by({"path": str(run)})
    assert prot.named_by({"command": f"echo '{{}}' > {run}/1.json"})
