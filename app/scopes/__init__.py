"""Streams (seed 004, ``/v1/scopes``): parallel segments, routing keys, scaling, transactions, cuts.

The layer plays Pravega's Controller over the engine's public calls
(docs/design.md "Streams (seed 004; the `scopes` surface, the role of Pravega's
Controller)"). The mapping onto segments is Flask-free and tested on a bare
``SegmentStore``: ``names``, ``ranges``, ``records`` (a stream's record and
its fold), ``log`` (reading and appending records), ``controller`` (scopes
and streams), ``steps`` (what a record leaves pending, finished),
``scaling``, ``autoscale``, ``events``, ``transactions``, ``cuts``,
``keeper`` (the background task), ``errors``, ``subject``. The HTTP side is
``routes``.
"""

from app.scopes.routes import init_app

__all__ = ["init_app"]
