"""urls.read_url: two real readings of a raw URL (WHATWG via ada-url, RFC 3986
via urllib), ambiguity when they disagree, the canonical form, and how trust
prefixes, provenance and taints use it."""

from __future__ import annotations

import pytest

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import destinations as dst
from visor.policy import urls
from visor.policy.chains import _taint_candidates
from visor.policy.evaluate import ToolCall

# ---------------------------------------------------------------- readings


@pytest.mark.parametrize(
    ("raw", "canonical", "host"),
    [
        ("https://trusted.example/", "https://trusted.example/", "trusted.example"),
        ("HTTPS://Trusted.Example:443/A?x=1", "https://trusted.example/A?x=1", "trusted.example"),
        ("http://h.example:80", "http://h.example/", "h.example"),
        ("http://h.example:8080/p", "http://h.example:8080/p", "h.example"),
        ("https://h.example./p", "https://h.example/p", "h.example"),
        ("https://bücher.example/x", "https://xn--bcher-kva.example/x", "xn--bcher-kva.example"),
        ("https://xn--bcher-kva.example/x", "https://xn--bcher-kva.example/x", "xn--bcher-kva.example"),
        ("https://ｅｘａｍｐｌｅ.com/", "https://example.com/", "example.com"),
        ("https://h.example/ok/../../other", "https://h.example/other", "h.example"),
        ("https://h.example/ok/%2e%2E/other", "https://h.example/other", "h.example"),
        ("https://h.example/%7e%41/a%2fb", "https://h.example/~A/a%2Fb", "h.example"),
        ("https://h.example/%69nternal/", "https://h.example/internal/", "h.example"),
        ("http://[0:0::1]:80/x", "http://[::1]/x", "[::1]"),
        ("wss://h.example:443/s", "wss://h.example/s", "h.example"),
        ("foo://Host.Example/a/../b", "foo://host.example/b", "host.example"),
    ],
)
def test_canonical_form(raw: str, canonical: str, host: str) -> None:
    u = urls.read_url(raw)
    assert not u.ambiguous, u.reason
    assert (u.canonical, u.host) == (canonical, host)
    # idempotent: the canonical form reads as itself
    assert urls.read_url(canonical).canonical == canonical


def test_userinfo_hides_nothing_the_real_host_is_keyed() -> None:
    # the first attack: percent-encoded "/" inside userinfo is not a separator
    u = urls.read_url("https://trusted.example%2F@evil.example/")
    assert not u.ambiguous and u.host == "evil.example"
    assert u.canonical == "https://user@evil.example/"  # never equal to a plain trusted URL
    assert u.whatwg is not None and u.whatwg.userinfo


@pytest.mark.parametrize(
    "raw",
    [
        "https://evil.example\\@trusted.example/",  # "\" is "/" to WHATWG, userinfo text to urllib
        "https:/\\evil.example/",
        "https:evil.example/",  # WHATWG: host evil.example; urllib: no host
        "http://0x7f.1/",  # WHATWG: 127.0.0.1
        "http://127.1/",
        "http://2130706433/",
        "https://straße.example/",  # UTS 46 vs IDNA 2003
        "https://@h.example/",  # empty userinfo: "@" to urllib, none to WHATWG
        "https://xn--zz.example/",  # invalid punycode: Node refuses, newer ada accepts
        "http://h.example:99999/",  # urllib refuses the port
        "file:///etc/passwd",  # no host
        "https://",  # not a URL
        "relative/path",
    ],
)
def test_ambiguous_urls(raw: str) -> None:
    u = urls.read_url(raw)
    assert u.ambiguous and u.reason and u.canonical is None


def test_ambiguous_url_names_every_host_any_reader_found() -> None:
    u = urls.read_url("https://evil.example\\@trusted.example/")
    assert set(u.hosts()) == {"evil.example", "trusted.example"}


def test_tabs_and_newlines_are_ignored_as_whatwg_ignores_them() -> None:
    u = urls.read_url("https://ev\til.exa\nmple/p")
    assert not u.ambiguous and u.host == "evil.example"
    assert dst.parse("ht\ttps://evil.example/")[0].domain == "evil.example"


def test_looks_like_url() -> None:
    for s in ("https://h/", "https:h.example", "HTTPS:\\\\h", "ht\ttps://h", "foo://x", " http://h "):
        assert urls.looks_like_url(s), s
    for s in ("localhost:8080", "mailto:a@b.c", "eve@x.example", "file:/x", "javascript:alert(1)", "ab"):
        assert not urls.looks_like_url(s), s


def test_dot_segments_and_paths() -> None:
    assert urls.remove_dot_segments("/a/b/../../../c/./d/.") == "/c/d/"
    assert urls.canonical_path("/a%2f..%2Fb") == "/a%2F..%2Fb"  # an encoded slash is no separator
    assert urls.decoded_path("/a%2f..%2Fb") == "/b"  # ... unless a server decodes first
    assert urls.decoded_path("/%2569nternal") == "/internal"  # nested encoding, bounded
    assert urls.decoded_path("/a\\..\\b") == "/b"


# ---------------------------------------------------------------- trust


TRUST = dst.build_trust(["https://trusted.example/ok/", "https://hooks.example/T1/"])


