"""Visor's WHATWG reading of URLs against real Node (``new URL``), field by field.

A corpus of tricky URLs (hand-written and generated) goes to one ``node``
process in one batch. For each URL, Node and Visor must agree exactly on
whether it parses and on protocol, hostname, port, pathname and userinfo
presence, unless Visor classified the URL as ambiguous (then it is an opaque
destination, never trusted). And for every URL Visor does not mark
ambiguous, the host Node would connect to is the host Visor keys it by.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess

import pytest

from visor.policy import destinations, urls

NODE = shutil.which("node")

_SCRIPT = r"""
let data = "";
process.stdin.on("data", (c) => (data += c));
process.stdin.on("end", () => {
  const out = JSON.parse(data).map((u) => {
    try {
      const x = new URL(u);
      return {ok: true, href: x.href, protocol: x.protocol, hostname: x.hostname, port: x.port,
              pathname: x.pathname, search: x.search, userinfo: !!(x.username || x.password)};
    } catch (e) {
      return {ok: false};
    }
  });
  process.stdout.write(JSON.stringify(out));
});
"""

HAND = [
    "https://trusted.example%2F@evil.example/",
    "https://trusted.example%2f@evil.example/x",
    "https://evil.example\\@trusted.example/",
    "https://evil.example\\\\@trusted.example/",
    "https://trusted.example/ok/../../other",
    "https://trusted.example/ok/%2e%2e/%2E%2E/other",
    "https://trusted.example/ok/.%2e/other",
    "https://trusted.example/%69nternal/",
    "https://h.example/a%2Fb/../c",
    "https://h.example/a%5Cb",
    "https://h.example/a%40b",
    "https://user:pass@h.example:8443/p?q=1#f",
    "https://user@h.example/",
    "https://@h.example/",
    "https://:@h.example/",
    "https://a@b@h.example/",
    "https://a%40b@h.example/",
    "https://h.example@evil.example/",
    "https://h.example:443@evil.example/",
    "https://h.example#@evil.example/",
    "https://h.example?@evil.example/",
    "https://h.example/@evil.example/",
    "https://h.example;@evil.example/",
    "http://0x7f.1/",
    "http://127.1/",
    "http://2130706433/",
    "http://0177.0.0.1/",
    "http://0x7f000001/",
    "http://127.0.0.1.nip.example/",
    "http://[::1]/",
    "http://[0:0:0:0:0:0:0:1]:80/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fe80::1%25eth0]/",
    "http://[::1/",
    "https://bücher.example/",
    "https://xn--bcher-kva.example/",
    "https://BÜCHER.example/",
    "https://straße.example/",
    "https://ｅｘａｍｐｌｅ．com/",
    "https://example。com/",
    "https://example．com．/",
    "https://example.com./",
    "https://EXAMPLE.COM/Path",
    "HTTPS://Example.Com:443/",
    "HtTp://example.com:80/",
    "http://example.com:0080/",
    "http://example.com:65535/",
    "http://example.com:65536/",
    "http://example.com:-1/",
    "http://example.com:8o/",
    "http://example.com:/",
    "https:evil.example/",
    "https:/evil.example/",
    "https:\\\\evil.example\\x",
    "https:/\\evil.example/",
    "https://evil.example\\path\\..\\x",
    "ht\ttps://evil.example/",
    "https://ev\nil.example/",
    "https://evil.ex\tample/p\na\rth",
    " https://evil.example/ ",
    "\x00https://evil.example/",
    "https://evil.example/\x00",
    "https://evil.example/ a b",
    "https://evil.example/%zz",
    "https://evil.example/%",
    "https://evil.example/%7e%7E%41%2d",
    "https://evil.example/ümlaut",
    "https://evil.example/?q=%2F../x",
    "https://evil.example?x",
    "https://evil.example#frag",
    "https://evil.example",
    "https://",
    "https:///x",
    "http://exa mple.com/",
    "http://exa%20mple.com/",
    "http://exa%2Emple.com/",
    "http://ex%61mple.com/",
    "http://example.com%2F.evil.example/",
    "http://example.com%23.evil.example/",
    "http://example..com/",
    "http://.example.com/",
    "http://-example.com/",
    "http://exam_ple.com/",
    "http://example.com\u200b/",
    "http://exam\u00adple.com/",
    "http://example\u3002com/",
    "http://example.c\u2024om/",
    "javascript:alert(1)",
    "javascript://example.com/%0aalert(1)",
    "data:text/html,<script>alert(1)</script>",
    "file:///etc/passwd",
    "file://host.example/share",
    "file:\\\\host.example\\share",
    "mailto:eve@evil.example",
    "ftp://user@ftp.example:21/",
    "ws://h.example:80/",
    "wss://h.example:443/",
    "foo://Host.Example/a/../b",
    "foo://host.example:99999/",
    "git+ssh://git@github.example/a/b",
    "ssh://git@github.example:22/a",
    "HTTPS://evil.example/",
    "hTtPs://evil.example/",
    "https://evil.example:443:443/",
    "https://[evil.example]/",
    "https://evil.example/..",
    "https://evil.example/./a/./b/.",
    "https://evil.example//a//b",
    "https://evil.example/a?b#c?d",
    "//evil.example/",
    "evil.example/x",
    "/relative/path",
    "https://evil.example%00.trusted.example/",
    "https://evil.example%2E/",
    "https://xn--/",
    "https://xn--zz.example/",
    "https://a.b.c.d.e.f.g.example/",
    "https://1.2.3.4.5/",
    "https://1.2.3/",
    "https://0.0.0.0/",
    "https://999.1.1.1/",
    "https://1.2.3.4./",
    "https://0x1.0x2.0x3.0x4/",
    "https://١٢٣.example/",
    "https://example.com:４４３/",
    "https://example.com／evil/",
    "https://example.com＼@evil.example/",
    "https://example.com％2F@evil.example/",
]

_HOSTS = [
    "trusted.example",
    "TRUSTED.EXAMPLE",
    "trusted.example.",
    "bücher.example",
    "xn--bcher-kva.example",
    "127.1",
    "0x7f.0.0.1",
    "2130706433",
    "[::1]",
    "ｔrusted．example",
    "trusted%2Eexample",
]
_USERINFO = ["", "user@", "u:p@", "evil.example%2F@", "evil.example%40x@", "evil.example\\@", "@", "a@b@"]
_PATHS = [
    "/",
    "",
    "/ok/../x",
    "/ok/%2e%2e/x",
    "/a%2Fb",
    "/a%5cb",
    "\\a\\b",
    "/%69nternal/",
    "/a b",
    "/a\tb",
    "/?q=1",
    "/#f",
]
_SCHEMES = ["https://", "HTTP://", "https:", "https:\\\\", "ws://", "foo://"]
_PORTS = ["", ":443", ":80", ":0443", ":8080", ":"]


def _generated() -> list[str]:
    out: list[str] = []
    for scheme, user, host, port, path in itertools.product(
        _SCHEMES[:2], _USERINFO, _HOSTS, _PORTS[:2], _PATHS[:3]
    ):
        out.append(f"{scheme}{user}{host}{port}{path}")
    # every scheme and port with a few hosts and paths
    for scheme, host, port, path in itertools.product(_SCHEMES, _HOSTS[:5], _PORTS, _PATHS):
        out.append(f"{scheme}{host}{port}{path}")
    return out


CORPUS = list(dict.fromkeys(HAND + _generated()))


def _node_read(batch: list[str]) -> list[dict]:
    assert NODE is not None
    proc = subprocess.run(
        [NODE, "-e", _SCRIPT],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def node_readings() -> dict[str, dict]:
    if NODE is None:
        pytest.skip("node is not installed: the WHATWG differential needs a real Node to compare with")
    return dict(zip(CORPUS, _node_read(CORPUS), strict=True))


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) > 500
    for needle in ("%2F@", "\\@", "0x7f", "．", "%2e%2e", "\t", "javascript:", "data:", "file:", "[::1]"):
        assert any(needle in u for u in CORPUS), needle


def _node_host(n: dict) -> str:
    host = n["hostname"]
    if n["protocol"][:-1] not in urls.SPECIAL_SCHEMES:
        host = host.lower()
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def test_visor_reads_every_url_as_node_does_or_calls_it_ambiguous(node_readings: dict[str, dict]) -> None:
    mismatches: list[str] = []
    agreed = 0
    for raw, n in node_readings.items():
        u = urls.read_url(raw)
        w = u.whatwg
        if w is None or not n["ok"]:
            if w is None and not n["ok"]:
                continue
            if not u.ambiguous:
                mismatches.append(f"{raw!r}: node ok={n['ok']}, visor parsed={w is not None}")
            continue
        scheme = n["protocol"][:-1]
        port = int(n["port"]) if n["port"] else None
        fields = {
            "scheme": (scheme, w.scheme),
            "host": (_node_host(n), w.host),
            "port": (port, w.port),
            "userinfo": (n["userinfo"], w.userinfo),
            "path": (urls.canonical_path(n["pathname"]), u.path),
        }
        bad = {k: v for k, v in fields.items() if v[0] != v[1]}
        if bad and not u.ambiguous:
            mismatches.append(f"{raw!r}: {bad}")
        if not bad:
            agreed += 1
    assert not mismatches, "\n".join(mismatches)
    assert agreed > 400  # most of the corpus parses and agrees field by field


def test_unambiguous_urls_are_keyed_by_the_host_node_connects_to(node_readings: dict[str, dict]) -> None:
    checked = 0
    for raw, n in node_readings.items():
        u = urls.read_url(raw)
        if u.ambiguous:
            continue
        assert n["ok"], raw
        # the host key of the destination as parse() makes it
        if not urls.looks_like_url(raw):
            continue
        dests = destinations.parse(raw)
        url_dests = [d for d in dests if d.kind == "url"]
        if not url_dests:
            continue
        d = url_dests[0]
        assert d.domain == _node_host(n), (raw, d, n)
        assert f"host:{_node_host(n)}" in d.keys, (raw, d.keys)
        checked += 1
    assert checked > 200


def test_ambiguous_urls_are_opaque_and_never_trusted(node_readings: dict[str, dict]) -> None:
    trust = destinations.build_trust(["https://trusted.example/", "trusted.example", "evil.example"])
    seen = 0
    for raw in node_readings:
        u = urls.read_url(raw)
        if not u.ambiguous or not urls.looks_like_url(raw):
            continue
        seen += 1
        dests = destinations.parse(raw)
        # never allowed silently: some destination of the value needs a human
        assert not all(trust.covers(d) for d in dests), (raw, dests)
        if urls.looks_like_url(raw.strip()) and " " not in raw.strip():
            # one opaque destination per host some reader connects to (each judged by domain rules)
            assert {d.kind for d in dests} == {"opaque"} and len({d.key for d in dests}) == 1, (raw, dests)
    assert seen > 50
