"""run_blocking: on a real OS thread under gevent (other greenlets keep running), in place otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from engine.blocking import run_blocking

REPO = Path(__file__).resolve().parents[2]

PATCHED = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()

    import json
    import time

    import gevent
    from gevent.monkey import get_original

    from engine.blocking import run_blocking

    native_id = get_original("threading", "get_native_id")
    real_sleep = get_original("time", "sleep")
    ticks = []

    def ticker():
        for _ in range(10):
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    def blocking(seconds):
        real_sleep(seconds)  # blocks its OS thread, not the hub
        return native_id()

    greenlet = gevent.spawn(ticker)
    gevent.sleep(0)
    started = time.monotonic()
    worker = run_blocking(blocking, 0.3)
    ended = time.monotonic()
    greenlet.join()
    print(json.dumps({
        "main": native_id(),
        "worker": worker,
        "ticks_during_block": sum(started < t < ended for t in ticks),
        "blocked_s": ended - started,
    }))
    """
)


@pytest.mark.process
def test_runs_on_another_os_thread_under_gevent() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PATCHED], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["worker"] != result["main"]
    assert result["blocked_s"] >= 0.3
    assert result["ticks_during_block"] >= 5  # the other greenlet kept running meanwhile


def test_runs_in_place_unpatched() -> None:
    assert run_blocking(threading.get_native_id) == threading.get_native_id()
    assert run_blocking(lambda a, b=0: a + b, 1, b=2) == 3


RAISES = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()

    from engine.blocking import run_blocking

    def failing():
        raise FileExistsError(17, "taken")

    try:
        run_blocking(failing)
    except FileExistsError as exc:
        print("caught", exc.errno)
    """
)


@pytest.mark.process
def test_an_exception_reaches_the_caller_and_is_not_printed_by_the_pool() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RAISES], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "caught 17"
    assert "Traceback" not in done.stderr and "failed with" not in done.stderr, done.stderr
