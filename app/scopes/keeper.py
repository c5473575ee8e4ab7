"""The stream layer's background task: every ``stream_scale_sample_s``, each stream served here.

For each stream whose record this process serves (in a cluster, the node
holding its record's container), once the store is ready:

- it is touched, so what its record leaves pending is finished: a scale or
  commit a crash interrupted, transactions past their deadline aborted, a
  scale that waited for them completed (``steps``);
- under a scaling policy, its current segments' lengths and event counts
  are sampled, and the scale ``autoscale.decide`` asks for is started.

Rates live in this process's memory: after a restart (or a record moving
to another node) a segment's rate is known again once a window passed.
"""

from __future__ import annotations

import logging
import time

from app.periodic import Periodic
from app.scopes import autoscale, scaling
from app.scopes.controller import Controller
from app.scopes.names import segment_name
from app.scopes.record_log import now
from engine import SegstoreError

log = logging.getLogger(__name__)


class Keeper(Periodic):
    """Runs ``round()`` every ``stream_scale_sample_s`` in a thread of its own, until stopped."""

    def __init__(self, ctl: Controller) -> None:
        super().__init__("stream-keeper", ctl.http.stream_scale_sample_s, ctl.store, self.round)
        self.ctl = ctl
        self.rates = autoscale.Rates(ctl.http.stream_scale_window_s)

    def round(self) -> None:
        """Finish and auto-scale every stream served here, once."""
        sampled: list[str] = []
        for scope, stream in list(self.ctl.streams_served_here()):
            try:
                sampled.extend(self._keep(scope, stream))
            except SegstoreError as exc:
                log.info("stream keeper: %s/%s: %s %s", scope, stream, exc.code, exc.detail)
        self.rates.retain(sampled)

    def _keep(self, scope: str, stream: str) -> list[str]:
        """One stream's round; returns the segment names it sampled."""
        state = self.ctl.touch(scope, stream).state
        policy = state.config.scaling.type
        if policy == "fixed" or state.sealing:
            return []
        names = {}
        for segment in state.current:
            name = segment_name(scope, stream, segment.id)
            info = self.ctl.store.info(name, anywhere=True)
            self.rates.add(name, autoscale.Sample(time.monotonic(), info.length, info.event_count))
            names[segment.id] = name
        rates = {sid: self.rates.rate(name, policy) for sid, name in names.items()}
        decision = autoscale.decide(state, rates, now(), self.ctl.http.stream_scale_cooldown_s)
        if decision is not None:
            seal, new = decision
            log.info("stream %s/%s: auto-scale seals %s into %s", scope, stream, seal, new)
            scaling.start(self.ctl, scope, stream, seal, new)
        return list(names.values())
