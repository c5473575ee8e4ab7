"""The ``segstore group`` verbs: reader groups (SCOPE/GROUP) over the streams of a scope.

``create`` (``--streams``, ``--start``, ``--lease``), ``info``, ``rm``,
``read`` (one reader: each event's payload on a line, until ``--count``
events or, without it, until a fetch brings none), ``checkpoint`` (starts
one and prints its cuts once the readers reached it) and ``reset`` (to a
checkpoint's cuts as ``checkpoint`` prints them, or ``head``/``tail``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from client.reader_group import ReaderGroup
from client.segment_client import SegmentClient
from client.stream_client import StreamCut

Command = Callable[[SegmentClient, argparse.Namespace, BinaryIO], "int | None"]
CHECKPOINT_POLL_S = 0.2


def _scope_group(text: str) -> tuple[str, str]:
    scope, slash, group = text.partition("/")
    if not slash or not scope or not group:
        raise argparse.ArgumentTypeError(f"name a reader group as SCOPE/GROUP, got {text!r}")
    return scope, group


def add_commands(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``group`` and its verbs to the ``segstore`` parser's ``commands``."""
    groups = commands.add_parser("group", help="reader groups (SCOPE/GROUP)")
    group_commands = groups.add_subparsers(dest="action", required=True)

    def group_command(name: str, run: Command, help: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = command(name, run, help, under=group_commands)
        sub.add_argument("group", type=_scope_group, help="SCOPE/GROUP")
        return sub

    create = group_command("create", _create, "create a reader group over streams of the scope")
    create.add_argument("--streams", required=True, help="stream names, comma-separated")
    create.add_argument("--start", choices=("head", "tail"), default="head")
    create.add_argument("--lease", type=float, default=None, help="seconds a reader stays live unheard")
    group_command("info", _info, "the group's readers, segments, positions and lag")
    group_command("rm", _rm, "delete the group")
    read = group_command("read", _read, "read events as one reader, a line each")
    read.add_argument("--reader", required=True, help="the reader's id")
    read.add_argument("--count", type=int, default=None, help="stop after this many (default: when idle)")
    read.add_argument("--wait", type=float, default=1.0, help="seconds a fetch waits for events")
    checkpoint = group_command("checkpoint", _checkpoint, "start a checkpoint; print its cuts once complete")
    checkpoint.add_argument("--timeout", type=float, default=60.0)
    group_command("reset", _reset, "start the group again at cuts (JSON), head or tail").add_argument("cuts")


def _group(client: SegmentClient, args: argparse.Namespace) -> ReaderGroup:
    scope, group = args.group
    return ReaderGroup(client, scope, group)


def _print_json(out: BinaryIO, value: Any) -> None:
    out.write((json.dumps(value, indent=2) + "\n").encode())


def _create(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    streams = [s for s in args.streams.split(",") if s]
    _print_json(out, _group(client, args).create(streams, start=args.start, lease_s=args.lease))


def _info(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _print_json(out, _group(client, args).state())


def _rm(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    _group(client, args).delete()


def _read(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    count = 0
    with _group(client, args).reader(args.reader, wait_s=args.wait) as reader:
        while args.count is None or count < args.count:
            reached = len(reader.checkpoints)
            events = reader.fetch()
            if not events and args.count is None and len(reader.checkpoints) == reached:
                return
            for event in events[: None if args.count is None else args.count - count]:
                out.write(event.data + b"\n")
                count += 1
            out.flush()


def _checkpoint(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> int:
    group = _group(client, args)
    checkpoint = group.checkpoint()
    deadline = time.monotonic() + args.timeout
    while (cuts := group.checkpoint_cuts(checkpoint)) is None:
        if time.monotonic() > deadline:
            out.write(f"checkpoint {checkpoint} is still waiting for readers\n".encode())
            return 1
        time.sleep(CHECKPOINT_POLL_S)
    _print_json(out, {stream: cut.to_json() for stream, cut in cuts.items()})
    return 0


def _reset(client: SegmentClient, args: argparse.Namespace, out: BinaryIO) -> None:
    if args.cuts in ("head", "tail"):
        target: str | dict[str, StreamCut] = args.cuts
    else:
        target = {stream: StreamCut.from_json(cut) for stream, cut in json.loads(args.cuts).items()}
    _print_json(out, _group(client, args).reset(target))
