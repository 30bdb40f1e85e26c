"""Every reading a real server could take of a path argument, on a real file system.

A deny rule (sensitive files, deny_path) fires when any reading matches, as a
case- and NFC/NFD-insensitive file system would compare; an allow rule
(allowed_path_prefixes, allow_path) must hold for every reading, compared
case-sensitively. Directories, symlinks and hardlinks are made in tmp_path.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import paths
from visor.policy.paths import compile_glob


def _policy(sandbox: Path, extra: str = "") -> tuple:
    pol = policy_from(
        f"""
        settings:
          sensitive_paths: ["**/geheimnis-schlüssel.txt"]
        servers:
          - name: fs
            allowed: true
            tools:
              - name: write_file
                allowed: true
                write_params: [path]
                allowed_path_prefixes: ["{sandbox}"]
              - name: read_file
                allowed: true
                rules:
                  - type: allow_path
                    patterns: ["{sandbox}/**"]
              - name: read_any
                allowed: true
                rules:
                  - type: deny_path
                    patterns: ["**/secrets/**", "/srv/café/**"]
        {extra}
        """
    )
    return pol, session_for(pol, "fs")


@pytest.fixture
def box(tmp_path: Path) -> tuple[Path, Path]:
    """(tmp_path, sandbox): the sandbox is the allowed root, tmp_path is outside it."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (tmp_path / "outside").mkdir()
    return tmp_path, sandbox


