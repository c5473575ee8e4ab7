"""The ``segstore`` command over HTTP: ``ls``, ``info``, ``cat``, ``tail [-f]``, ``put``,
``create``, ``seal``, ``truncate`` and ``rm``.

The endpoint comes from ``--endpoint``, else ``SEGSTORE_ENDPOINT``, else
http://127.0.0.1:8080. Errors, a server that cannot be reached included,
print one line on stderr and exit with 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import BinaryIO

import requests
from tqdm import tqdm

from client.errors import ConditionalCheckFailed, SegmentExists, SegstoreClientError
from client.results import SegmentInfo
from client.segment_client import SegmentClient

MiB = 1024 * 1024
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
# The server's default max_append_bytes: put never sends a larger piece.
DEFAULT_PIECE_BYTES = 8 * MiB
DEFAULT_TAIL_BYTES = 1024
TAIL_WAIT_S = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segstore", description="segstore HTTP client")
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("SEGSTORE_ENDPOINT", DEFAULT_ENDPOINT),
        help="server URL, or several comma-separated (default: $SEGSTORE_ENDPOINT or %(default)s)",
    )
    parser.add_argument("--token", default=os.environ.get("SEGSTORE_TOKEN"), help="bearer token")
    commands = parser.add_subparsers(dest="command", required=True)
    ls = commands.add_parser("ls", help="list segments whose names start with PREFIX")
    ls.add_argument("prefix", nargs="?", default="")
    commands.add_parser("info", help="a segment's JSON info").add_argument("name")
    commands.add_parser("cat", help="a segment's bytes to stdout").add_argument("name")
    tail = commands.add_parser("tail", help="the last bytes of a segment; -f follows it until sealed")
    tail.add_argument("name")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument(
        "-c", "--bytes", type=int, default=DEFAULT_TAIL_BYTES, help="start this many bytes before the end"
    )
    put = commands.add_parser("put", help="append stdin to a segment, creating it if missing")
    put.add_argument("name")
    put.add_argument("--piece-bytes", type=int, default=DEFAULT_PIECE_BYTES, help="bytes per append")
    create = commands.add_parser("create", help="create an empty segment")
    create.add_argument("name")
    create.add_argument("--rollover-bytes", type=int, default=None, help="its Tier 2 chunk size")
    commands.add_parser("seal", help="seal a segment: no more appends").add_argument("name")
    truncate = commands.add_parser("truncate", help="drop a segment's bytes below OFFSET")
    truncate.add_argument("name")
    truncate.add_argument("offset", type=int)
    commands.add_parser("rm", help="delete a segment").add_argument("name")
    return parser


def _copy(client: SegmentClient, name: str, offset: int | None, out: BinaryIO, *, follow: bool) -> None:
    """Write the segment's bytes from ``offset`` to ``out``; with ``follow``, until it is sealed."""
    while True:
        result = client.read(name, offset, wait_s=TAIL_WAIT_S if follow else None)
        if result.data:
            out.write(result.data)
            out.flush()
        elif result.at_sealed_end or not follow:
            return
        offset = result.next_offset


def _stdin_size(stdin: BinaryIO) -> int | None:
    """The size of stdin when it is a regular file, else ``None``."""
    try:
        stat = os.fstat(stdin.fileno())
    except (OSError, ValueError):
        return None
    return stat.st_size if stat.st_size > 0 else None


def _put(client: SegmentClient, name: str, stdin: BinaryIO, piece_bytes: int) -> None:
    """Append stdin in pieces, each with ``Expected-Offset``.

    A piece whose answer was lost is retried by the client; if the first try
    had landed, the retry fails with 412 and the piece is read back to confirm
    it is there.
    """
    try:
        offset = client.create(name).length
    except SegmentExists:
        offset = client.info(name).length
    total = _stdin_size(stdin)
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=name,
        file=sys.stderr,
        disable=total is not None and total <= piece_bytes,
    ) as progress:
        while piece := stdin.read(piece_bytes):
            try:
                client.append(name, piece, expected_offset=offset)
            except ConditionalCheckFailed:
                if client.read(name, offset, len(piece)).data != piece:
                    raise
            offset += len(piece)
            progress.update(len(piece))


def _print_info(out: BinaryIO, info: SegmentInfo) -> None:
    out.write((json.dumps(dataclasses.asdict(info), indent=2) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    args = _parser().parse_args(argv)
    out = sys.stdout.buffer
    with SegmentClient(args.endpoint, token=args.token) as client:
        try:
            if args.command == "ls":
                for info in client.list(args.prefix):
                    sealed = "sealed" if info.sealed else "open"
                    out.write(f"{info.name}\t{info.length}\t{sealed}\n".encode())
            elif args.command == "info":
                _print_info(out, client.info(args.name))
            elif args.command == "cat":
                _copy(client, args.name, None, out, follow=False)
            elif args.command == "tail":
                info = client.info(args.name)
                start = max(info.start_offset, info.length - max(args.bytes, 0))
                _copy(client, args.name, start, out, follow=args.follow)
            elif args.command == "put":
                _put(client, args.name, sys.stdin.buffer, args.piece_bytes)
            elif args.command == "create":
                _print_info(out, client.create(args.name, rollover_bytes=args.rollover_bytes))
            elif args.command == "seal":
                _print_info(out, client.seal(args.name))
            elif args.command == "truncate":
                _print_info(out, client.truncate(args.name, args.offset))
            elif args.command == "rm":
                client.delete(args.name)
        except SegstoreClientError as err:
            print(f"segstore: {err}", file=sys.stderr)
            return 1
        except requests.RequestException as err:
            print(f"segstore: cannot reach {args.endpoint}: {type(err).__name__}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            out.flush()
    return 0
