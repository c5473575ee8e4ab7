"""Object helpers in-process: waiting out back-pressure, ETag records, colocated names, engine errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.s3 import objects
from app.s3.answers import from_engine
from app.s3.metadata import Stored
from engine import OutcomeUnknown, SegmentStore, Settings, Throttled


@pytest.fixture
def store(tmp_path: Path):
    s = SegmentStore(Settings(data_dir=str(tmp_path / "data"), container_count=4))
    s.start(wait=True)
    yield s
    s.close()


def test_patiently_waits_out_throttling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects.time, "sleep", lambda s: None)
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise Throttled("busy", retry_after_s=1)
        return len(calls)

    assert objects.patiently(flaky) == 3

    def always() -> None:
        raise Throttled("busy", retry_after_s=objects.THROTTLED_WAIT_MAX_S + 1)

    with pytest.raises(Throttled):
        objects.patiently(always)


def test_staging_names_share_the_target_container(store: SegmentStore) -> None:
    for i in range(20):
        target = f"bucket/key-{i}"
        assert store.container_of(objects.colocated(store, "staging", target)) == store.container_of(target)


def test_etag_record_only_counts_for_the_bytes_it_was_made_for(store: SegmentStore) -> None:
    info = objects.publish(store, "b/k", Stored("5d41402abc4b2a76b9719d911017c592"), data=b"hello")
    assert objects.etag_of(store, info) == "5d41402abc4b2a76b9719d911017c592"
    staging = objects.stage(store, "b/k", [b"oth", b"er"])
    replaced = objects.publish(store, "b/k", Stored("795f3202b17cb6bc3d4b771d8c6c9eaf"), staging=staging)
    assert objects.etag_of(store, replaced) == "795f3202b17cb6bc3d4b771d8c6c9eaf"
    assert objects.etag_of(store, info) == objects.derived_etag(info)  # the old segment's record is gone
    store.delete("b/k")
    store.create("b/k")
    store.append("b/k", b"native")
    native = store.info("b/k")
    assert objects.etag_of(store, native) == objects.derived_etag(native)
    assert objects.derived_etag(native).endswith("-1")


def test_an_unknown_outcome_is_an_internal_error_s3_clients_resend() -> None:
    """A whole-object write resent is the same write: S3 clients resend a 500 on their own."""
    err = from_engine(OutcomeUnknown("fenced while its write was in flight"))
    assert (err.code, err.status) == ("InternalError", 500)
    assert "fenced" in err.message