def _both_allow_rules(pol, ses, path: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    w = decide(pol, ses, "write_file", path=path, content="x")
    r = decide(pol, ses, "read_file", path=path)
    return w.action, r.action


# ------------------------------------------------------------------ backslash


def test_backslash_read_as_separator_inside_but_as_a_name_outside_is_denied(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    # Windows reading: <tmp>/sandbox/x.pth (inside). POSIX reading: a directory
    # named "other\..\sandbox" in <tmp> (outside).
    raw = f"{tmp}/other\\..\\sandbox/x.pth"
    assert f"{sandbox}/x.pth" in paths.forms(raw)
    assert f"{tmp}/other\\..\\sandbox/x.pth" in paths.forms(raw)
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")


def test_backslash_read_as_a_name_inside_but_as_separator_outside_is_denied(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    # POSIX reading: one file named "a\..\..\x.pth" in the sandbox (inside).
    # Windows reading: <tmp>/x.pth (outside).
    raw = f"{sandbox}/a\\..\\..\\x.pth"
    forms = paths.forms(raw)
    assert f"{sandbox}/a\\..\\..\\x.pth" in forms and f"{tmp}/x.pth" in forms
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")


def test_relative_backslash_traversal_from_inside_the_sandbox_is_denied(box, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    monkeypatch.chdir(sandbox)
    raw = "sandbox\\..\\..\\x.pth"
    assert f"{tmp}/x.pth" in paths.forms(raw)
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")
    # What a POSIX server does with it: one odd file name, inside the sandbox.
    with open(raw, "w") as fh:
        fh.write("x")
    assert (sandbox / raw).exists() and not (tmp / "x.pth").exists()


def test_a_backslash_that_stays_inside_under_both_readings_is_allowed(box) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    pol, ses = _policy(sandbox)
    assert _both_allow_rules(pol, ses, f"{sandbox}/notes\\draft.txt") == ("allow", "allow")


# ------------------------------------------------------------------ symlinks


def test_symlink_then_dotdot_the_kernel_reading_escapes_and_is_denied(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    (tmp / "outside" / "deeper").mkdir()
    (sandbox / "link").symlink_to(tmp / "outside" / "deeper")
    pol, ses = _policy(sandbox)
    raw = f"{sandbox}/link/../x.pth"
    forms = paths.forms(raw)
    # lexically <sandbox>/x.pth; the kernel follows link first: <tmp>/outside/x.pth
    assert forms[0] == f"{sandbox}/x.pth"
    assert f"{tmp}/outside/x.pth" in forms
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")
    # The kernel agrees with the reading Visor denied on.
    with open(raw, "w") as fh:
        fh.write("x")
    assert (tmp / "outside" / "x.pth").exists() and not (sandbox / "x.pth").exists()


def test_dotdot_through_a_symlink_that_stays_inside_is_allowed(box) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    (sandbox / "a" / "b").mkdir(parents=True)
    (sandbox / "to_b").symlink_to(sandbox / "a" / "b")
    pol, ses = _policy(sandbox)
    assert _both_allow_rules(pol, ses, f"{sandbox}/to_b/../x.txt") == ("allow", "allow")


def test_a_symlink_out_of_the_sandbox_is_denied(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    (sandbox / "out").symlink_to(tmp / "outside")
    pol, ses = _policy(sandbox)
    assert _both_allow_rules(pol, ses, f"{sandbox}/out/x.txt") == ("deny", "deny")


# ------------------------------------------------------------------ ordinary paths


@pytest.mark.parametrize(
    "spell",
    [
        "{s}/report.txt",
        "{s}/sub/dir/report.txt",
        "{s}/sub/../report.txt",
        "{s}",
        "file://{s}/report.txt",
        "{s}/notes.",  # Windows reads it as {s}/notes: inside either way
        "{s}/Report.TXT",
    ],
)
def test_ordinary_paths_inside_the_allowed_root_still_work(box, spell: str) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    (sandbox / "sub" / "dir").mkdir(parents=True)
    pol, ses = _policy(sandbox)
    w, r = _both_allow_rules(pol, ses, spell.format(s=sandbox))
    assert w == "allow"
    if spell != "{s}":  # allow_path "{s}/**" also matches the root itself
        assert r == "allow"


def test_relative_paths_inside_the_allowed_root_still_work(box, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    pol, ses = _policy(sandbox)
    monkeypatch.chdir(sandbox)
    assert _both_allow_rules(pol, ses, "report.txt") == ("allow", "allow")
    assert _both_allow_rules(pol, ses, "./a/../report.txt") == ("allow", "allow")


def test_allow_rules_compare_case_sensitively(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    # On a case-sensitive file system this is another directory.
    assert _both_allow_rules(pol, ses, f"{tmp}/SANDBOX/x.txt") == ("deny", "deny")


def test_windows_dot_space_names_that_climb_are_denied(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    # POSIX: a directory named ".. " inside; Windows drops the space: "..".
    raw = f"{sandbox}/.. /x.pth"
    assert f"{tmp}/x.pth" in paths.forms(raw)
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")


def test_untrimmed_and_literal_home_readings(box, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    monkeypatch.setenv("HOME", str(tmp / "outside"))
    monkeypatch.chdir(sandbox)
    # "~/../sandbox/x": expanded, <tmp>/sandbox/x (inside); taken literally by a
    # server that does not expand "~", <sandbox>/x (inside too): allowed.
    assert _both_allow_rules(pol, ses, "~/../sandbox/x") == ("allow", "allow")
    # "~/../../x" literally is <tmp>/x: denied whatever the expansion says.
    monkeypatch.setenv("HOME", str(sandbox / "a" / "b"))
    assert f"{tmp}/x" in paths.forms("~/../../x")
    assert _both_allow_rules(pol, ses, "~/../../x") == ("deny", "deny")


def test_file_uri_cut_by_hand_keeps_the_fragment(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    pol, ses = _policy(sandbox)
    raw = f"file://{sandbox}/x#/../../x.pth"
    assert f"{tmp}/x.pth" in paths.forms(raw)
    assert _both_allow_rules(pol, ses, raw) == ("deny", "deny")


# ------------------------------------------------------------------ sensitive names


@pytest.mark.parametrize(
    "name",
    [
        ".env",
        ".Env",
        ".ENV",
        ".env.",
        ".env ",
        ".env. .",
        ".env::$DATA",
        ".Env.local",
        ".SSH/ID_RSA",
        ".ssh\\id_rsa",
        "key.PEM",
        "Key.Pem.",
        "ID_ED25519",
        ".AWS/Credentials",
        ".Git-Credentials",
        "geheimnis-schlüssel.txt",
        "GEHEIMNIS-SCHLÜSSEL.TXT",
    ],
)
def test_case_nfd_and_windows_variants_of_sensitive_names_are_denied(box, name: str) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    pol, ses = _policy(sandbox)
    for spelling in {name, unicodedata.normalize("NFD", name), unicodedata.normalize("NFC", name)}:
        raw = f"{sandbox}/{spelling}"
        for tool in ("write_file", "read_file", "read_any"):
            d = decide(pol, ses, tool, path=raw)
            assert d.action == "deny" and d.rule == "path.sensitive", (tool, raw, d)


def test_case_variant_of_an_existing_env_is_denied_though_linux_reads_another_file(box) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    (sandbox / ".env").write_text("SECRET=1\n")
    pol, ses = _policy(sandbox)
    assert not (sandbox / ".Env").exists()  # a different name here, the same file on macOS
    d = decide(pol, ses, "read_file", path=f"{sandbox}/.Env")
    assert (d.action, d.rule) == ("deny", "path.sensitive")


@pytest.mark.parametrize("name", ["report.txt", "environment.md", "envy", "keys/readme", "pem.txt", "a.env1"])
def test_ordinary_names_are_not_sensitive(box, name: str) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    assert not any(paths.is_sensitive(f) for f in paths.forms(f"{sandbox}/{name}"))


def test_is_sensitive_folds_per_name() -> None:
    for p in ("/h/.Env", "/h/.env.", "/h/.env ", "/h/.SSH", "/h/.ssh./id_rsa", "/h/KEY.pem", "/ETC/Shadow"):
        assert paths.is_sensitive(p), p
    assert not paths.is_sensitive("/h/.envrc.d/x.txt")


# ------------------------------------------------------------------ deny_path


@pytest.mark.parametrize(
    "spell",
    [
        "/data/secrets/a.txt",
        "/data/SECRETS/a.txt",
        "/data/Secrets./a.txt",
        "/data/secrets /a.txt",
        "/data\\secrets\\a.txt",
        "/srv/café/menu.txt",
        "/srv/CAFÉ/menu.txt",
    ],
)
def test_deny_path_matches_every_spelling(box, spell: str) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    pol, ses = _policy(sandbox)
    for s in {unicodedata.normalize("NFC", spell), unicodedata.normalize("NFD", spell)}:
        d = decide(pol, ses, "read_any", path=s)
        assert d.action == "deny" and d.rule.endswith("deny_path"), (s, d)


def test_deny_path_through_a_symlink_and_dotdot(box) -> None:  # type: ignore[no-untyped-def]
    tmp, sandbox = box
    secrets = tmp / "outside" / "secrets"
    (secrets / "inner").mkdir(parents=True)
    (sandbox / "s").symlink_to(secrets / "inner")
    pol, ses = _policy(sandbox)
    # lexically <sandbox>/a.txt; the kernel: <tmp>/outside/secrets/a.txt
    d = decide(pol, ses, "read_any", path=f"{sandbox}/s/../a.txt")
    assert d.action == "deny" and d.rule.endswith("deny_path"), d
    assert decide(pol, ses, "read_any", path=f"{sandbox}/a.txt").action == "allow"


def test_glob_match_folded_and_plain_match() -> None:
    g = compile_glob("**/Secrets/**", resolve=False)
    assert g.match("/a/Secrets/b") and not g.match("/a/secrets/b")
    assert g.match_folded("/a/secrets/b") and g.match_folded("/a/SECRETS./b")
    assert not g.match_folded("/a/secretsx/b")


# ------------------------------------------------------------------ hardlinks


def test_a_hardlink_inside_the_sandbox_is_the_same_file_readings_do_not_follow_it(box) -> None:  # type: ignore[no-untyped-def]
    # A hardlink has no target to resolve: the policy allows it by where it is
    # (the file it shares is Visor's business only for Visor's own files, see
    # tests/security/test_protected_readings.py).
    tmp, sandbox = box
    (tmp / "outside" / "f.txt").write_text("x")
    os.link(tmp / "outside" / "f.txt", sandbox / "f.txt")
    pol, ses = _policy(sandbox)
    assert paths.forms(f"{sandbox}/f.txt") == (f"{sandbox}/f.txt",)
    assert _both_allow_rules(pol, ses, f"{sandbox}/f.txt") == ("allow", "allow")


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("raw", ["/a/\x00b", "file://evil.example/etc/passwd", "/a/\ud800"])
def test_unreadable_paths_raise_path_error_and_deny(box, raw: str) -> None:  # type: ignore[no-untyped-def]
    _tmp, sandbox = box
    with pytest.raises(paths.PathError):
        paths.forms(raw)
    pol, ses = _policy(sandbox)
    d = decide(pol, ses, "read_any", path=raw)
    assert (d.action, d.rule) == ("deny", "path.invalid")
