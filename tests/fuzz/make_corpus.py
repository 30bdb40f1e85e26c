"""Write the seed corpus: `python -m tests.fuzz.make_corpus` (idempotent).

tests/fuzz/corpus/wire/  one file per seed: byte 0 picks the size limit
                         (invariants.LIMITS), byte 1 the chunking, the rest
                         is the stream.
tests/fuzz/corpus/policy/ policy YAML: the repository's policies plus
                         hand-made tricky inputs.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"


def _req(inner: bytes, msg_id: bytes = b"1") -> bytes:
    return b'{"jsonrpc":"2.0","id":' + msg_id + b',"method":"tools/call","params":' + inner + b"}"


def _call(args: bytes, name: bytes = b'"t"', msg_id: bytes = b"1") -> bytes:
    return _req(b'{"name":' + name + b',"arguments":' + args + b"}", msg_id)


def _deep(n: int, key: bytes = b'"a"') -> bytes:
    return b"{" + key + b":" + b"[" * n + b"]" * n + b"}"


WIRE_LINES: list[bytes] = [
    # valid shapes
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
    b'{"jsonrpc":"2.0","id":"a","result":{}}',
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"x"}}',
    b'{ "method" : "tools/call", "jsonrpc":"2.0", "params":{"arguments":{"b":1,"a":"\\u00e9"},"name":"echo"},"id":12345678901234567}',
    _call(b'{"a":[1]}'),
    _req(b'{"name":"echo"}'),
    b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
    # case variants a Go server folds onto protocol members and argument names
    _req(b'{"name":"w","Arguments":{"path":"/x"}}'),
    _req(b'{"name":"w","argument\\u017f":{"path":"/x"}}'),
    _req(b'{"name":"w","arguments":{"PATH":"/x","\\u212aey":1}}'),
    b'{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"URI":"file:///x"}}',
    # JSON inside strings: decoded by the SDK for non-str parameters
    _call(b'{"paths":"[\\"/srv/\\\\u002eenv\\"]"}'),
    _call(b'{"spec":"{\\"a\\":1,\\"A\\":2}"}'),
    _call(b'{"limit":"+1_000"}'),
    # framing: CR, CRLF, BOM, NUL, whitespace, trailing data
    b'{"jsonrpc":"2.0",\r"id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}\r',
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}\r\r',
    b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"method":"p\x00"}',
    b'\x00{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b"   \t",
    b'{"jsonrpc":"2.0","id":1,"method":"ping"} {}',
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}x',
    b'{"jsonrpc":"2.0","id":1,"method":"ping"',
    b'"just a string"',
    b"[]",
    # invalid UTF-8: overlong, surrogates, truncated, stray continuation
    b'{"jsonrpc":"2.0","id":1,"method":"p\xff"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xc0\xaf"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xe0\x80\xaf"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80\xed\xb0\x80"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xf4\x90\x80\x80"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xe2\x82"}',
    b'{"jsonrpc":"2.0","id":1,"method":"\x80"}',
    # lone and paired surrogate escapes
    _call(b'{"s":"\\ud800"}'),
    _call(b'{"s":"\\udc00"}'),
    _call(b'{"s":"\\ud83d\\ude00"}'),
    _call(b'{"s":"\\ud83d"}'),
    # ids of every type
    *(
        b'{"jsonrpc":"2.0","id":' + i + b',"method":"ping"}'
        for i in (
            b"null",
            b"true",
            b"false",
            b"1.5",
            b"1.0",
            b"1e3",
            b"-0",
            b"-0.0",
            b"{}",
            b"[]",
            b'""',
            b"0",
            b"9223372036854775807",
            b"9223372036854775808",
            b"-9223372036854775808",
            b"-9223372036854775809",
            b"18446744073709551615",
            b"18446744073709551616",
            b"9007199254740993",
            b'"\\u0031"',
        )
    ),
    # numbers: beyond u64 (orjson reads a float), beyond a double, tiny
    _call(b'{"size":18446744073709551615}'),
    _call(b'{"size":18446744073709551616}'),
    _call(b'{"size":18446744073709551617}'),
    _call(b'{"size":-9223372036854775809}'),
    _call(b'{"size":1' + b"0" * 30 + b"}"),
    _call(b'{"size":1e400}'),
    _call(b'{"size":-1e400}'),
    _call(b'{"size":1e-400}'),
    _call(b'{"size":NaN}'),
    _call(b'{"size":Infinity}'),
    _call(b'{"size":-Infinity}'),
    _call(b'{"size":01}'),
    _call(b'{"size":1.}'),
    _call(b'{"size":.5}'),
    _call(b'{"size":+1}'),
    # envelope errors
    b'{"jsonrpc":"1.0","id":5,"method":"ping"}',
    b'{"id":5,"method":"ping"}',
    b'{"jsonrpc":2.0,"id":5,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":5,"method":7}',
    b'{"jsonrpc":"2.0","id":5,"method":"ping","params":[1]}',
    b'{"jsonrpc":"2.0","id":5,"method":"ping","extra":1}',
    b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email","arguments":{}}}',
    _req(b'{"arguments":{}}'),
    _req(b'{"name":7}'),
    _req(b'{"name":""}'),
    _req(b'{"name":"x","arguments":[]}'),
    # responses
    b'{"jsonrpc":"2.0","id":1}',
    b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}',
    b'{"jsonrpc":"2.0","id":1,"result":[]}',
    b'{"jsonrpc":"2.0","id":null,"result":{}}',
    # batches
    b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":"b","method":"ping"}]',
    b"[1,[2],{}]",
    # duplicates: exact, case-folded, escaped, at depth, in arrays
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}',
    b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"ID":2,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"\\u0069d":2,"method":"ping"}',
    b'{"jsonrpc":"2.0","\\u0069\\u0064":1,"method":"ping"}',
    _call(b'{"to":"x","to":"y"}'),
    _call(b'{"to":"x","TO":"y"}'),
    _call(b'{"to":"x","\\u0074o":"y"}'),
    _call(b'{"to":"x","t\\u006f":"y"}'),
    _call(b'{"a":[{"k":1,"K":2}]}'),
    _call(b'{"a":{"b":{"c":{"d":1,"d":2}}}}'),
    _call(b'{"t":"x:y","t":1}', name=b'"a:b"'),
    _call(b'{"u":"http://x:1/","l":["a:b",{"c:d":":"}]}', name=b'"a:b::"'),
    _call(b'{"u":"\\u003a","v":"\\u00e9"}'),
    _call(b'{"a\\u003a":1,"a:":2}'),
    _call(b'{"a":"\\\\u0041","a":1}'),
    _call(b'{"x":"\\\\","y":"\\\\u"}'),
    # Unicode folding: Kelvin/k, long s/s, sharp s/ss, dotless i, dotted I, sigma
    b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"\\u212a":1,"k":2}}',
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u212a":1,"k":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u017f":1,"S":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u00df":1,"ss":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u1e9e":1,"\u00df":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u0131d":1,"id":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u0130":1,"i\u0307":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u03c3":1,"\u03c2":2,"\u03a3":3}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u01c4":1,"\u01c5":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u212b":1,"\u00e5":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\uff41":1,"\uff21":2}}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"x","params":{"\U00010400":1,"\U00010428":2}}'.encode(),
    # raw Unicode line breaks inside strings (valid JSON; str.splitlines splits)
    _call('{"s":"a\u2028b"}'.encode()),
    _call('{"s":"a\u2029b"}'.encode()),
    _call('{"s":"a\x85b"}'.encode()),
    _call(b'{"s":"a\x0bb"}'),
    _call(b'{"s":"a\x0cb"}'),
    _call(b'{"s":"a\x1cb"}'),
    _call(b'{"s":"a\\u2028b"}'),
    # nesting: around orjson's 254 (dumps) and 1024 (loads), json's recursion limit
    *(_req(_deep(n)) for n in (253, 254, 255, 400, 1017, 1018, 1019, 1030)),
    *(_req(_deep(n, b'"\\u0061"')) for n in (900, 980, 1000, 1018)),
    _req(b'{"a":1,"A":' + _deep(300) + b"}"),
    # long lines: past the 8192-byte fast path of the duplicate check
    _call(b'{"pad":"' + b"x" * 9000 + b'","to":"a","to":"b"}'),
    _call(b'{"pad":"' + b"x" * 9000 + b'","to":"a","To":"b"}'),
    _call(b'{"pad":"' + b":" * 9000 + b'","to":"a"}'),
]

# Whole streams: several lines, CRLF, partial tail, blank lines.
WIRE_STREAMS: list[bytes] = [
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n{"jsonrpc":"2.0","id":2,"method":"ping"}\r\n{"jsonrpc"',
    b"\n\n\r\n \n",
    b"x\r\r\n",
    b"1234\r\n12345\r\n",
    b"a\rb\nc\r\n",
]


def _name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def write_wire(folder: Path) -> int:
    n = 0
    for line in WIRE_LINES:
        # default limit, whole chunk; and byte-by-byte; and random cuts
        headers = (
            (b"\x00\x00", b"\x00\x03")
            if len(line) > 1000
            else (b"\x00\x00", b"\x00\x01", b"\x00\x02", b"\x00\x03")
        )
        for header in headers:
            data = header + line + b"\n"
            (folder / _name(data)).write_bytes(data)
            n += 1
    for stream in WIRE_STREAMS:
        for limit in range(5):
            for chunking in range(4):
                data = bytes((limit, chunking)) + stream
                (folder / _name(data)).write_bytes(data)
                n += 1
    return n


POLICY_TEXTS: list[str] = [
    "",
    "version: 1\n",
    "servers: &a [*a]\n",
    "settings: &a {identity: *a}\n",
    "settings:\n  <<: {log_level: info}\n",
    "description: !!python/object:os.system x\n",
    "description: !!binary aGVsbG8=\n",
    "description: 2001-12-14\n",
    "settings:\n  max_argument_size_bytes: 0x1F\n  max_output_size_bytes: 1:20\n  chain_window_size: 0o17\n",
    "settings:\n  max_argument_size_bytes: " + "9" * 5000 + "\n",
    "settings:\n  session_max_tools: 1\n  session_max_calls: 2\n",
    "time_restrictions:\n  - name: x\n    outside_action: deny\n    timezone: Europe/Paris\n"
    "    allowed_hours:\n      - {start: '09:00', end: '24:00', days: [mon, Friday]}\n",
    "time_restrictions:\n  - name: x\n    outside_action: deny\n    timezone: ../../etc/passwd\n",
    "servers:\n  - name: s\n    allowed: true\n    tools:\n      - name: t\n        allowed: true\n"
    "        allowed_path_prefixes: [/tmp, /a/../b]\n        arg_patterns: {x: '^a+$'}\n"
    "        rules:\n          - type: deny_path\n            patterns: ['/etc/**', '~/.ssh/*', '{a,b}/[!x]?']\n"
    "          - type: allowed_repos\n            repos: ['org/*']\n"
    "          - type: max_file_size\n            bytes: 1024\n"
    "          - type: deny_command_pattern\n            patterns: ['rm\\s+-rf', '(a)\\1']\n"
    "          - type: deny_recipient_domain\n            domains: ['@evil.com']\n",
    "taints:\n  - name: web\n    source_tools: [fetch]\negress_controls:\n"
    "  - name: e\n    when_tainted: web\n    sink_tools: [send]\n    action: deny\n",
    "tool_chains:\n  - name: c\n    sources: [{tool_pattern: 'read.*'}]\n    sinks: [{tool_pattern: '('}]\n    action: ask\n",
    "redaction:\n  output_redaction: yes\n  patterns: [{regex: 'sk-[a-z]+'}]\n",
    "identities:\n  - name: me\n    allowed_servers: [a]\n",
    "servers:\n  - {name: s, allowed: true}\n  - {name: s, allowed: true}\n",
]


def write_policy(folder: Path) -> int:
    n = 0
    sources = [
        *sorted((ROOT / "policies").glob("*.yaml")),
        ROOT / "visor" / "policy" / "default.yaml",
        *sorted((ROOT / "visor" / "policy" / "packs").glob("*.yaml")),
        *sorted((ROOT / "tests" / "policy" / "data").glob("*.yaml")),
        ROOT / "visor" / "bench" / "policy-30-rules.yaml",
    ]
    for path in sources:
        if path.is_file():
            data = path.read_bytes()
            (folder / _name(data)).write_bytes(data)
            n += 1
    for text in POLICY_TEXTS:
        data = text.encode("utf-8")
        (folder / _name(data)).write_bytes(data)
        n += 1
    return n


def main() -> None:
    for target, write in (("wire", write_wire), ("policy", write_policy)):
        folder = CORPUS / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"{target}: {write(folder)} seeds in {folder.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
