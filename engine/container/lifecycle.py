"""A container's lifecycle and state: recovery, what it serves meanwhile, and stopping.

``SegmentContainer`` builds the components (``engine/container/segment_container.py``); this
part starts and stops them. Recovery replays Tier 1 (from then on reads are
possible), makes the new epoch durable with a checkpoint, reaches Tier 2 and
only then takes writes. Two faults are waited out instead of failing the
start: a full Tier 1 (the container serves reads, ``read_only``, and tries
the checkpoint again every second) and a Tier 2 that does not answer
(backoff up to 10 s). A Tier 2 that refuses us (no bucket, credentials
refused) fails the start as ``Misconfigured``, which stops the server.
``state`` (``engine/container/state.py``) says what the container serves now.
The transaction reaper runs from the end of recovery until the container stops.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engine import naming
from engine.config import Settings, tier2_location
from engine.container import state as states
from engine.durable_log.durable_log import DurableLog, RecoveryStopped
from engine.errors import ContainerNotReady, Misconfigured, SegstoreError, StorageFull
from engine.metadata import operations as ops
from engine.metadata.container_metadata import ContainerMetadata
from engine.metrics import EngineMetrics
from engine.reads.read_index import ReadIndex
from engine.reads.storage_reader import StorageReader
from engine.storage_writer import StorageWriter
from engine.tier2.chunk_storage import ChunkStorageError, ChunkStorageUnusable
from engine.tier2.chunked_segment_storage import ChunkedSegmentStorage

log = logging.getLogger("engine.container.segment_container")

# While Tier 1 is full at start, the epoch's checkpoint is tried again this often.
_FULL_RETRY_S = 1.0
# A Tier 2 that does not answer at start is tried again with a backoff up to this.
_TIER2_RETRY_MAX_S = 10.0
_READABLE = frozenset({states.RUNNING, states.READ_ONLY})


class ContainerLifecycle:
    """Start, state and stop of a container whose components the subclass built first."""

    container_id: int
    settings: Settings
    metrics: EngineMetrics
    metadata: ContainerMetadata
    read_index: ReadIndex
    durable_log: DurableLog
    chunked: ChunkedSegmentStorage
    storage_writer: StorageWriter
    storage_reader: StorageReader
    _backlog_max: int

    def __init__(self) -> None:
        self._ready = threading.Event()  # recovery ended: running, failed or stopped
        self._phase = states.RECOVERING  # then READ_ONLY (Tier 1 full at start) or RUNNING
        self._failure: BaseException | None = None
        self.misconfigured: str | None = None
        self.recovery_s = 0.0
        self._closed = False
        self._draining = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # the end of recovery (components start) against close
        self._running = False  # the durable log and storage writer started
        # Past this, an append of the largest size is refused: the container counts as throttled.
        self._throttled_above = max(
            self._backlog_max - self.settings.max_append_bytes, self._backlog_max // 2
        )

    def start(self) -> None:
        """Recover in the background; ``ready`` turns True when requests are accepted."""
        self._thread = threading.Thread(
            target=self._recover, name=f"recovery-{self.container_id}", daemon=True
        )
        self._thread.start()

    def _recover(self) -> None:
        """Replay Tier 1 (reads work from here), begin the epoch, reach Tier 2, then take writes.

        A full Tier 1 holds the container read-only until the epoch's
        checkpoint fits; a Tier 2 that does not answer is waited for; one that
        refuses us (no bucket, bad credentials) is a misconfiguration. A
        container closed meanwhile abandons its recovery at the next step
        (``close`` does not wait for it) and starts nothing.
        """
        started = time.monotonic()
        aside = ThreadPoolExecutor(1, thread_name_prefix=f"tier2-listing-{self.container_id}")
        try:
            listing = aside.submit(self.chunked.chunk_names)  # Tier 2 is listed while Tier 1 is replayed
            replayed = self.durable_log.replay(self._stopping)
            self.durable_log.check_recovered_data()
            self._check_stopping()
            replayed_at = time.monotonic()
            self._begin_epoch()
            begun_at = time.monotonic()
            self._reach_tier2(listing.result)
            with self._start_lock:
                self._check_stopping()
                self.durable_log.start()
                self.storage_writer.start()
                self._running = True
            threading.Thread(
                target=self._reap_transactions,
                name=f"reaper-{self.container_id}",
                daemon=True,
            ).start()
        except RecoveryStopped:
            log.info("container %d: recovery abandoned, the container stopped", self.container_id)
            self.durable_log.close()
            return
        except Misconfigured as exc:
            self.misconfigured = exc.detail
            self._failure = exc
        except BaseException as exc:
            log.exception("container %d: recovery failed", self.container_id)
            self._failure = exc
        else:
            self._phase = states.RUNNING
            ended_at = time.monotonic()
            took = ended_at - started
            log.info(
                "container %d: epoch %d, %d operations replayed in %.2fs (%.0f a second; "
                "Tier 1 %.2fs, the epoch's checkpoint %.2fs, Tier 2 %.2fs)",
                self.container_id,
                self.metadata.epoch,
                replayed,
                took,
                replayed / max(took, 1e-6),
                replayed_at - started,
                begun_at - replayed_at,
                ended_at - begun_at,
            )
            self.metrics.recovery_operations.labels(str(self.container_id)).set(replayed)
        finally:
            aside.shutdown(wait=False)
            self.recovery_s = time.monotonic() - started
            self.metrics.recovery_seconds.labels(str(self.container_id)).set(self.recovery_s)
            self._ready.set()

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise RecoveryStopped(f"container {self.container_id} stopped during its recovery")

    def _begin_epoch(self) -> None:
        """Write the new epoch's checkpoint; while Tier 1 is full, serve reads and try again."""
        while True:
            try:
                self.durable_log.begin_epoch()
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if self._phase != states.READ_ONLY:
                    log.warning(
                        "container %d: Tier 1 is full (%s): serving reads only until space is freed",
                        self.container_id,
                        exc.strerror,
                    )
                    self._phase = states.READ_ONLY
            if self._stopping.wait(_FULL_RETRY_S):
                raise RecoveryStopped

    def _reach_tier2(self, listed: Callable[[], list[str]]) -> None:
        """Collect garbage in Tier 2, waiting out an outage; a Tier 2 that refuses us is Misconfigured.

        ``listed`` gives the container's chunks as listed during the replay;
        after a failure the chunks are listed again.
        """
        backoff_s = 0.1
        while True:
            try:
                self._collect_garbage(listed())
                return
            except ChunkStorageUnusable as exc:
                raise Misconfigured.unusable(f"Tier 2 at {tier2_location(self.settings)}", exc) from None
            except (ChunkStorageError, OSError) as exc:
                log.warning(
                    "container %d: Tier 2 does not answer (%s); trying again in %.1fs",
                    self.container_id,
                    exc,
                    backoff_s,
                )
            if self._stopping.wait(backoff_s):
                raise RecoveryStopped
            backoff_s = min(backoff_s * 2, _TIER2_RETRY_MAX_S)
            listed = self.chunked.chunk_names

    def _collect_garbage(self, names: list[str]) -> None:
        """Start the new epoch in Tier 2: drop older epochs' chunks that no layout names."""
        self.chunked.epoch = self.metadata.epoch
        with self.metadata.lock:
            segments = self.metadata.segments.values()
            referenced = {c.name for s in segments for c in [*s.read_layout(), *s.attribute_chunks]}
        dropped = self.chunked.collect_garbage(referenced, names)
        if dropped:
            log.info("container %d: %d unreferenced chunks collected", self.container_id, len(dropped))

    def _reap_transactions(self) -> None:
        """Abort transactions idle longer than ``transaction_timeout_s``, and those whose parent is gone."""
        timeout_s = self.settings.transaction_timeout_s
        period_s = min(max(timeout_s / 4, 0.05), 30.0)
        while not self._stopping.wait(period_s):
            idle_before = time.time() - timeout_s
            with self.metadata.lock:
                expired = []
                for name, seg_id in self.metadata.names.items():
                    if not naming.is_internal(name):
                        continue
                    seg = self.metadata.segments[seg_id]
                    orphan = naming.parent_of(name) not in self.metadata.names
                    if orphan or (seg.last_modified or seg.created) < idle_before:
                        expired.append((name, seg_id))
            for name, seg_id in expired:
                try:
                    self._check_ready()
                    self.durable_log.add(ops.Delete(name=name, segment_id=seg_id)).result()
                except SegstoreError as exc:
                    log.debug("container %d: %s not aborted: %s", self.container_id, name, exc)
                else:
                    log.info("container %d: %s aborted (idle or orphaned)", self.container_id, name)


    @property
    def failure(self) -> str | None:
        """Why recovery failed, or None."""
        return None if self._failure is None else str(self._failure)

    @property
    def ready(self) -> bool:
        return self._phase == states.RUNNING and self._failure is None and not self._closed

    @property
    def state(self) -> str:
        """One of ``engine.container.state.STATES``."""
        if self._closed:
            return states.STOPPED
        if self._failure is not None or self.durable_log.failure is not None:
            return states.FAILED
        if self._phase != states.RUNNING:
            return self._phase
        if self.durable_log.full is not None:
            return states.READ_ONLY
        if self.metadata.unflushed_bytes > self._throttled_above:
            return states.THROTTLED
        if self.storage_writer.failing is not None:
            return states.DEGRADED
        return states.RUNNING

    @property
    def state_reason(self) -> str | None:
        """What keeps the container from ``running`` (None when it runs)."""
        current = self.state
        if current == states.FAILED:
            return self.failure or self.durable_log.failure
        if current == states.READ_ONLY:
            return self.durable_log.full or "Tier 1 is full: writes resume once space is freed"
        if current == states.THROTTLED:
            return f"{self.metadata.unflushed_bytes} acknowledged bytes wait for Tier 2"
        if current == states.DEGRADED:
            return f"Tier 2 writes fail and are retried: {self.storage_writer.failing}"
        if current == states.RECOVERING:
            return "replaying Tier 1, or waiting for Tier 2 to answer"
        return None if current == states.RUNNING else current

    def wait_started(self, timeout_s: float | None = None) -> bool:
        """Wait until recovery ended (ready, failed or stopped); False on timeout."""
        return self._ready.wait(timeout_s)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        if not self._ready.wait(timeout_s):
            raise ContainerNotReady(f"container {self.container_id} is still recovering")
        if self._failure is not None:
            raise ContainerNotReady(
                f"container {self.container_id} failed to recover: {self._failure}"
            ) from self._failure

    def close(self) -> None:
        """Stop: no new request is taken, what is in flight finishes, the log closes.

        A recovery under way is not waited for: it stops at its next step and
        closes the log itself.
        """
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        with self._start_lock:
            running = self._running
        self.storage_reader.finish()
        self.read_index.close()
        if running and self._failure is None:
            # The log closes before the storage writer is waited for: a hand-over waits for the
            # writes in flight, not for a Tier 2 flush (whose commit then fails; its bytes stay in Tier 1).
            self.storage_writer.stop()
            self.durable_log.close()
            self.storage_writer.close()

    def drain(self) -> None:
        """Shutdown has begun: tail reads stop waiting, so their requests end now."""
        self._draining = True
        self.storage_reader.finish()
        self.read_index.close()

    def flush(self, timeout_s: float) -> None:
        self._check_ready()
        self.storage_writer.flush(timeout_s)

    def _check_ready(self) -> None:
        """Writes need a running container."""
        if self._phase != states.RUNNING or self._failure is not None or self._closed:
            self._refuse()

    def _check_readable(self) -> None:
        """Reads need a recovered one; a full Tier 1 (read-only) still serves them."""
        if self._phase not in _READABLE or self._failure is not None or self._closed:
            self._refuse()

    def _refuse(self) -> None:
        """Raise what a request meets in this state (and count it)."""
        m = self.metrics
        if self._closed:
            m.throttled_stopped.inc()
            raise ContainerNotReady(f"container {self.container_id} is stopped")
        if self._failure is not None:
            m.throttled_failed.inc()
            raise ContainerNotReady(
                f"container {self.container_id} failed to recover: {self._failure}"
            ) from self._failure
        if self._phase == states.READ_ONLY:
            m.throttled_storage_full.inc()
            raise StorageFull(
                f"container {self.container_id}: Tier 1 is full; reads are served, "
                "writes resume once space is freed"
            )
        m.throttled_recovering.inc()
        raise ContainerNotReady(f"container {self.container_id} is still recovering")
