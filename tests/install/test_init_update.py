"""`visor init` run again changes what it wrapped: options, pins, approvals, PATH, backups."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.install.helpers import VISOR_EXE, visor
from visor.install.init import backup_prefix

CONFIG = '{\n  "mcpServers": {\n    "time": {\n      "command": "uvx",\n      "args": ["mcp-server-time"],\n      "env": {"TZ": "UTC"}\n    }\n  }\n}\n'
POLICY = 'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "time"\n    allowed: true\n    tools:\n      - name: "get_current_time"\n        allowed: true\n'


def _entry(path: Path) -> dict:
    return json.loads(path.read_text())["mcpServers"]["time"]


def _opts(entry: dict) -> list[str]:
    args = entry["args"]
    return args[: args.index("--")]


def _backups(path: Path) -> list[Path]:
    return sorted((Path(os.environ["VISOR_HOME"]) / "backups").glob(backup_prefix(path) + "*"))


def test_rerun_with_policy_approval_dir_and_absolute_updates_the_wrapped_entry(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CONFIG)
    original = path.read_bytes()
    home = Path(os.environ["VISOR_HOME"])
    first = visor("init", "--config", str(path), "--yes")
    assert first.returncode == 0, first.stderr
    pin = str((home / "pins" / "time.json").absolute())
    assert _opts(_entry(path)) == ["run", "--server-name", "time", "--pin-file", pin]
    assert _entry(path)["env"] == {"TZ": "UTC"}

    policy = tmp_path / "time.yaml"
    policy.write_text(POLICY)
    adir = tmp_path / "answers"
    second = visor(
        "init", "--config", str(path), "--yes", "--policy", str(policy), "--approval-dir", str(adir)
    )
    assert second.returncode == 0, second.stderr
    assert "--policy" in second.stdout and "+++ " in second.stdout  # the diff was shown
    opts = _opts(_entry(path))
    assert opts[opts.index("--policy") + 1] == str(policy)
    assert opts[opts.index("--approval-dir") + 1] == str(adir)
    assert opts[opts.index("--pin-file") + 1] == pin  # kept
    assert _entry(path)["args"][-3:] == ["--", "uvx", "mcp-server-time"]

    # --absolute alone changes only the command; the policy stays
    third = visor("init", "--config", str(path), "--yes", "--absolute")
    assert third.returncode == 0, third.stderr
    assert _entry(path)["command"] == str(VISOR_EXE)
    assert "--policy" in _opts(_entry(path))

    idle = visor("init", "--config", str(path), "--yes", "--absolute")
    assert "nothing to change" in idle.stdout
    assert len(_backups(path)) == 3  # one per write, in $VISOR_HOME/backups/
    assert not list(tmp_path.glob("*.visor-backup-*"))

    undo = visor("init", "--config", str(path), "--yes", "--undo")
    assert undo.returncode == 0, undo.stderr
    assert path.read_bytes() == original


def test_rerun_without_options_leaves_wrapped_entries_alone(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CONFIG)
    policy = tmp_path / "time.yaml"
    policy.write_text(POLICY)
    assert visor("init", "--config", str(path), "--yes", "--policy", str(policy)).returncode == 0
    wrapped = path.read_bytes()
    again = visor("init", "--config", str(path), "--yes")
    assert "already wrapped" in again.stdout and "nothing to change" in again.stdout
    assert path.read_bytes() == wrapped  # the policy was not dropped


def test_hand_edited_options_are_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CONFIG)
    assert visor("init", "--config", str(path), "--yes").returncode == 0
    data = json.loads(path.read_text())
    data["mcpServers"]["time"]["args"].insert(1, "--audit-max-bytes=1000000")
    path.write_text(json.dumps(data, indent=2))
    before = path.read_bytes()
    policy = tmp_path / "time.yaml"
    policy.write_text(POLICY)
    out = visor("init", "--config", str(path), "--yes", "--policy", str(policy))
    assert "options `visor init` does not write (--audit-max-bytes=1000000)" in out.stdout
    assert path.read_bytes() == before


def test_no_pin_file_and_refusal_when_visor_is_not_on_path(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CONFIG)
    refused = visor("init", "--config", str(path), "--yes", env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 1
    assert "`visor` is not on your PATH" in refused.stderr and "--absolute" in refused.stderr
    assert path.read_text() == CONFIG
    ok = visor(
        "init", "--config", str(path), "--yes", "--absolute", "--no-pin-file", env={"PATH": "/usr/bin:/bin"}
    )
    assert ok.returncode == 0, ok.stderr
    assert _entry(path)["command"] == str(VISOR_EXE)
    assert "--pin-file" not in _entry(path)["args"]


def test_init_writes_a_signing_key_that_loads_and_keeps_it_on_a_rerun(tmp_path: Path) -> None:
    path = tmp_path / ".mcp.json"
    path.write_text(CONFIG)
    keys = tmp_path / "keys"
    made = visor("audit", "keygen", "--out", str(keys))
    assert made.returncode == 0, made.stderr
    key = keys / "audit-signing.key"
    # A key the wrapped servers could not load is refused, and nothing is written.
    loose = tmp_path / "loose.key"
    loose.write_bytes(key.read_bytes())
    loose.chmod(0o644)
    refused = visor("init", "--config", str(path), "--yes", "--signing-key", str(loose))
    assert refused.returncode == 1
    assert "signing key does not load" in refused.stderr and "chmod 600" in refused.stderr
    assert path.read_text() == CONFIG
    public = visor("init", "--config", str(path), "--yes", "--signing-key", str(keys / "audit-signing.pub"))
    assert public.returncode == 1 and "public key" in public.stderr

    first = visor("init", "--config", str(path), "--yes", "--signing-key", str(key))
    assert first.returncode == 0, first.stderr
    opts = _opts(_entry(path))
    assert opts[opts.index("--signing-key") + 1] == str(key)
    # A later run that changes something else keeps the key.
    policy = tmp_path / "time.yaml"
    policy.write_text(POLICY)
    second = visor("init", "--config", str(path), "--yes", "--policy", str(policy))
    assert second.returncode == 0, second.stderr
    opts = _opts(_entry(path))
    assert opts[opts.index("--signing-key") + 1] == str(key) and "--policy" in opts
    # And `visor run` takes the options as written.
    from visor.cli import build_parser

    parsed = build_parser().parse_args(_entry(path)["args"])
    assert parsed.signing_key == str(key)
