"""A resource allow list admits a file URI only when every reading of its path is inside."""

from __future__ import annotations

from pathlib import Path

from tests.policy.helpers import policy_from
from visor.policy.requests import resource_decision

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "files"
    allowed: true
    resources:
      allow: ["file://{docs}/**", "memo://**"]
      deny: ["memo://private/**"]
"""


def test_every_reading_of_a_file_uri_must_be_allowed(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a")
    (docs / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "outside").mkdir()
    policy = policy_from(POLICY.format(docs=docs))
    assert resource_decision(policy, "files", f"file://{docs}/a.txt") is None
    for uri in (
        f"file://{docs}/link/x",  # symlinked out
        f"file://{docs}/link/../../x",  # the kernel follows link before ..
        f"file://{docs}/a\\..\\..\\x",  # backslash as a separator
        f"file://{docs}/../x",
    ):
        d = resource_decision(policy, "files", uri)
        assert d is not None and d.action == "deny", uri


def test_deny_globs_match_any_reading_in_any_case(tmp_path: Path) -> None:
    policy = policy_from(POLICY.format(docs=tmp_path))
    assert resource_decision(policy, "files", "memo://public/x") is None
    for uri in ("memo://private/x", "MEMO://PRIVATE/x"):
        d = resource_decision(policy, "files", uri)
        assert d is not None and d.rule.endswith("resources.deny"), uri


def test_a_uri_is_judged_as_a_url_parser_reads_it(tmp_path: Path) -> None:
    """Node's `new URL()` (the TypeScript SDK's resources/read) and Python's urlsplit strip C0
    controls and spaces around a URI and drop tabs and newlines inside it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    policy = policy_from(POLICY.format(docs=docs))
    for uri in (" memo://private/x", "me\tmo://private/x", "\x01memo://priv\nate/x"):
        d = resource_decision(policy, "files", uri)
        assert d is not None and d.rule.endswith("resources.deny"), uri
    for uri in (f" file://{tmp_path}/x", f"fi\tle://{docs}/../x"):
        d = resource_decision(policy, "files", uri)
        assert d is not None and d.rule.endswith("resources.allow"), uri
    open_policy = policy_from('version: "1.0"\ndefault_action: allow\n')
    for uri in (f" file://{tmp_path}/.env", f"fi\tle://{tmp_path}/.env", f"\tfile://{tmp_path}/.ssh/id_rsa"):
        d = resource_decision(open_policy, "files", uri)
        assert d is not None and d.rule == "resource.sensitive", uri
    assert resource_decision(policy, "files", f"file://{docs}/a.txt") is None
