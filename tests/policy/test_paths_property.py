"""No path outside an allowed prefix is ever allowed, whatever the encoding."""

from __future__ import annotations

import os
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.helpers import decide, policy_from, session_for

ROOT = "/srv/sandbox"
POLICY = policy_from(
    f"""
    servers:
      - name: fs
        allowed: true
        tools:
          - name: write_file
            allowed: true
            allowed_path_prefixes: ["{ROOT}"]
          - name: read_file
            allowed: true
            rules:
              - type: allow_path
                patterns: ["{ROOT}/**"]
    """
)
SESSION = session_for(POLICY, "fs")

_segment = st.one_of(
    st.sampled_from(["..", ".", "", "sandbox", "srv", "etc", "x", "...", "sandbox2", "%2e%2e", "a\\..\\.."]),
    st.text(alphabet="abc./\\%2e", min_size=1, max_size=6),
)
_path = st.lists(_segment, min_size=1, max_size=8).map(lambda segs: "/".join(segs))


def _encodings(p: str) -> list[str]:
    return [
        p,
        "file://" + quote(p),
        "file://" + quote(p, safe=""),
        "file://localhost" + p,
        p.replace("/", "//"),
    ]


def _inside(p: str) -> bool:
    """The reference answer, computed independently of the policy engine: every
    way a server could read ``p`` (the kernel's walk of the raw join, the lexical
    normalisation and its resolution; backslashes as names and as separators)."""
    if "\x00" in p:
        return False
    readings = []
    for text in (p, p.replace("\\", "/")):
        joined = os.path.join(os.getcwd(), os.path.expanduser(text))
        norm = os.path.normpath(joined)
        readings += [norm, os.path.realpath(joined), os.path.realpath(norm)]
    # POSIX keeps a leading "//" in a string; the Linux kernel reads it as "/"
    readings = ["/" + x.lstrip("/") if x.startswith("//") else x for x in readings]
    return all(x == ROOT or x.startswith(ROOT + "/") for x in readings)


@settings(max_examples=300, deadline=None)
@given(rel=_path, absolute=st.booleans(), base=st.sampled_from([ROOT + "/", "/", ROOT, "/srv/"]))
def test_property_no_path_outside_the_prefix_is_allowed(rel: str, absolute: bool, base: str) -> None:
    raw = (base + rel) if absolute else rel
    for enc in _encodings(raw):
        for tool, arg in (("write_file", "path"), ("read_file", "path"), ("read_file", "uri")):
            d = decide(POLICY, SESSION, tool, **{arg: enc})
            if d.action == "allow":
                target = enc
                if enc.startswith("file:"):
                    from urllib.parse import unquote, urlsplit

                    target = unquote(urlsplit(enc).path)
                assert _inside(target), (tool, enc, d)


@settings(max_examples=200, deadline=None)
@given(rel=_path)
def test_property_plain_traversal_never_escapes(rel: str) -> None:
    d = decide(POLICY, SESSION, "write_file", path=f"{ROOT}/{rel}")
    if d.action == "allow":
        assert _inside(f"{ROOT}/{rel}")
