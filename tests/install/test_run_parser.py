"""`visor run` builds only its own parser (start-up time): it must accept exactly what the full one does."""

from __future__ import annotations

import argparse

from visor.cli import build_parser


def _run_options(parser: argparse.ArgumentParser) -> dict[str, tuple[object, object]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {opt: (a.dest, a.default) for a in run._actions for opt in a.option_strings}


def test_the_run_only_parser_has_every_option_of_visor_run_in_the_full_parser() -> None:
    full, alone = _run_options(build_parser()), _run_options(build_parser(run_only=True))
    assert "--signing-key" in full  # registered by another module than cli.py
    assert alone == full


def test_the_run_only_parser_reads_a_command_line_as_the_full_one_does() -> None:
    argv = ["-q", "run", "--audit-log", "/tmp/a.jsonl", "--checkpoint-every", "5", "--", "srv", "--flag"]
    assert vars(build_parser(run_only=True).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_the_run_only_parser_builds_no_other_command() -> None:
    # The other commands' parsers (audit, report...) cost start-up time and `visor run` never uses them.
    alone = build_parser(run_only=True)
    sub = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["run"]
