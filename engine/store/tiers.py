"""The storage a store's containers are built over: Tier 1 logs and the Tier 2 binding, as set.

One S3 client serves every container's Tier 1 log on S3, one round of syncs
(``GroupSync``) every container's Tier 1 files, one binding every
container's Tier 2 (seed 000 "Storage Abstractions").
"""

from __future__ import annotations

from engine.config import Settings
from engine.durable_log.data_log import DurableDataLog
from engine.naming import tier1_dir
from engine.tier1.file_log import FileDataLog
from engine.tier1.group_sync import GroupSync
from engine.tier1.object_log import ObjectDataLog
from engine.tier2.chunk_storage import ChunkStorage
from engine.tier2.local import LocalChunkStorage


class Tiers:
    """Builds, once each, the storage the settings name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tier1_objects: ChunkStorage | None = None
        self._tier2: ChunkStorage | None = None
        self.file_syncs = GroupSync()

    def tier1_log(self, container_id: int) -> DurableDataLog:
        """Container ``container_id``'s Tier 1 log: files in the data folder, or objects on S3."""
        s = self.settings
        if s.tier1_s3 is None:
            return FileDataLog(
                tier1_dir(s.data_path, container_id),
                file_bytes=s.tier1_file_bytes,
                max_frame_bytes=s.max_frame_bytes,
                group=self.file_syncs,
                fenced=s.local_members,
            )
        return ObjectDataLog(
            self.tier1_objects(),
            container_id,
            max_frame_bytes=s.max_frame_bytes,
            max_writes_in_flight=s.tier1_writes_in_flight,
        )

    def tier1_objects(self) -> ChunkStorage:
        """The object store of an S3 Tier 1 (one client for every container's log)."""
        if self._tier1_objects is None:
            from engine.tier2.s3 import S3ChunkStorage  # see tier2() on the late import

            location = self.settings.tier1_s3
            assert location is not None
            bucket, prefix = location
            endpoint = self.settings.s3_endpoint or None
            self._tier1_objects = S3ChunkStorage(bucket, prefix, endpoint_url=endpoint)
        return self._tier1_objects

    def tier2(self) -> ChunkStorage:
        """The Tier 2 binding the settings name: an S3 bucket, or a local folder."""
        if self._tier2 is None:
            s3 = self.settings.tier2_s3
            if s3 is None:
                self._tier2 = LocalChunkStorage(self.settings.tier2_path)
            else:
                # Imported here, not at module load: gunicorn reads its config (which
                # imports the engine) before the gevent worker patches ssl and sockets.
                from engine.tier2.s3 import S3ChunkStorage

                bucket, prefix = s3
                self._tier2 = S3ChunkStorage(bucket, prefix, endpoint_url=self.settings.s3_endpoint or None)
        return self._tier2

    def close(self) -> None:
        """Stop the sync rounds (after the containers closed their logs)."""
        self.file_syncs.close()
