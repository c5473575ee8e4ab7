"""The Durable Streams surface (``/v1/stream/{name}``): streams, producers and forks over segments.

The mapping onto segments is Flask-free and testable on a bare
``SegmentStore``: ``store`` (``StreamStore``: loading, reads, deletes),
``creation`` (creates and forks), ``appends``, ``producers``, ``records``
(a stream's configuration and state), ``format`` (offsets, frames, JSON
mode), ``reaper`` (expiry), ``errors``. The HTTP side: ``routes`` (the
blueprint), ``shortcut`` (plain appends in WSGI), ``sse``, ``protocol``
(headers and cursors every answer shares).
"""

from app.streams.routes import init_app

__all__ = ["init_app"]
