"""The one poll-until of the tests: wait for a condition another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

# Polls start fast (an in-process condition is usually met within milliseconds) and slow down to
# this, so a long wait on a server does not flood it with requests.
_EVERY_MAX_S = 0.05


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` until it is true; fail the test, naming ``what``, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    every_s = 0.002
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting until {what}")
        time.sleep(every_s)
        every_s = min(2 * every_s, _EVERY_MAX_S)
