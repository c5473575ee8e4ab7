"""The streaming sinks' attribute keys stay what they were: a sink finds the progress it recorded."""

from __future__ import annotations

import uuid

from client import spark_sink, stream_sink
from client.sink_keys import from_halves, halves


def test_the_segment_sinks_keys_are_derived_in_its_namespace() -> None:
    namespace = uuid.UUID("6f1d3c2e-9a4b-5c7d-8e0f-1a2b3c4d5e6f")
    keys = spark_sink.sink_keys("q")
    assert keys.last == uuid.uuid5(namespace, "q\nlast-committed-batch")
    assert keys.intent == uuid.uuid5(namespace, "q\nintent-batch")
    assert keys.count == uuid.uuid5(namespace, "q\nintent-count")
    assert keys.half(3, "lo") == uuid.uuid5(namespace, "q\nintent-tx-3-lo")


def test_the_stream_sinks_keys_and_writer_ids_are_derived_in_its_namespace() -> None:
    namespace = uuid.UUID("0c6b1a54-3f0e-5d8a-9b7c-2e4f6a8d0b1c")
    keys = stream_sink.sink_keys("q")
    assert keys.last == uuid.uuid5(namespace, "q\nlast-committed-batch")
    assert keys.batch == uuid.uuid5(namespace, "q\nclaimed-batch")
    assert (keys.high, keys.low) == (
        uuid.uuid5(namespace, "q\nclaimed-transaction-high"),
        uuid.uuid5(namespace, "q\nclaimed-transaction-low"),
    )
    assert stream_sink.writer_id("q", 2, 7) == uuid.uuid5(namespace, "q\n2\n7")
    assert keys != spark_sink.sink_keys("q")


def test_a_transaction_id_splits_into_two_signed_halves_and_back() -> None:
    for txid in (str(uuid.UUID(int=0)), str(uuid.UUID(int=2**128 - 1)), str(uuid.uuid4())):
        high, low = halves(txid)
        assert -(2**63) <= high < 2**63 and -(2**63) <= low < 2**63
        assert from_halves(high, low) == txid
