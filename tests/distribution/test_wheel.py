"""The wheel carries everything Visor needs: built here, installed in a fresh venv, run from there.

No network: the wheel is built with this venv's setuptools (no build
isolation) and installed with --no-deps; the fresh venv reaches the
dependencies through a path file that adds this venv's site-packages (its own
.pth files, the editable install of the checkout among them, are not run), and
every command runs outside the checkout, so only the installed wheel can
answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _run(cmd: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kw.pop("env", {}))  # type: ignore[arg-type]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


def _source_copy(dest: Path) -> Path:
    """What the build reads, copied out of the checkout: an in-tree setuptools build writes
    `build/` and `*.egg-info` beside its sources, and the checkout may be read-only (or shared)."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "visor", dest / "visor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    )
    return dest


def test_the_built_wheel_runs_the_demo_and_the_bench(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    source = tmp_path / "source"
    source.mkdir()
    _source_copy(source)
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
        ],
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = dist.glob("*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh_site = Path(
        _run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=tmp_path,
        ).stdout.strip()
    )
    (fresh_site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]

    py = str(venv / "bin" / "python")
    where = _run([py, "-c", "import visor, sys; print(visor.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(fresh_site)), where.stdout + where.stderr

    home = tmp_path / "home"
    env = {"HOME": str(home), "VISOR_HOME": str(home / ".visor")}
    visor = str(venv / "bin" / "visor")
    demo = _run([visor, "demo"], cwd=tmp_path, env=env)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "audit" in demo.stdout.lower()

    bench = _run([visor, "bench", "--quick", "--output", str(tmp_path / "bench.json")], cwd=tmp_path, env=env)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    assert (tmp_path / "bench.json").stat().st_size > 0
    assert "30 rules" in bench.stdout
