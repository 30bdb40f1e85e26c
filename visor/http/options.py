"""`visor run --url URL [--header 'Name: value']...`: the options read into an upstream config.

Checked before the session starts, so a bad URL, a bad header or a missing ``${VAR}`` is one
clear line on stderr and exit status 2, as for any other bad option.
"""

from __future__ import annotations

import argparse
import os

from visor.http.headers import parse_headers
from visor.http.target import check_url, display_url
from visor.http.upstream import HttpUpstreamConfig


def upstream_config(args: argparse.Namespace, command: list[str]) -> tuple[HttpUpstreamConfig, list[str]]:
    """The upstream to use, and the argv the audit log and policy see in place of a command."""
    if args.url is None:
        raise ValueError("--header is only for an HTTP server given with --url")
    if command:
        raise ValueError("give either --url or a server command after --, not both")
    url = check_url(args.url)
    headers = parse_headers(args.header, os.environ)
    config = HttpUpstreamConfig(url, headers=headers, max_body_bytes=args.max_message_bytes,
                                max_event_bytes=args.max_message_bytes)  # fmt: skip
    return config, [display_url(url)]
