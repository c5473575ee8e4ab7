"""SegmentStore: the engine's front door (seed 000 "Segment Containers").

It validates names, routes each segment to one of ``container_count``
containers by a stable hash and passes each request to its container:
segments, attributes, transactions, merges and forks, and the operations
that span containers (``cross_container``) or nodes (``cluster_wide``).
Which containers run here, and their lifecycle, is ``ContainerHosting``
(``engine/store/hosting.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from engine.container.composite import Step, StepResult, names_of
from engine.errors import InvalidArgument
from engine.metadata.attribute_updates import AttributeUpdate
from engine.naming import container_for, parent_of, transaction_name, validate_name
from engine.store import cross_container
from engine.store.hosting import ContainerHosting
from engine.types import AppendResult, MergeResult, ReadResult, SegmentInfo


class SegmentStore(ContainerHosting):
    """All segments of one data directory. Thread-safe; blocking calls are cooperative under gevent."""

    # --------------------------------------------------------------- operations
    def create(self, name: str, *, rollover_bytes: int | None = None) -> SegmentInfo:
        """Create an empty segment. Raises SegmentExists if the name is taken."""
        return self._container(name).create(name, rollover_bytes=rollover_bytes)

    def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | None = None,
        event_number: int | None = None,
        event_count: int = 1,
        attributes: Sequence[AttributeUpdate] = (),
        previous_event_number: int | None = None,
    ) -> AppendResult:
        """Append ``data`` atomically; returns once it is durable in Tier 1.

        ``expected_offset``: append only if the length equals it (else
        ConditionalCheckFailed). ``writer_id`` + ``event_number``: append only
        if ``event_number`` is greater than the writer's stored one; otherwise
        the result is a duplicate and nothing is stored. With them,
        ``previous_event_number`` (seed 001's conditional append): append only
        if the writer's stored number is exactly that one, else
        EventNumberMismatch naming it (a duplicate is still a duplicate), so
        batches pipelined on several connections never land out of order.
        ``attributes`` are updated atomically with the append: if one's
        condition fails, nothing is appended (ConditionalCheckFailed naming the key).
        """
        return self._container(name).append(
            name,
            data,
            expected_offset=expected_offset,
            writer_id=writer_id,
            event_number=event_number,
            event_count=event_count,
            attributes=attributes,
            previous_event_number=previous_event_number,
        )

    def composite(self, steps: Sequence[Step], *, anywhere: bool = False) -> list[StepResult]:
        """Apply ``steps`` (segments of one container) as one composite operation.

        Judged together (every step's conditions hold, or nothing is applied
        and the refused step's error says which, in ``step``), written as one
        log entry, applied together (a reader sees all of it or none of it)
        and answered once: each step with the state its own change left
        (engine/container/composite.py). A crash leaves all of it or none of it.
        ``anywhere``: on a cluster node, a container another node serves
        takes the composite through that node (one call; no rendered appends).
        """
        if not steps:
            raise InvalidArgument("a composite operation needs at least one step")
        names = {n for step in steps for n in names_of(step)}
        for name in names:  # an internal segment (a transaction) is judged by its parent's name
            validate_name(parent_of(name))
        if len({container_for(n, self._count()) for n in names}) > 1:
            raise InvalidArgument("a composite operation's segments must live in one container")
        subject = parent_of(names_of(steps[0])[0])
        container = self._source(subject) if anywhere else self._container(subject)
        return container.composite(list(steps))

    def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> dict[uuid.UUID, int]:
        """Apply attribute updates atomically: all of them, or none (ConditionalCheckFailed).

        Returns the values the updated keys now have.
        """
        return self._container(name).update_attributes(name, updates)

    def get_attributes(self, name: str, keys: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        """The values of ``keys`` (None: no value)."""
        return self._container(name).get_attributes(name, keys)

    def attribute_items(self, name: str) -> dict[uuid.UUID, int]:
        """Every attribute the segment has (writer ids included), e.g. to carry them to a copy.

        A snapshot: an update running meanwhile may or may not show.
        """
        return self._container(name).attribute_items(name)

    def read(
        self,
        name: str,
        offset: int | None = None,
        max_length: int | None = None,
        *,
        wait_s: float = 0.0,
        anywhere: bool = False,
    ) -> ReadResult:
        """Read from ``offset`` (default: start offset) up to ``max_length`` bytes.

        Returns what is available now, at most ``max_read_bytes``. At the end of
        an unsealed segment it waits up to ``wait_s`` for the next append.
        Raises SegmentTruncated below the start offset, BadOffset past the length.
        ``anywhere``: on a cluster node, a segment another node serves is read
        through that node (one call, no wait), e.g. the source of a copy.
        """
        if anywhere:
            return self._source(name).read(name, offset, max_length, wait_s=0.0)
        return self._container(name).read(name, offset, max_length, wait_s=wait_s)

    def info(self, name: str, *, anywhere: bool = False) -> SegmentInfo:
        """The segment's state; ``anywhere`` as for ``read``."""
        return (self._source(name) if anywhere else self._container(name)).info(name)

    def seal(self, name: str) -> SegmentInfo:
        """Seal the segment (idempotent): no append is accepted afterwards."""
        return self._container(name).seal(name)

    def truncate(self, name: str, offset: int) -> SegmentInfo:
        """Set the start offset to max(current, offset); BadOffset past the length."""
        return self._container(name).truncate(name, offset)

    def delete(self, name: str) -> None:
        """Delete the segment; its Tier 2 data is removed in the background."""
        self._container(name).delete(name)

    def writer_event_number(
        self, name: str, writer_id: uuid.UUID, *, anywhere: bool = False
    ) -> int | None:
        """The last event number stored for ``writer_id`` on the segment, or None.

        ``anywhere`` as for ``read``.
        """
        where = self._source(name) if anywhere else self._container(name)
        return where.writer_event_number(name, writer_id)

    def partitions(self, name: str, target_bytes: int) -> list[tuple[int, int]]:
        """Ranges ``[start, end)`` covering the readable bytes, each starting on an append boundary.

        Boundaries are remembered sparsely (at least 64 KiB apart, fewer on
        very long segments), so ranges are near ``target_bytes``, not exact.
        """
        return self._container(name).partitions(name, target_bytes)

    def scan(
        self, prefix: str = "", *, after: str | None = None, here: bool = False
    ) -> Iterator[SegmentInfo]:
        """Every segment ``list`` shows under ``prefix`` (after ``after``), a page at a time."""
        while True:
            page, after = self.list(prefix, after=after, here=here)
            yield from page
            if after is None:
                return

    # ------------------------------------------------- transactions and merges
    def open_transaction(self, parent: str) -> uuid.UUID:
        """Open a transaction of ``parent``; returns its id. SegmentNotFound without the parent."""
        return self._container(parent).open_transaction(parent)

    def append_transaction(
        self,
        parent: str,
        txid: uuid.UUID,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer_id: uuid.UUID | None = None,
        event_number: int | None = None,
        event_count: int = 1,
        previous_event_number: int | None = None,
    ) -> AppendResult:
        """Append to a transaction, with the conditions and deduplication of ``append``."""
        return self._container(parent).append(
            transaction_name(parent, txid),
            data,
            expected_offset=expected_offset,
            writer_id=writer_id,
            event_number=event_number,
            event_count=event_count,
            previous_event_number=previous_event_number,
        )

    def transaction_info(self, parent: str, txid: uuid.UUID) -> SegmentInfo:
        """The state of an open (or sealed, not yet merged) transaction."""
        return self._container(parent).info(transaction_name(parent, txid))

    def commit_transaction(self, parent: str, txid: uuid.UUID) -> MergeResult:
        """Seal the transaction and merge it at the end of ``parent``, all at once.

        Idempotent: a retry answers with the first commit's offset and length
        (while the parent remembers it: its last MERGE_RECORDS_MAX merges).
        SegmentNotFound for an aborted, expired or unknown transaction.
        """
        return self._container(parent).commit_transaction(parent, txid)

    def fork(self, source: str, name: str, offset: int | None = None) -> SegmentInfo:
        """Create ``name`` holding ``source``'s bytes below ``offset`` (default: all of them).

        The new segment shares the source's Tier 2 chunks (no byte is copied
        where they are flushed; the unflushed rest is copied through Tier 1)
        and goes its own way after: appends, truncation and deletion of
        either leave the other's bytes alone. It starts with no attributes
        and an event count of zero. Both names must live in one container
        (``container_of``): chunks are shared within a container only.
        """
        into = self._container(name)
        if into is not self._container(source):
            raise InvalidArgument(
                f"a fork lives in its source's container: {name!r} is in container "
                f"{into.container_id}, {source!r} is not"
            )
        return into.fork(source, name, offset)

    def copy(self, source: str, name: str, offset: int | None = None) -> SegmentInfo:
        """Create ``name`` holding ``source``'s bytes below ``offset``, at the same offsets.

        Within one container this is ``fork`` (chunks shared). Across
        containers, another node's included, the bytes of the untruncated
        source are copied once; nothing is shared after.
        """
        into = self._container(name)
        origin = self._source(source)
        if into is origin:
            return into.fork(source, name, offset)
        return cross_container.fork(into, origin, source, name, offset, self.settings)

    def abort_transaction(self, parent: str, txid: uuid.UUID) -> None:
        """Drop the transaction and its bytes (a delete)."""
        self._container(parent).delete(transaction_name(parent, txid))

    def merge(self, target: str, source: str) -> MergeResult:
        """Append the whole of the sealed ``source`` to ``target`` at once; ``source`` goes away.

        Within one container this is one log operation. Across containers
        (another node's too: its bytes come through the peer calls) the
        source is first copied into a sealed staging segment beside the
        target, which is then merged the same way; the source is deleted
        after. A retry answers with the first merge's result.
        """
        into = self._container(target)
        origin = self._source(source)
        if into is origin:
            return into.merge(target, source)
        return cross_container.merge(into, origin, target, source, self.settings)

    def export_layout(self, name: str, *, timeout_s: float = 30.0) -> str:
        """Back up a segment's Tier 2 layout into a small object (seed 002 "Backup and Restore").

        The segment is flushed first; returns the object's name in Tier 2.
        """
        return self._container(name).export_layout(name, timeout_s)

    def import_segment(self, name: str) -> SegmentInfo:
        """Restore a segment from its exported layout, e.g. into an empty data directory.

        The chunks are taken over, not copied: import a layout only where the
        segment it came from no longer exists (two segments must not share chunks).
        """
        return self._container(name).import_segment(name)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every acknowledged byte is in Tier 2 (tests, shutdown, benchmarks)."""
        for container in self._containers:
            container.flush(timeout_s)
