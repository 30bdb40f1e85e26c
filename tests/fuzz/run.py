"""`make fuzz`: run each fuzz target in its own process for FUZZ_SECONDS.

Each target runs under atheris (libFuzzer) with the seed corpus in
tests/fuzz/corpus/<target>/, a working corpus and crash artifacts in
tests/fuzz/artifacts/ (gitignored), and -max_total_time, -rss_limit_mb and
-timeout. The exit status is non-zero on any crash, hang, out-of-memory or
invariant violation. Known open issues (each an xfail regression test) do not
stop the search; they are listed and also make the exit status non-zero unless
FUZZ_ALLOW_KNOWN=1.

Without atheris, a hypothesis-driven fallback runs the same invariants on
generated and mutated inputs (not coverage-guided) and says so.

Environment: FUZZ_SECONDS (default 60), FUZZ_RSS_MB (2048), FUZZ_TIMEOUT
(seconds per input, 10), FUZZ_TARGETS (comma list, default every target),
FUZZ_STRICT=1 (known issues crash), FUZZ_ALLOW_KNOWN=1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARTIFACTS = HERE / "artifacts"
TARGETS = {
    # name: (module, -max_len)
    "wire": ("tests.fuzz.fuzz_wire", 16384),
    "policy": ("tests.fuzz.fuzz_policy", 4096),
    "paths": ("tests.fuzz.fuzz_paths", 64),
    "shell": ("tests.fuzz.fuzz_shell", 2048),
    "urls": ("tests.fuzz.fuzz_urls", 2048),
    "addresses": ("tests.fuzz.fuzz_addresses", 512),
    "sse": ("tests.fuzz.fuzz_sse", 16384),
    "sessionless": ("tests.fuzz.fuzz_sessionless", 4096),
}

_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+).*?exec/s: (\d+)", re.M)
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_atheris(name: str, seconds: int) -> dict:
    module, max_len = TARGETS[name]
    work = ARTIFACTS / f"corpus-{name}"
    crashes = ARTIFACTS / f"crashes-{name}"
    known = ARTIFACTS / f"known-{name}"
    for d in (work, crashes, known):
        d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(known)
    known.mkdir()
    before = set(crashes.iterdir())
    cmd = [
        sys.executable,
        "-m",
        module,
        str(work),
        str(HERE / "corpus" / name),
        f"-max_total_time={seconds}",
        f"-rss_limit_mb={os.environ.get('FUZZ_RSS_MB', '2048')}",
        f"-timeout={os.environ.get('FUZZ_TIMEOUT', '10')}",
        f"-max_len={max_len}",
        f"-artifact_prefix={crashes}/",
        f"-dict={HERE / 'dicts' / (name + '.dict')}",
        "-print_final_stats=1",
    ]
    env = dict(os.environ, FUZZ_KNOWN_DIR=str(known), PYTHONPATH=str(ROOT))
    log = ARTIFACTS / f"{name}.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    stats = {k: int(v) for k, v in _STAT.findall(text)}
    status = _STATUS.findall(text)
    last = status[-1] if status else None
    new = sorted(set(crashes.iterdir()) - before)
    return {
        "target": name,
        "engine": "atheris",
        "rc": proc.returncode,
        "seconds": elapsed,
        "execs": stats.get("number_of_executed_units", int(last[0]) if last else 0),
        "execs_per_s": stats.get("average_exec_per_sec", int(last[3]) if last else 0),
        "cov": int(last[1]) if last else None,
        "ft": int(last[2]) if last else None,
        "rss_mb": stats.get("peak_rss_mb"),
        "corpus": len(list(work.iterdir())),
        "crashes": [str(p.relative_to(ROOT)) for p in new],
        "known": sorted(p.name for p in known.iterdir()),
        "log": str(log.relative_to(ROOT)),
    }


def run_fallback(name: str, seconds: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    known = ARTIFACTS / f"known-{name}"
    shutil.rmtree(known, ignore_errors=True)
    known.mkdir(parents=True)
    env["FUZZ_KNOWN_DIR"] = str(known)
    log = ARTIFACTS / f"{name}.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.fuzz.fallback", name, str(seconds)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=seconds * 3 + 60,
        )
    text = log.read_text(errors="replace")
    m = re.search(r"execs: (\d+)", text)
    execs = int(m.group(1)) if m else 0
    elapsed = time.monotonic() - started
    return {
        "target": name,
        "engine": "hypothesis fallback (not coverage-guided)",
        "rc": proc.returncode,
        "seconds": elapsed,
        "execs": execs,
        "execs_per_s": int(execs / max(elapsed, 1e-9)),
        "cov": None,
        "ft": None,
        "rss_mb": None,
        "corpus": None,
        "crashes": [str(log.relative_to(ROOT))] if proc.returncode else [],
        "known": sorted(p.name for p in known.iterdir()),
        "log": str(log.relative_to(ROOT)),
    }


def main() -> int:
    seconds = int(os.environ.get("FUZZ_SECONDS", "60"))
    names = [n.strip() for n in os.environ.get("FUZZ_TARGETS", ",".join(TARGETS)).split(",") if n.strip()]
    ARTIFACTS.mkdir(exist_ok=True)
    atheris_ok = _have_atheris()
    if not atheris_ok:
        print("atheris is not installed: using the hypothesis fallback driver (not coverage-guided)")
    results = []
    for name in names:
        print(f"fuzzing {name} for {seconds}s ...", flush=True)
        results.append(run_atheris(name, seconds) if atheris_ok else run_fallback(name, seconds))
    print()
    print(
        f"{'target':8} {'engine':8} {'time':>6} {'execs':>10} {'exec/s':>7} {'cov':>6} {'ft':>6} {'corpus':>6}  result"
    )
    failed = False
    allow_known = os.environ.get("FUZZ_ALLOW_KNOWN") == "1"
    for r in results:
        bad = r["rc"] != 0 or r["crashes"]
        verdict = "CRASH" if bad else ("known issues" if r["known"] else "ok")
        print(
            f"{r['target']:8} {r['engine'][:8]:8} {r['seconds']:5.0f}s {r['execs']:>10} {r['execs_per_s']:>7} "
            f"{r['cov'] if r['cov'] is not None else '-':>6} {r['ft'] if r['ft'] is not None else '-':>6} "
            f"{r['corpus'] if r['corpus'] is not None else '-':>6}  {verdict}"
        )
        for c in r["crashes"]:
            print(f"  crash: {c}  (reproduce: python -m {TARGETS[r['target']][0]} {c})")
        if bad and not r["crashes"]:
            print(f"  exit status {r['rc']}; see {r['log']}")
        for k in r["known"]:
            print(f"  known open issue hit: {k}  (example in tests/fuzz/artifacts/known-{r['target']}/{k})")
        failed |= bool(bad) or (bool(r["known"]) and not allow_known)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
