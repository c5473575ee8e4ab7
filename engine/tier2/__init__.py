"""Tier 2: long-term storage (seed 002, PDP-34 "Simplified Tier 2").

``chunk_storage`` is the seam every binding implements (``local``, ``s3``,
``memory``, and the ``faults`` wrapper for tests); ``chunked`` builds
segments out of chunks on top of any of them.
"""

from engine.tier2.chunk_storage import ChunkStorage

__all__ = ["ChunkStorage"]
