import argparse

import pytest

from visor.audit.commands import register
from visor.audit.verify import verify_path

from .helpers import lines, write_log


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "audit.jsonl"
    write_log(path, 6)
    return path


def cli(*argv):
    parser = argparse.ArgumentParser(prog="visor")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_intact_log_verifies(log, capsys):
    report = verify_path(log)
    assert report.ok and report.records == 7 and report.first_seq == 0 and report.last_seq == 6
    assert cli("audit", "verify", str(log)) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK 7 records") and out.count("\n") == 1 and report.head in out


def test_every_single_byte_edit_is_caught(log):
    original = log.read_bytes()
    start = sum(len(x) for x in lines(log)[:3])  # line 4
    end = start + len(lines(log)[3]) - 1  # its newline is covered by the truncation test
    for pos in range(start, end):
        data = bytearray(original)
        data[pos] ^= 0x01
        log.write_bytes(bytes(data))
        report = verify_path(log)
        assert not report.ok, pos
        assert report.problem.line in (4, 5), (pos, report.problem)


def test_edited_value_is_named(log, capsys):
    data = lines(log)
    data[3] = data[3].replace(b"/work/out/2.txt", b"/etc/passwd0000")
    log.write_bytes(b"".join(data))
    assert cli("audit", "verify", str(log)) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL {log}:4: ") and "edited" in out


def test_deleted_line(log):
    data = lines(log)
    del data[3]
    log.write_bytes(b"".join(data))
    problem = verify_path(log).problem
    assert problem.line == 4 and "deleted" in problem.reason


def test_swapped_lines(log):
    data = lines(log)
    data[2], data[3] = data[3], data[2]
    log.write_bytes(b"".join(data))
    problem = verify_path(log).problem
    assert problem.line == 3 and "reordered" in problem.reason


def test_tail_cut_mid_line(log):
    data = log.read_bytes()
    log.write_bytes(data[:-20])
    problem = verify_path(log).problem
    assert problem.line == 7 and "truncated" in problem.reason


def test_tail_cut_at_line_boundary_is_caught_by_the_head_anchor(log, capsys):
    head = verify_path(log).head
    data = lines(log)
    log.write_bytes(b"".join(data[:-2]))
    assert verify_path(log).ok  # a keyless chain alone cannot see this ...
    assert cli("audit", "verify", "--head", head, str(log)) == 1  # ... the anchor can
    assert "cut from the end" in capsys.readouterr().out


def test_anchor_still_present_after_more_appends(log):
    head = verify_path(log).head
    write_log(log, 2)
    assert verify_path(log, head=head).ok


@pytest.mark.parametrize(
    "extra",
    [
        b'{"event":"allow","tool":"x"}\n',
        b"not json\n",
        b"\n",
    ],
)
def test_line_appended_by_hand(log, extra):
    log.write_bytes(log.read_bytes() + extra)
    problem = verify_path(log).problem
    assert problem is not None and problem.line == 8


def test_duplicated_line_appended_by_hand(log):
    data = lines(log)
    log.write_bytes(b"".join([*data, data[-1]]))
    problem = verify_path(log).problem
    assert problem.line == 8 and "reordered or duplicated" in problem.reason


def test_inserted_self_consistent_record_breaks_the_link(tmp_path, log):
    other = tmp_path / "other.jsonl"
    write_log(other, 6)
    data = lines(log)
    data[4] = lines(other)[4]  # a valid record, same seq, from another chain
    log.write_bytes(b"".join(data))
    problem = verify_path(log).problem
    assert problem.line == 5 and "replaced or inserted" in problem.reason


def test_deleted_first_lines(log):
    data = lines(log)
    log.write_bytes(b"".join(data[2:]))
    problem = verify_path(log).problem
    assert problem.line == 1 and "deleted" in problem.reason


def test_missing_file_exit_code(tmp_path, capsys):
    assert cli("audit", "verify", str(tmp_path / "nope.jsonl")) == 2
    assert "no such file" in capsys.readouterr().out
