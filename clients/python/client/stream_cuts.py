"""Reading a stream between two stream cuts: which segment ranges, in which order, and the next cut.

A stream's segments form a lineage (docs/api.md "Streams"): a scale seals
segments and creates successors, each naming its predecessors. Every event
of one routing key lies in one segment between two scalings, so its events
are in order when a segment's events come after those of all its
predecessors. Segment ids grow over a stream's life, so ascending ids are
such an order.

- ``ranges_between(lineage, start, end)``: for every segment with events
  between two cuts, ``[from, to)``, found by walking successors from
  ``start``'s segments until ``end``'s; and which segments share a lineage
  (the groups a reader reads one after another to keep per-key order).
- ``advance(lineage, start, cap)``: the end of the next micro-batch from
  ``start``: each segment of ``start`` at its length (at most ``cap``'s
  offset), and a sealed segment that ``start`` already holds at its end
  replaced by its successors (a merge's successor once every predecessor
  is). A successor is entered only after its predecessors were read to
  their ends in earlier micro-batches, so within one micro-batch no two
  segments with events are predecessor and successor: one input partition
  per segment keeps per-key order, and consecutive micro-batches do the rest.

``Lineage`` answers the questions over HTTP, remembering the answers of one
planning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from client.results import SegmentInfo
from client.segment_client import SegmentClient
from client.stream_client import StreamClient, StreamCut, StreamSegment


@dataclass
class Lineage:
    """A stream's segments as one planning sees them: infos and successors, each asked once."""

    client: SegmentClient
    scope: str
    stream: str
    _infos: dict[int, SegmentInfo] = field(default_factory=dict)
    _successors: dict[int, list[StreamSegment]] = field(default_factory=dict)

    def name(self, segment_id: int) -> str:
        """The native name of a data segment (docs/api.md "Streams", Names)."""
        return f"{self.scope}/{self.stream}/{segment_id}"

    def info(self, segment_id: int) -> SegmentInfo:
        if segment_id not in self._infos:
            self._infos[segment_id] = self.client.info(self.name(segment_id))
        return self._infos[segment_id]

    def successors(self, segment_id: int) -> list[StreamSegment]:
        if segment_id not in self._successors:
            found, _ = StreamClient(self.client).successors(self.scope, self.stream, segment_id)
            self._successors[segment_id] = found
        return self._successors[segment_id]

    def epoch_of(self, segment_id: int, since: int) -> int:
        """The epoch that created ``segment_id`` (looked for from epoch ``since`` on)."""
        streams = StreamClient(self.client)
        current = streams.stream(self.scope, self.stream)["epoch"]
        for epoch in range(since, current + 1):
            _, segments = streams.segments(self.scope, self.stream, epoch)
            if any(s.id == segment_id for s in segments):
                return epoch
        return current


def parse_cut(text: str) -> StreamCut:
    """A cut given as JSON ``{"epoch": E, "positions": {"id": offset}}`` (as ``GET .../cut`` answers)."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("positions"), dict):
        raise ValueError(f'a stream cut is JSON {{"epoch": E, "positions": {{"id": offset}}}}, not {text!r}')
    return StreamCut(int(doc.get("epoch", 0)), {int(k): int(v) for k, v in doc["positions"].items()})


@dataclass(frozen=True)
class SegmentRange:
    """``[start, end)`` of data segment ``segment_id`` to read."""

    segment_id: int
    start: int
    end: int


def ranges_between(lineage: Lineage, start: StreamCut, end: StreamCut) -> list[list[SegmentRange]]:
    """The non-empty ranges between the cuts, grouped by lineage, each group in ascending segment id.

    Segments of ``end`` are read up to their offsets; a segment reached that
    ``end`` does not hold lies before it, so it is sealed and read whole.
    """
    parent: dict[int, int] = {}

    def root(sid: int) -> int:
        while parent.setdefault(sid, sid) != sid:
            sid = parent[sid]
        return sid

    found: dict[int, SegmentRange] = {}
    frontier = sorted(start.positions)
    while frontier:
        sid = frontier.pop()
        if sid in found:
            continue
        info = lineage.info(sid)
        begin = max(start.positions.get(sid, 0), info.start_offset)
        if sid in end.positions:
            found[sid] = SegmentRange(sid, begin, end.positions[sid])
            root(sid)
            continue
        if not info.sealed:
            raise ValueError(f"segment {sid} is neither in the end cut nor sealed: the cuts are reversed")
        found[sid] = SegmentRange(sid, begin, info.length)
        for successor in lineage.successors(sid):
            if any(p in end.positions for p in successor.predecessors if p != sid):
                continue  # born of a segment the end cut still holds: after the end
            parent[root(successor.id)] = root(sid)
            if successor.id not in found:
                frontier.append(successor.id)
    groups: dict[int, list[SegmentRange]] = {}
    for sid in sorted(found):
        if found[sid].end > found[sid].start:
            groups.setdefault(root(sid), []).append(found[sid])
    return list(groups.values())


def advance(lineage: Lineage, start: StreamCut, cap: StreamCut | None = None) -> StreamCut:
    """The end of the micro-batch that starts at ``start`` (see the module doc).

    ``cap`` (Trigger.AvailableNow's tail when it began) bounds it: offsets at
    most ``cap``'s, and no segment born after ``cap`` is entered.
    """
    newest = max(cap.positions) if cap is not None else None

    def available(sid: int) -> int:
        length = lineage.info(sid).length
        return length if cap is None or sid not in cap.positions else min(length, cap.positions[sid])

    done = {
        sid
        for sid, offset in start.positions.items()
        if lineage.info(sid).sealed and offset >= lineage.info(sid).length
    }
    positions = {sid: max(offset, available(sid)) for sid, offset in start.positions.items()}
    entered: list[int] = []
    for sid in sorted(done):
        if sid not in positions:
            continue  # replaced with a neighbour it merged with
        sealed, born = _scale_of(lineage, sid)
        if not born or not sealed <= done or (newest is not None and max(born) > newest):
            continue
        for predecessor in sealed:
            positions.pop(predecessor, None)
        for successor in born:
            positions[successor] = available(successor)
        entered += born
    epoch = start.epoch if not entered else lineage.epoch_of(max(entered), start.epoch)
    return StreamCut(epoch, dict(sorted(positions.items())))


def _scale_of(lineage: Lineage, segment_id: int) -> tuple[set[int], set[int]]:
    """(the segments sealed, the segments created) by the scale that sealed ``segment_id``.

    Found by closing over successors and their predecessors, so a scale that
    re-cuts several neighbours is taken whole.
    """
    sealed: set[int] = {segment_id}
    born: set[int] = set()
    while True:
        more = {s.id: s for p in sealed for s in lineage.successors(p)}
        grown = sealed | {p for s in more.values() for p in s.predecessors}
        if more.keys() <= born and grown == sealed:
            return sealed, born
        sealed, born = grown, born | more.keys()
