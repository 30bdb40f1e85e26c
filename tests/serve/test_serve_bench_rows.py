"""The HTTP bench rows run end to end on a tiny workload: every call through `visor serve` is
allowed (an echo refused by the gateway raises), and the report states each target as met or not."""

from __future__ import annotations

from visor.bench.http_rows import Work, render, run


def test_http_rows_run_and_report_the_targets() -> None:
    data = run(Work(sequential=20, pipelined=100, window=8, sessions=5, calls_per_session=3))
    direct, through, own = data["rows"]
    assert direct["name"] == "direct HTTP" and through["name"] == "through visor serve --url"
    assert own["name"] == "through visor serve -- stdio"
    for row in (direct, through, own):
        assert row["seq_p50_us"] > 0 and row["pipelined_calls_s"] > 0 and row["sessions_calls_s"] > 0
    assert data["stdio_pipelined_calls_s"] > 0 and data["fsync_us"] > 0
    assert all(v > 0 for v in data["stdio_sessions_calls_s_by_workers"].values())
    text = render(data)
    targets = [line for line in text.splitlines() if line.startswith("target")]
    assert len(targets) == 2 and all(t.endswith((", met", ", NOT met")) for t in targets), targets
