"""Streams (seed 004, ``/v1/scopes``): parallel segments, routing keys, scaling, transactions, cuts.

The layer plays Pravega's Controller over the engine's public calls
(docs/design.md "Streams (seed 004; the `scopes` surface, the role of Pravega's
Controller)"). The mapping onto segments is Flask-free and tested on a bare
``SegmentStore``: ``names``, ``ranges``, ``records`` (a stream's record and
its fold), ``record_log`` (reading, appending and compacting the records
of streams and groups), ``controller`` (scopes and streams), ``steps``
(what a record leaves pending, finished), ``scaling``, ``autoscale``,
``events``, ``transactions``, ``cuts``, ``keeper`` (the background task),
``errors``, ``subject``; reader groups (docs/design.md "Reader groups"):
``groups`` (a group's record and its fold), ``readers`` (membership,
leases, assignment, commits, checkpoints), ``fetch``. The HTTP side is ``routes`` and
``group_routes``.
"""

from app.scopes.routes import init_app

__all__ = ["init_app"]
