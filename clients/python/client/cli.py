# PYTHON_ARGCOMPLETE_OK
"""The ``segstore`` command over HTTP.

Segments: ``ls``, ``info``, ``cat``, ``tail [-f]``, ``put``, ``create``,
``seal``, ``truncate``, ``rm``; what operators ask most: ``health``,
``cluster`` (which node serves each container), ``attributes``, ``writer``
(a writer id's last event number) and ``tx open|append|info|commit|abort``
(transactions). Streams (a stream is named ``SCOPE/STREAM``): ``scope
create|ls`` and ``stream create|info|ls|seal|rm|segments|successors|scale|
cut|truncate|write``.

The endpoint comes from ``--endpoint``, else ``SEGSTORE_ENDPOINT``, else
http://127.0.0.1:8080; the token from ``--token``, else ``SEGSTORE_TOKEN``.
Errors, a server that cannot be reached included, print one line on stderr
and exit with 1. Shell completion comes from argcomplete
(``eval "$(register-python-argcomplete segstore)"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any, BinaryIO

import argcomplete
import requests
from tqdm import tqdm

from client.errors import ConditionalCheckFailed, SegmentExists, SegstoreClientError, Unauthorized
from client.results import SegmentInfo
from client.segment_client import SegmentClient
from client.stream_client import StreamClient, StreamCut, StreamSegment
from client.stream_writer import StreamWriter

MiB = 1024 * 1024
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
# The server's default max_append_bytes: put never sends a larger piece.
DEFAULT_PIECE_BYTES = 8 * MiB
DEFAULT_TAIL_BYTES = 1024
TAIL_WAIT_S = 10.0

Command = Callable[[SegmentClient, argparse.Namespace, BinaryIO], int | None]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segstore", description="segstore HTTP client")
    version = f"%(prog)s {metadata.version('segstore-client')}"
    parser.add_argument("--version", action="version", version=version)
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("SEGSTORE_ENDPOINT", DEFAULT_ENDPOINT),
        help="server URL, or several comma-separated (default: $SEGSTORE_ENDPOINT or %(default)s)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("SEGSTORE_TOKEN"), help="bearer token (default: $SEGSTORE_TOKEN)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    tx_parser = commands.add_parser("tx", help="transactions: open, append (stdin), info, commit, abort")
    tx_commands = tx_parser.add_subparsers(dest="action", required=True)

    def command(
        name: str, run: Command, help: str, *names: str, under: Any = commands
    ) -> argparse.ArgumentParser:
        sub = under.add_parser(name, help=help)
        sub.set_defaults(run=run)
        for arg in names:
            sub.add_argument(arg)
        return sub

    ls = command("ls", _ls, "list segments whose names start with PREFIX")
    ls.add_argument("prefix", nargs="?", default="")
    command("info", _info, "a segment's JSON info", "name")
    command("cat", _cat, "a segment's bytes to stdout", "name")
    tail = command("tail", _tail, "the last bytes of a segment; -f follows it until sealed", "name")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument(
        "-c", "--bytes", type=int, default=DEFAULT_TAIL_BYTES, help="start this many bytes before the end"
    )
    put = command("put", _put_command, "append stdin to a segment, creating it if missing", "name")
    put.add_argument("--piece-bytes", type=int, default=DEFAULT_PIECE_BYTES, help="bytes per append")
    create = command("create", _create, "create an empty segment", "name")
    create.add_argument("--rollover-bytes", type=int, default=None, help="its Tier 2 chunk size")
    command("seal", _seal, "seal a segment: no more appends", "name")
    command("truncate", _truncate, "drop a segment's bytes below OFFSET", "name").add_argument(
        "offset", type=int
    )
    command("rm", _rm, "delete a segment", "name")
    command("health", _health, "each container's state; exit 1 unless every one serves")
    command("cluster", _cluster, "the nodes, and the node serving each container")
    attributes = command("attributes", _attributes, "a segment's attribute values (UUID keys)", "name")
    attributes.add_argument("keys", nargs="+", metavar="key")
    command("writer", _writer, "the last event number stored for a writer id", "name", "writer_id")
    command("open", _tx_open, "open a transaction of a segment; prints its id", "name", under=tx_commands)
    command("append", _tx_append, "append stdin to a transaction", "name", "txid", under=tx_commands)
    command("info", _tx_info, "a transaction's JSON info", "name", "txid", under=tx_commands)
    command("commit", _tx_commit, "merge it at the end of its segment", "name", "txid", under=tx_commands)
    command("abort", _tx_abort, "drop a transaction and its bytes", "name", "txid", under=tx_commands)
    scopes = commands.add_parser("scope", help="scopes of streams")
    scope_commands = scopes.add_subparsers(dest="action", required=True)
    command("create", _scope_create, "create a scope", "scope", under=scope_commands)
    command("ls", _scope_ls, "list the scopes", under=scope_commands)
    streams = commands.add_parser("stream", help="streams of parallel segments (SCOPE/STREAM)")
    stream_commands = streams.add_subparsers(dest="action", required=True)

    def stream_command(name: str, run: Command, help: str) -> argparse.ArgumentParser:
        sub = command(name, run, help, under=stream_commands)
        sub.add_argument("stream", type=_scope_stream, help="SCOPE/STREAM")
        return sub

    create_stream = stream_command("create", _stream_create, "create a stream")
    create_stream.add_argument("--segments", type=int, default=None)
    create_stream.add_argument("--policy", choices=("fixed", "events_per_s", "kbytes_per_s"), default=None)
    create_stream.add_argument("--target", type=float, default=None, help="target rate per segment")
    create_stream.add_argument("--factor", type=int, default=None, help="most parts a split makes")
    create_stream.add_argument("--min-segments", type=int, default=None)
    command("ls", _stream_ls, "list the streams of SCOPE", "scope", under=stream_commands)
    stream_command("info", _stream_info, "a stream's description")
    stream_command("seal", _stream_seal, "seal a stream")
    stream_command("rm", _stream_rm, "delete a sealed stream")
    stream_command("segments", _stream_segments, "the segments of the current epoch").add_argument(
        "--epoch", type=int, default=None
    )
    followers = stream_command("successors", _stream_successors, "the segments that replaced a sealed one")
    followers.add_argument("segment", type=int)
    scale = stream_command("scale", _stream_scale, "seal segments, create successors on new key ranges")
    scale.add_argument("--seal", required=True, help="segment ids, comma-separated")
    scale.add_argument("--ranges", required=True, help="lo:hi key ranges, comma-separated (0:0.5,0.5:1)")
    stream_command("cut", _stream_cut, "the head or tail stream cut, as JSON").add_argument(
        "--at", choices=("head", "tail"), default="tail"
    )
    truncate_stream = stream_command("truncate", _stream_truncate, "delete what lies before a cut (JSON)")
    truncate_stream.add_argument("cut", help="a cut as `stream cut` prints it")
    stream_command("write", _stream_write, "write each line of stdin as one event").add_argument(
        "--key", default=None, help="routing key of every event (default: random per event)"
    )
    return parser


def _print_json(out: BinaryIO, value: Any) -> None:
    out.write((json.dumps(value, indent=2) + "\n").encode())


def _print_info(out: BinaryIO, info: SegmentInfo) -> None:
    _print_json(out, dataclasses.asdict(info))


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


def _ls(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    for info in client.list(args.prefix):
        sealed = "sealed" if info.sealed else "open"
        out.write(f"{info.name}\t{info.length}\t{sealed}\n".encode())


def _info(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_info(out, client.info(args.name))


def _cat(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _copy(client, args.name, None, out, follow=False)


def _tail(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    info = client.info(args.name)
    start = max(info.start_offset, info.length - max(args.bytes, 0))
    _copy(client, args.name, start, out, follow=args.follow)


def _put_command(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _put(client, args.name, sys.stdin.buffer, args.piece_bytes)


def _create(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_info(out, client.create(args.name, rollover_bytes=args.rollover_bytes))


def _seal(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_info(out, client.seal(args.name))


def _truncate(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_info(out, client.truncate(args.name, args.offset))


def _rm(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    client.delete(args.name)


def _health(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> int:
    serving, body = client.health()
    for container in body["containers"]:
        reason = f"\t{container['reason']}" if container.get("reason") else ""
        out.write(f"container {container['id']}\t{container['state']}{reason}\n".encode())
    out.write(f"{body['status']}\n".encode())
    return 0 if serving else 1


def _cluster(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    view = client.cluster()
    if view["node"] is None:
        out.write(f"a single node with {view['container_count']} containers\n".encode())
        return
    out.write(f"answered by node {view['node']}\n".encode())
    for node in view["nodes"]:
        out.write(f"node {node['id']}\t{node['url']}\n".encode())
    for container in view["containers"]:
        owner = container["owner"] or "(none: moving)"
        out.write(f"container {container['id']}\t{owner}\n".encode())


def _attributes(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, client.get_attributes(args.name, args.keys))


def _writer(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, client.writer_event_number(args.name, args.writer_id))


def _tx_open(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    out.write(f"{client.open_transaction(args.name)}\n".encode())


def _tx_append(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    result = client.append_transaction(args.name, args.txid, sys.stdin.buffer.read())
    _print_json(out, {"offset": result.offset, "length": result.length})


def _tx_info(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, client.transaction_info(args.name, args.txid))


def _tx_commit(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    result = client.commit_transaction(args.name, args.txid)
    _print_json(out, {"offset": result.offset, "length": result.length})


def _tx_abort(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    client.abort_transaction(args.name, args.txid)


def _scope_stream(text: str) -> tuple[str, str]:
    scope, slash, stream = text.partition("/")
    if not slash or not scope or not stream:
        raise argparse.ArgumentTypeError(f"name a stream as SCOPE/STREAM, got {text!r}")
    return scope, stream


def _named(args: argparse.Namespace) -> tuple[str, str]:
    """The (scope, stream) a stream verb names (``SCOPE/STREAM``, split by the parser)."""
    scope, stream = args.stream
    return scope, stream


def _scope_create(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    StreamClient(client).create_scope(args.scope)


def _scope_ls(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    out.write("".join(f"{scope}\n" for scope in StreamClient(client).scopes()).encode())


def _stream_create(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    options = {"type": args.policy, "target": args.target, "factor": args.factor}
    options["min_segments"] = args.min_segments
    scaling = {k: v for k, v in options.items() if v is not None} or None
    made = StreamClient(client).create_stream(*_named(args), segments=args.segments, scaling=scaling)
    _print_json(out, made)


def _stream_ls(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    out.write("".join(f"{name}\n" for name in StreamClient(client).streams(args.scope)).encode())


def _stream_info(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, StreamClient(client).stream(*_named(args)))


def _stream_seal(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, StreamClient(client).seal(*_named(args)))


def _stream_rm(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    StreamClient(client).delete(*_named(args))


def _print_segments(out: BinaryIO, head: str, segments: list[StreamSegment]) -> None:
    out.write(head.encode())
    out.write("".join(f"{s.id}\t{s.name}\t[{s.key_lo}, {s.key_hi})\n" for s in segments).encode())


def _stream_segments(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    epoch, found = StreamClient(client).segments(*_named(args), args.epoch)
    _print_segments(out, f"epoch {epoch}\n", found)


def _stream_successors(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    found, sealed = StreamClient(client).successors(*_named(args), args.segment)
    out.write(f"sealed {str(sealed).lower()}\n".encode())
    for s in found:
        before = ",".join(map(str, s.predecessors))
        out.write(f"{s.id}\t{s.name}\t[{s.key_lo}, {s.key_hi})\tafter {before}\n".encode())


def _stream_scale(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    seal = [int(part) for part in args.seal.split(",")]
    bounds = [part.partition(":") for part in args.ranges.split(",")]
    ranges = [(float(lo), float(hi)) for lo, _, hi in bounds]
    epoch, made = StreamClient(client).scale(*_named(args), seal, ranges)
    _print_segments(out, f"epoch {epoch}\n", made)


def _stream_cut(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, StreamClient(client).cut(*_named(args), args.at).to_json())


def _stream_truncate(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    cut = StreamCut.from_json({"epoch": 0, **json.loads(args.cut)})
    _print_json(out, StreamClient(client).truncate(*_named(args), cut).to_json())


def _stream_write(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    with StreamWriter(client, *_named(args)) as writer:
        for line in sys.stdin.buffer:
            writer.write(line.rstrip(b"\n"), args.key)


def _explained(err: SegstoreClientError, token: str | None) -> str:
    """The error's line, with what to do where the fix is on this side (a token)."""
    if isinstance(err, Unauthorized):
        if token is None:
            return f"{err} (auth is on: give a token with --token or SEGSTORE_TOKEN)"
        return f"{err} (the token of --token or SEGSTORE_TOKEN is not one the server knows)"
    return str(err)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    parser = _parser()
    argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    with SegmentClient(args.endpoint, token=args.token) as client:
        try:
            return args.run(client, args, out) or 0
        except SegstoreClientError as err:
            print(f"segstore: {_explained(err, args.token)}", file=sys.stderr)
            return 1
        except requests.RequestException as err:
            print(f"segstore: cannot reach {args.endpoint}: {type(err).__name__}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            out.flush()
