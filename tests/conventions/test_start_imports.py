"""What `visor run`'s start leaves out since issue 16's second start-up pass.

- The client config paths Visor protects come from `visor.install.locations`:
  a session names them without the config reader, the JSONC parser and the
  HTTP target checks (`visor.install.configs` re-exports them for `visor init`
  and `visor doctor`).
- The no-op `Checks` and the verdicts live in `visor.core.passthrough`, which
  imports neither the policy package nor the audit writer, so that what runs
  without checks need not load them. `visor.core.checks` and
  `visor.core.guard` re-export the same objects: the core tells verdicts apart
  by their type, so a second copy of a class would be a verdict it cannot read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conventions.test_lazy_imports import _imported, _session_modules
from visor.core import checks, guard, passthrough
from visor.install import configs, locations

# What only reading or rewriting a client's config needs.
_CONFIG_READER = ("visor.install.configs", "visor.install.jsonc", "visor.http")


def test_a_session_names_the_client_configs_without_the_config_reader(tmp_path: Path) -> None:
    modules = _session_modules(tmp_path, ["--no-group", "--audit-log", str(tmp_path / "audit.jsonl")])
    assert "visor.install.locations" in modules  # the paths are still protected
    assert _imported(modules, _CONFIG_READER) == []


def test_the_config_module_still_names_the_same_locations(tmp_path: Path) -> None:
    assert configs.protected_config_paths is locations.protected_config_paths
    assert configs.known_locations is locations.known_locations
    assert configs.Location is locations.Location
    assert configs.home_dir is locations.home_dir
    home, cwd = tmp_path / "home", tmp_path / "project"
    paths = locations.protected_config_paths(home, cwd)
    assert (
        home / ".claude.json" in paths
        and cwd / ".mcp.json" in paths
        and home / ".codex" / "config.toml" in paths
    )


def test_checks_and_guard_re_export_the_passthrough_verdicts() -> None:
    assert checks.Checks is passthrough.Checks
    for name in ("Forward", "Answer", "AwaitCommit", "AwaitHuman", "LISTING_TIMEOUT_SECONDS"):
        assert getattr(checks, name) is getattr(passthrough, name), name
    for name in ("Refuse", "Rewrite"):
        assert getattr(guard, name) is getattr(passthrough, name), name
    assert issubclass(checks.PolicyChecks, passthrough.Checks)


def test_the_passthrough_checks_import_no_policy_and_no_audit_writer() -> None:
    probe = (
        "import sys, visor.core.passthrough; "
        "print('\\n'.join(m for m in sys.modules if m.startswith(('visor.policy', 'visor.audit', 'yaml'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == []
