"""A reader of a reader group in a process of its own, for the tests that kill or stop it.

``python -m tests.scopes.group_reader URL SCOPE GROUP READER OUT [--exit-when-fenced]`` reads
with a ``StreamReader`` and writes one JSON line per event to OUT, flushed
after each fetch: ``{"r": reader, "g": generation, "s": segment, "o":
offset, "d": payload, "t": time.time()}``; a fence is a line ``{"r",
"fenced": generation, "t"}``, and a checkpoint reached ``{"r",
"checkpoint": id, "t"}``. With ``--exit-when-fenced`` it exits (status 3)
at its first fence instead of joining again.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from client.errors import ReaderFenced
from client.reader_group import ReaderGroup, StreamReader
from client.segment_client import SegmentClient


def _run(reader: StreamReader, out: TextIO, exit_when_fenced: bool) -> int:
    name = reader.reader_id
    reader.on_checkpoint = lambda cid: out.write(
        json.dumps({"r": name, "checkpoint": cid, "t": time.time()}) + "\n"
    )
    reader.join()
    while True:
        generation = reader.generation
        try:
            if exit_when_fenced:
                reader.commit()
                events = reader._fetch()
            else:
                fences = reader.fences
                events = reader.fetch()
                if reader.fences != fences:
                    out.write(json.dumps({"r": name, "fenced": generation, "t": time.time()}) + "\n")
        except ReaderFenced:
            out.write(json.dumps({"r": name, "fenced": generation, "t": time.time()}) + "\n")
            out.flush()
            return 3
        at = time.time()
        for event in events:
            line = {"r": name, "g": reader.generation, "s": event.segment, "o": event.offset}
            out.write(json.dumps({**line, "d": event.data.decode(), "t": at}) + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    url, scope, group, reader_id, out_path = argv[:5]
    client = SegmentClient(url, retries=2, backoff_s=0.05)
    reader = ReaderGroup(client, scope, group).reader(reader_id, wait_s=0.5)
    with open(out_path, "a", encoding="utf-8") as out:
        return _run(reader, out, "--exit-when-fenced" in argv[5:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
