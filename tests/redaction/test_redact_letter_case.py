"""The prefilter, its long-line short cut and the gate that decide whether a built-in pattern
runs at all are never stricter than the pattern: whatever letter case a keyword is written in,
when the regex would redact a secret, the screens let it run. (The AWS secret's keyword was read
in any case by its regex and screened in seven spellings only: "Secret_Access_Key=..." passed.)"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from visor.redact import BUILTIN, DEFAULT_REDACTOR, Finding, redact_output

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # 40 characters of the key alphabet
NATURAL = [
    "secret_access_key", "SECRET_ACCESS_KEY", "Secret_Access_Key", "secretAccessKey", "SecretAccessKey",
    "secretaccesskey", "SECRETACCESSKEY", "aws_secret_access_key", "secret_key", "SECRET_KEY", "SecretKey",
]  # fmt: skip


def _redacted(text: str) -> tuple[bool, list[Finding]]:
    result = {"content": [{"type": "text", "text": text}]}
    raw = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": result})
    findings: list[Finding] = []
    new = redact_output(result, DEFAULT_REDACTOR.outputs, "$", findings)
    return DEFAULT_REDACTOR.outputs.may_match(raw), findings if SECRET not in str(new) else []


@pytest.mark.parametrize("keyword", NATURAL)
@pytest.mark.parametrize("padding", [0, 6000], ids=["short line", "long line"])
def test_the_aws_secret_is_found_in_the_cases_people_write_the_keyword(keyword: str, padding: int) -> None:
    screened, findings = _redacted("x " * padding + f"{keyword}={SECRET}")
    assert screened and [f.pattern for f in findings] == ["aws_secret_access_key"]


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.booleans(), min_size=17, max_size=17),
    padding=st.sampled_from([0, 6000]),
)
def test_the_screens_never_rule_out_what_the_regex_would_redact(flips: list[bool], padding: int) -> None:
    keyword = "".join(c.upper() if f else c for c, f in zip("secret_access_key", flips, strict=True))
    text = "x " * padding + f"{keyword}={SECRET}"
    aws = next(p for p in BUILTIN if p.name == "aws_secret_access_key")
    screened, _ = _redacted(text)
    if aws.regex.search(text):
        assert screened


def test_a_line_without_the_keyword_is_still_ruled_out() -> None:
    pset = DEFAULT_REDACTOR.outputs
    assert not pset.may_match(orjson.dumps({"text": "x " * 6000 + SECRET}))
    assert not pset.may_match(orjson.dumps({"text": "nothing to see " + SECRET}))
