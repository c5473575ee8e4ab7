"""The ``segstore`` command over HTTP: ``ls``, ``info``, ``cat``, ``tail [-f]``, ``put``,
``create``, ``seal``, ``truncate`` and ``rm`` on segments; ``scope`` and ``stream`` verbs on
streams (docs/api.md "Streams"): ``scope create|ls``, ``stream create|info|ls|seal|rm|segments|
successors|scale|cut|truncate|write``.

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
from client.segment_client import SegmentClient, SegmentInfo
from client.stream_client import StreamClient, StreamCut
from client.stream_writer import StreamWriter

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
    _stream_parsers(commands)
    return parser


def _stream_parsers(commands: argparse._SubParsersAction) -> None:
    """``scope ...`` and ``stream ...``: the stream API's verbs; a stream is named SCOPE/STREAM."""
    scope = commands.add_parser("scope", help="scopes of streams").add_subparsers(dest="verb", required=True)
    scope.add_parser("create", help="create a scope").add_argument("scope")
    scope.add_parser("ls", help="list the scopes")
    stream = commands.add_parser("stream", help="streams of parallel segments").add_subparsers(
        dest="verb", required=True
    )
    create = stream.add_parser("create", help="create a stream SCOPE/STREAM")
    create.add_argument("stream")
    create.add_argument("--segments", type=int, default=None)
    create.add_argument("--policy", choices=("fixed", "events_per_s", "kbytes_per_s"), default=None)
    create.add_argument("--target", type=float, default=None, help="target rate per segment")
    create.add_argument("--factor", type=int, default=None, help="most parts a split makes")
    create.add_argument("--min-segments", type=int, default=None)
    stream.add_parser("ls", help="list the streams of SCOPE").add_argument("scope")
    simple = (("info", "a stream's description"), ("seal", "seal a stream"), ("rm", "delete a sealed stream"))
    for verb, what in simple:
        stream.add_parser(verb, help=what).add_argument("stream")
    segments = stream.add_parser("segments", help="the segments of the current epoch (or --epoch)")
    segments.add_argument("stream")
    segments.add_argument("--epoch", type=int, default=None)
    successors = stream.add_parser("successors", help="the segments that replaced a sealed one")
    successors.add_argument("stream")
    successors.add_argument("segment", type=int)
    scale = stream.add_parser("scale", help="seal segments and create successors on new key ranges")
    scale.add_argument("stream")
    scale.add_argument("--seal", required=True, help="segment ids, comma-separated")
    scale.add_argument("--ranges", required=True, help="lo:hi key ranges, comma-separated (0:0.5,0.5:1)")
    cut = stream.add_parser("cut", help="the head or tail stream cut, as JSON")
    cut.add_argument("stream")
    cut.add_argument("--at", choices=("head", "tail"), default="tail")
    truncate = stream.add_parser("truncate", help="delete what lies before a cut (JSON, as cut prints it)")
    truncate.add_argument("stream")
    truncate.add_argument("cut")
    write = stream.add_parser("write", help="write each line of stdin as one event")
    write.add_argument("stream")
    write.add_argument("--key", default=None, help="routing key of every event (default: random per event)")


def _scope_stream(text: str) -> tuple[str, str]:
    scope, slash, stream = text.partition("/")
    if not slash or not scope or not stream:
        raise argparse.ArgumentTypeError(f"name a stream as SCOPE/STREAM, got {text!r}")
    return scope, stream


def _print_json(out: BinaryIO, doc: object) -> None:
    out.write((json.dumps(doc, indent=2) + "\n").encode())


def _scope_command(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    streams = StreamClient(client)
    if args.verb == "create":
        streams.create_scope(args.scope)
    else:
        out.write("".join(f"{scope}\n" for scope in streams.scopes()).encode())


def _stream_command(client: SegmentClient, args: argparse.Namespace, stdin: BinaryIO, out: BinaryIO) -> None:
    streams = StreamClient(client)
    if args.verb == "ls":
        out.write("".join(f"{name}\n" for name in streams.streams(args.scope)).encode())
        return
    scope, stream = _scope_stream(args.stream)
    if args.verb == "create":
        options = {"type": args.policy, "target": args.target, "factor": args.factor,
                   "min_segments": args.min_segments}
        scaling = {k: v for k, v in options.items() if v is not None}
        made = streams.create_stream(scope, stream, segments=args.segments, scaling=scaling or None)
        _print_json(out, made)
    elif args.verb == "info":
        _print_json(out, streams.stream(scope, stream))
    elif args.verb == "seal":
        _print_json(out, streams.seal(scope, stream))
    elif args.verb == "rm":
        streams.delete(scope, stream)
    elif args.verb == "segments":
        epoch, found = streams.segments(scope, stream, args.epoch)
        out.write(f"epoch {epoch}\n".encode())
        out.write("".join(f"{s.id}\t{s.name}\t[{s.key_lo}, {s.key_hi})\n" for s in found).encode())
    elif args.verb == "successors":
        found, sealed = streams.successors(scope, stream, args.segment)
        out.write(f"sealed {str(sealed).lower()}\n".encode())
        for s in found:
            before = ",".join(map(str, s.predecessors))
            out.write(f"{s.id}\t{s.name}\t[{s.key_lo}, {s.key_hi})\tafter {before}\n".encode())
    elif args.verb == "scale":
        seal = [int(part) for part in args.seal.split(",")]
        bounds = [part.partition(":") for part in args.ranges.split(",")]
        epoch, made = streams.scale(scope, stream, seal, [(float(lo), float(hi)) for lo, _, hi in bounds])
        out.write(f"epoch {epoch}\n".encode())
        out.write("".join(f"{s.id}\t{s.name}\t[{s.key_lo}, {s.key_hi})\n" for s in made).encode())
    elif args.verb == "cut":
        _print_json(out, streams.cut(scope, stream, args.at).to_json())
    elif args.verb == "truncate":
        cut = StreamCut.from_json({"epoch": 0, **json.loads(args.cut)})
        _print_json(out, streams.truncate(scope, stream, cut).to_json())
    else:
        with StreamWriter(client, scope, stream) as writer:
            for line in stdin:
                writer.write(line.rstrip(b"\n"), args.key)


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
            elif args.command == "scope":
                _scope_command(client, args, out)
            else:
                _stream_command(client, args, sys.stdin.buffer, out)
        except SegstoreClientError as err:
            print(f"segstore: {err}", file=sys.stderr)
            return 1
        except argparse.ArgumentTypeError as err:
            print(f"segstore: {err}", file=sys.stderr)
            return 2
        except requests.RequestException as err:
            print(f"segstore: cannot reach {args.endpoint}: {type(err).__name__}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            out.flush()
    return 0
