"""A container's state, as ``/healthz`` and the ``segstore_container_state`` metric show it.

Only a container that is ``running`` or ``degraded`` takes every request; in
every other state some requests answer 503 (``Throttled``,
``ContainerNotReady``) or 507 (``StorageFull``).
"""

from __future__ import annotations

# Replaying Tier 1, or waiting for Tier 2 to answer (an outage at start is waited out).
RECOVERING = "recovering"
# Tier 1 has no room: reads are served, writes answer StorageFull until space is freed.
READ_ONLY = "read_only"
RUNNING = "running"
# Running, but Tier 2 writes fail (and are retried): appends are taken until the backlog fills.
DEGRADED = "degraded"
# The Tier 2 backlog is full: appends answer Throttled (StorageFull when Tier 2 itself is full).
THROTTLED = "throttled"
# Recovery failed, or the Tier 1 log stopped (fenced, or a failure it cannot undo): a restart is needed.
FAILED = "failed"
STOPPED = "stopped"

STATES = (RECOVERING, READ_ONLY, RUNNING, DEGRADED, THROTTLED, FAILED, STOPPED)
SERVING = frozenset({RUNNING, DEGRADED})
# Past recovery and taking writes (some answer 503 while throttled): what a ready server's containers are.
RECOVERED = frozenset({RUNNING, DEGRADED, THROTTLED})
