"""The HTTP bench rows run end to end on a tiny workload: every call through `visor serve` is
allowed (an echo refused by the gateway raises), and the report states each target as met or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from visor.bench.http_rows import Work, render, run


def test_http_rows_run_and_report_the_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users_home = tmp_path / "the-users-visor-home"
    monkeypatch.setenv("VISOR_HOME", str(users_home))
    data = run(Work(sequential=20, pipelined=100, window=8, sessions=5, calls_per_session=3))
    # Every Visor the rows start keeps its files in the bench's scratch folder, not the user's home.
    assert not users_home.exists(), sorted(p.name for p in users_home.rglob("*"))
    direct, through, own, floor, core = data["rows"]
    assert direct["name"] == "direct HTTP" and through["name"] == "through visor serve --url"
    assert own["name"] == "through visor serve -- stdio" and floor["name"] == "raw TCP relay"
    assert core["name"] == "Visor's core, least glue"
    for row in (direct, through, own, floor, core):
        assert row["seq_p50_us"] > 0 and row["pipelined_calls_s"] > 0 and row["sessions_calls_s"] > 0
        assert row["sessions_cpu_us"]["client"] > 0
    # The CPU account reads the processes it names: every row but direct has a process in the
    # middle, and the gateway does more per call than the relay that copies bytes.
    assert direct["sessions_cpu_us"]["middle"] == 0
    for row in (through, own, floor, core):
        assert row["sessions_cpu_us"]["middle"] > 0
    least = data["core_floor"]
    assert least["added_p50_us"] == core["seq_p50_us"] - direct["seq_p50_us"]
    assert least["sessions_vs_stdio_pipelined"] == core["sessions_calls_s"] / data["stdio_pipelined_calls_s"]
    assert through["sessions_cpu_us"]["upstream"] > 0 and own["sessions_cpu_us"]["upstream"] > 0
    budget = data["sessions_cpu_budget"]
    assert budget["cores"] >= 1 and budget["gateway_used_us"] == through["sessions_cpu_us"]["middle"]
    assert data["stdio_pipelined_calls_s"] > 0 and data["fsync_us"] > 0
    runs = data["stdio_pipelined_runs_calls_s"]
    assert len(runs) == 3 and runs == sorted(runs) and data["stdio_pipelined_calls_s"] == runs[1]
    assert all(v > 0 for v in data["stdio_sessions_calls_s_by_workers"].values())
    text = render(data)
    targets = [line for line in text.splitlines() if line.startswith("target")]
    assert len(targets) == 2 and all(t.endswith((", met", ", NOT met")) for t in targets), targets
