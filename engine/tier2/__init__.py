"""Tier 2: long-term storage behind the ChunkStorage seam (seed 002).

For now a segment's Tier 2 data is one object, written by appending at its
end; chunked segment storage (segments as linked lists of chunks, S3) fills
this seam out later.
"""

from engine.tier2.chunk_storage import ChunkStorage

__all__ = ["ChunkStorage"]
