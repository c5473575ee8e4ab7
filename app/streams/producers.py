"""Idempotent producers (``Producer-Id``, ``Producer-Epoch``, ``Producer-Seq``) and ``Stream-Seq``.

A producer's state is two attributes of the stream's data segment (seed
001), keyed by UUIDv5s of the producer id: its epoch and its last sequence
number. The state is read, the decision taken (duplicate, gap, stale
epoch), and the append carries ``replace_if_equals`` updates of both, so
data and state change atomically; a lost race fails the condition and the
decision is taken again.

``Stream-Seq``: the meta segment gets a record ``(seq, generation n)``
first; the append then moves the data segment's generation attribute
(``SEQ_GENERATION_KEY``) from n-1 to n atomically with its bytes. At load,
the seq of the attribute's generation is the last one, so a record whose
append never happened does not count.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

_PRODUCER_NAMESPACE = uuid.UUID("6f1d8a52-3b0e-4f7c-9a51-0d6c2b7e4a10")
# The data segment's count of appends that carried a Stream-Seq.
SEQ_GENERATION_KEY = uuid.uuid5(_PRODUCER_NAMESPACE, "stream-seq-generation")
# Producer epochs and sequence numbers are JavaScript's safe integers, as the protocol's clients send.
MAX_PRODUCER_SEQ = MAX_PRODUCER_EPOCH = 2**53 - 1


@dataclass(frozen=True, slots=True)
class Producer:
    """An idempotent producer's headers."""

    producer_id: str
    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What an append (or a close) did.

    ``status``: ``appended``, ``duplicate``, ``stale_epoch``,
    ``invalid_epoch_seq`` or ``sequence_gap``. ``last_seq`` answers a
    duplicate, ``current_epoch`` a stale epoch, ``expected_seq`` a gap.
    """

    status: str
    next_offset: str
    closed: bool
    last_seq: int | None = None
    current_epoch: int | None = None
    expected_seq: int | None = None


def producer_keys(producer_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The attribute keys of a producer's epoch and last sequence number on a data segment."""
    return (
        uuid.uuid5(_PRODUCER_NAMESPACE, f"epoch\x00{producer_id}"),
        uuid.uuid5(_PRODUCER_NAMESPACE, f"seq\x00{producer_id}"),
    )


def producer_verdict(last: tuple[int | None, int | None], producer: Producer) -> AppendOutcome | None:
    """None to accept the producer's append, else the outcome refusing it (Kafka-style checks)."""
    epoch, seq = producer.epoch, producer.seq
    last_epoch, last_seq = last
    if last_epoch is None or last_seq is None:
        return None if seq == 0 else AppendOutcome("sequence_gap", "", False, expected_seq=0)
    if epoch < last_epoch:
        return AppendOutcome("stale_epoch", "", False, current_epoch=last_epoch)
    if epoch > last_epoch:
        return None if seq == 0 else AppendOutcome("invalid_epoch_seq", "", False)
    if seq <= last_seq:
        return AppendOutcome("duplicate", "", False, last_seq=last_seq)
    if seq == last_seq + 1:
        return None
    return AppendOutcome("sequence_gap", "", False, expected_seq=last_seq + 1)