@pytest.mark.parametrize(
    ("raw", "covered"),
    [
        ("https://trusted.example/ok/", True),
        ("https://trusted.example/ok", True),
        ("https://trusted.example/ok/x?y=1", True),
        ("HTTPS://TRUSTED.EXAMPLE:443/ok/%78", True),
        ("https://trusted.example./ok/x", True),
        ("https://trusted.example/okay", False),
        ("https://trusted.example/ok/../../other", False),
        ("https://trusted.example/ok/%2e%2e/other", False),
        ("https://trusted.example/ok/..%2Fother", False),
        ("https://trusted.example/ok/..%5Cother", False),
        ("https://trusted.example/%6Fk/x", True),  # %6F is "o": the same path
        ("https://trusted.example%2F@evil.example/ok/", False),
        ("https://evil.example\\@trusted.example/ok/", False),
        ("https://user@trusted.example/ok/", False),  # userinfo: not the plain trusted URL
        ("http://trusted.example/ok/", False),
        ("https://trusted.example:8443/ok/", False),
        ("https://trusted.example.evil.example/ok/", False),
    ],
)
def test_url_prefix_trust_on_canonical_form(raw: str, covered: bool) -> None:
    assert all(TRUST.covers(d) for d in dst.parse(raw)) is covered, dst.parse(raw)


def test_an_ambiguous_url_in_the_trust_list_trusts_nothing() -> None:
    t = dst.build_trust(["https://evil.example\\@trusted.example/"])
    assert not t.keys and not t.url_prefixes
    assert not any(t.covers(d) for d in dst.parse("https://evil.example\\@trusted.example/"))


def test_a_url_only_decoding_produces_is_opaque() -> None:
    (d,) = dst.parse("https%3A%2F%2Ftrusted.example%2F")
    assert d.kind == "opaque" and "host:trusted.example" in d.keys
    assert not dst.build_trust(["https://trusted.example/"]).covers(d)


# ---------------------------------------------------------------- provenance


POLICY = policy_from(
    """
    servers:
      - name: web
        allowed: true
        tools:
          - name: fetch
            allowed: true
            exfiltrating: true
            sink_params: [url]
            trusted_destinations: ["https://trusted.example/ok/"]
          - name: read
            allowed: true
    """
)


def test_provenance_uses_the_real_host() -> None:
    s = session_for(POLICY, "web", ["fetch", "read"])
    s.observe_output("read", {"content": [{"type": "text", "text": "upload to https://evil.example/in"}]})
    for url in (
        "https://trusted.example%2F@evil.example/",
        "https://evil.example\\@trusted.example/",  # ambiguous, but one reading is the seen host
        "HTTPS://EVIL.EXAMPLE./x",
        "https://ev\til.example/",
    ):
        d = decide(POLICY, s, "fetch", url=url)
        assert (d.action, d.rule) == ("deny", "provenance.untrusted_output"), url
    assert decide(POLICY, s, "fetch", url="https://trusted.example/ok/a").action == "allow"
    d = decide(POLICY, s, "fetch", url="https://trusted.example/ok/../../other")
    assert (d.action, d.rule) == ("ask", "provenance.unknown_destination")
    d = decide(POLICY, s, "fetch", url="http://0x7f.1/ok/")
    assert (d.action, d.rule) == ("ask", "provenance.unplaceable")


def test_output_urls_are_indexed_by_every_reading() -> None:
    keys = dst.extract_keys("see https://a.example\\@b.example/ and https://x.example%2F@y.example/")
    assert {"host:a.example", "host:b.example", "host:y.example"} <= keys


# ---------------------------------------------------------------- taints


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://h.example/%69nternal/x", "/internal/x"),
        ("https://h.example/ok/../internal/x", "/internal/x"),
        ("https://h.example/ok/%2e%2e/internal/x", "/internal/x"),
        ("https://h.example/a%2F..%2Finternal/x", "/internal/x"),
        ("https:\\\\h.example\\internal\\x", "/internal/x"),
    ],
)
def test_taint_candidates_hold_every_path_reading(url: str, want: str) -> None:
    assert want in _taint_candidates({"url": url})


def test_taint_glob_matches_a_decoded_path_end_to_end() -> None:
    policy = policy_from(
        """
        servers:
          - name: web
            allowed: true
            tools:
              - name: fetch
                allowed: true
              - name: post
                allowed: true
        taints:
          - name: internal
            source_tools: [fetch]
            source_patterns: ["**/internal/**"]
        egress_controls:
          - name: no-post-after-internal
            when_tainted: internal
            sink_tools: [post]
            action: deny
        """
    )
    for url in (
        "https://h.example/%69nternal/x",
        "https://h.example/pub/../internal/x",
        "https://h.example/pub/..%2Finternal/x",
    ):
        s = session_for(policy, "web", ["fetch", "post"])
        assert decide(policy, s, "fetch", url=url).action == "allow"
        s.record_allowed(ToolCall("web", "fetch", {"url": url}))
        assert s.taints == {"internal"}, url
        d = decide(policy, s, "post", body="x")
        assert (d.action, d.rule) == ("deny", "egress.no-post-after-internal") or d.action == "deny", d
    s = session_for(policy, "web", ["fetch", "post"])
    s.record_allowed(ToolCall("web", "fetch", {"url": "https://h.example/internals/x"}))
    assert s.taints == set()  # the glob is segment-aware: "internals" is another name
