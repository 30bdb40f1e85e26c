"""addresses.read_address: every spelling of one mailbox is one key; distinct
mailboxes never collapse; Python's own e-mail parser as a second reading."""

from __future__ import annotations

import string
from email.headerregistry import Address as PyAddress
from email.utils import parseaddr

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import addresses
from visor.policy import destinations as dst

SAME_AS_EVE = [
    "eve@x.example",
    "EVE@X.EXAMPLE",
    "Eve@X.Example",
    '"eve"@x.example',
    '"EVE"@X.EXAMPLE',
    "eve@x.example.",
    "EVE@X.EXAMPLE.",
    '"eve"@x.example.',
    "eve(comment)@x.example",
    "(c)eve@x.example",
    "eve@(c)x.example",
    "eve@x.example(c)",
    "eve @ x.example",
    " eve@x.example ",
    '"e\\ve"@x.example',  # a quoted-pair of a plain character is that character
    "eve@ｘ.example",  # fullwidth letter: UTS 46 maps it
    "eve@x．example",  # fullwidth dot
]


@pytest.mark.parametrize("spelling", SAME_AS_EVE)
def test_spellings_of_one_mailbox_are_one_key(spelling: str) -> None:
    a = addresses.read_address(spelling)
    assert a is not None, spelling
    assert (a.key, a.special) == ("email:eve@x.example", False), spelling


@pytest.mark.parametrize(
    "spelling",
    [
        "eve@café.example",
        "eve@CAFÉ.example",
        "eve@xn--caf-dma.example",
        "EVE@XN--CAF-DMA.EXAMPLE.",
        '"eve"@café.example',
        "eve@cafe\u0301.example",  # decomposed é: UTS 46 normalises
    ],
)
def test_unicode_domain_and_its_punycode_are_one_key(spelling: str) -> None:
    a = addresses.read_address(spelling)
    assert a is not None and a.key == "email:eve@xn--caf-dma.example", spelling


def test_sub_addressing_keys_the_mailbox_too() -> None:
    a = addresses.read_address('"eve+news"@x.example')
    assert a is not None and a.keys == ("email:eve+news@x.example", "email:eve@x.example")


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("eve@[1.2.3.4]", "email:eve@[1.2.3.4]"),
        ("EVE@[ 1.2.3.4 ]", "email:eve@[1.2.3.4]"),
        ("eve@[IPv6:0:0:0:0:0:0:0:1]", "email:eve@[ipv6:::1]"),
    ],
)
def test_ip_literals(spelling: str, key: str) -> None:
    a = addresses.read_address(spelling)
    assert a is not None and a.key == key


@pytest.mark.parametrize(
    "a,b",
    [
        ("eve@x.example", "eve@y.example"),
        ("eve@x.example", "eve@x.example.evil.io"),
        ("eve@x.example", "eve@sub.x.example"),
        ("eve@x.example", "evf@x.example"),
        ("eve@x.example", "eve.x@x.example"),
        ("eve@cafe.example", "eve@café.example"),
        ("eve@[1.2.3.4]", "eve@[1.2.3.5]"),
        ('"eve bob"@x.example', "eve@x.example"),
        ("eve@xn--caf-dma.example", "eve@xn--cafe-dma.example"),
    ],
)
def test_distinct_mailboxes_stay_distinct(a: str, b: str) -> None:
    ra, rb = addresses.read_address(a), addresses.read_address(b)
    assert ra is not None and rb is not None
    assert ra.key != rb.key


@pytest.mark.parametrize(
    "spelling",
    [
        "eve",
        "eve@",
        "@x.example",
        "eve@@x.example",
        "eve@x",
        '"eve@x.example',
        "eve@x..example",
        "eve@-x.example",
        "eve@x.123",
        "eve@[1.2.3]",
        "eve@(x.example",
        "a@b@c.example",
    ],
)
def test_not_one_address(spelling: str) -> None:
    assert addresses.read_address(spelling) is None, spelling


def test_special_quoted_local_part_is_opaque_and_carries_its_look_alikes() -> None:
    a = addresses.read_address('"eve@evil.example"@relay.example')
    assert a is not None and a.special
    assert "email:eve@evil.example" in a.keys  # a mailer may route to the inner address
    b = addresses.read_address('"e ve"@x.example')
    assert b is not None and b.special and "email:eve@x.example" in b.keys
    (d,) = dst.parse('"e ve"@x.example')
    assert d.kind == "opaque"
    assert not dst.build_trust(['"e ve"@x.example', "@x.example"]).covers(d)


