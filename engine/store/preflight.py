"""A start's early checks: what would refuse the store, found before any server process opens it.

The server runs these once, before it starts its processes (deploy/gunicorn.conf.py),
so that a start that must be refused is refused in one line however many
processes it would run: a folder another server holds (``StoreLocked``), a
store record that names other tiers, a Tier 2 or an S3 Tier 1 that refuses
us (``Misconfigured``). Each process checks all of this again when it opens
the store (``DataFolder.open``, a container's recovery); these checks only
come first. An outage is not a refusal: an S3 endpoint that does not answer
passes here, and the processes wait it out. Nothing is written or taken.
"""

from __future__ import annotations

import contextlib

from engine.config import Settings, tier2_location
from engine.errors import ContainerNotReady, Misconfigured
from engine.naming import container_chunk_prefix
from engine.store import record as store_record
from engine.store.data_folder import check_unlocked
from engine.store.tiers import Tiers
from engine.tier2.chunk_storage import ChunkStorageError, ChunkStorageUnusable


def check(settings: Settings) -> None:
    """Raise what the store's opening would (``StoreLocked``, ``Misconfigured``); blocking I/O."""
    tiers = Tiers(settings)
    try:
        if settings.tier1_s3 is None:
            data = settings.data_path.resolve()
            check_unlocked(data)
            store_record.check_in_folder(data, settings)
        else:
            with contextlib.suppress(ContainerNotReady):  # does not answer yet: waited for by the processes
                store_record.check_in_bucket(tiers.tier1_objects(), settings)
        if settings.tier2_s3 is not None:
            _check_tier2(tiers, settings)
    finally:
        tiers.close()


def _check_tier2(tiers: Tiers, settings: Settings) -> None:
    """List one container's chunks: a bucket that is missing or refuses us is ``Misconfigured``."""
    try:
        next(iter(tiers.tier2().list(container_chunk_prefix(0))), None)
    except ChunkStorageUnusable as exc:
        raise Misconfigured.unusable(f"Tier 2 at {tier2_location(settings)}", exc) from None
    except ChunkStorageError:
        pass  # an outage: waited for by the processes