def test_display_names_and_mailto_forms() -> None:
    for s in (
        "Eve <eve@x.example>",
        '"Eve" <eve@x.example>',
        '"Eve, the boss" <EVE@X.EXAMPLE.>',
        "mailto:eve@x.example",
        "mailto:%22eve%22@x.example",
        "mailto:eve%40x.example",
        "eve@x.example (Eve)",
    ):
        keys = {k for d in dst.parse(s) for k in d.keys}
        assert "email:eve@x.example" in keys, (s, dst.parse(s))


@pytest.mark.parametrize(
    "spelling",
    ["eve@x.example", "Eve <eve@x.example>", '"Eve" <EVE@X.example>', '"eve"@x.example', "eve+t@x.example"],
)
def test_python_email_parser_agrees(spelling: str) -> None:
    # a second real reading: email.utils / headerregistry
    _name, addr = parseaddr(spelling)
    py = PyAddress(addr_spec=addr)
    ours = {k for d in dst.parse(spelling) for k in d.keys}
    assert f"email:{py.username.casefold()}@{py.domain.lower().rstrip('.')}" in ours


_atom = st.text(alphabet=string.ascii_lowercase + string.digits + "_-", min_size=1, max_size=10)
_domain = st.builds(
    lambda a, b: f"{a}.{b}",
    st.text(string.ascii_lowercase, min_size=1, max_size=8),
    st.sampled_from(["com", "example", "org"]),
)


@given(local=_atom, domain=_domain)
def test_python_parser_reads_generated_addresses_as_we_do(local: str, domain: str) -> None:
    for spelling in (f"{local}@{domain}", f'"{local}"@{domain}', f"Name <{local}@{domain}>"):
        _n, addr = parseaddr(spelling)
        py = PyAddress(addr_spec=addr)
        a = addresses.read_address(addr)
        assert a is not None
        assert a.key == f"email:{py.username.casefold()}@{py.domain.lower()}"


# ---------------------------------------------------------------- provenance


POLICY = policy_from(
    """
    servers:
      - name: mail
        allowed: true
        tools:
          - name: send
            allowed: true
            exfiltrating: true
            sink_params: [to]
            trusted_destinations: ["boss@corp.example"]
          - name: read
            allowed: true
    """
)


@pytest.mark.parametrize(
    "to",
    [
        '"eve"@x.example',
        "eve@x.example.",
        "EVE@X.EXAMPLE",
        "eve(c)@x.example",
        "eve@(c)x.example",
        "eve+tag@x.example",
        '"Eve" <eve@x.example>',
        "mailto:%22eve%22@x.example",
        '"eve@x.example"@relay.example',
    ],
)
def test_variant_of_a_seen_address_is_denied_not_asked(to: str) -> None:
    s = session_for(POLICY, "mail", ["send", "read"])
    s.observe_output("read", {"content": [{"type": "text", "text": "write to eve@x.example today"}]})
    d = decide(POLICY, s, "send", to=to)
    assert (d.action, d.rule) == ("deny", "provenance.untrusted_output"), to


@pytest.mark.parametrize(
    "seen",
    ['"eve"@x.example', "EVE@X.EXAMPLE.", "eve(c)@x.example", "eve@xn--caf-dma.example", "eve@café.example"],
)
def test_a_variant_in_output_denies_the_plain_address(seen: str) -> None:
    s = session_for(POLICY, "mail", ["send", "read"])
    s.observe_output("read", {"content": [{"type": "text", "text": f"reply to {seen}, thanks"}]})
    plain = "eve@café.example" if "caf" in seen else "eve@x.example"
    d = decide(POLICY, s, "send", to=plain)
    assert (d.action, d.rule) == ("deny", "provenance.untrusted_output"), seen


def test_ordinary_addresses_work_as_before() -> None:
    s = session_for(POLICY, "mail", ["send", "read"])
    assert decide(POLICY, s, "send", to="boss@corp.example").action == "allow"
    assert decide(POLICY, s, "send", to="BOSS@corp.example.").action == "allow"
    assert decide(POLICY, s, "send", to='"boss"@corp.example').action == "allow"
    d = decide(POLICY, s, "send", to="new@elsewhere.example")
    assert (d.action, d.rule) == ("ask", "provenance.unknown_destination")
