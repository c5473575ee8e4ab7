"""Fixtures shared by every test package: a local S3 endpoint (moto in server mode), random seeds.

Tests that start a process (a server, moto, Spark's JVM, a command line) are
marked ``process``: ``make test-fast`` runs the others. A test is marked by
using a fixture in ``PROCESS_FIXTURES`` (directly or through another
fixture), or by ``pytest.mark.process``; one that starts a process without
the mark fails at once, so no process test lands in ``make test-fast``.
"""

from __future__ import annotations

import os
import random
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

from bench.servers import FAKE_AWS_ENV, UNSET_AWS_ENV, MotoServer

# The JVMs the tests start (Spark's: the tests' session, a driver killed mid-run, the README's
# example) each run for minutes on little data: compiled by C1 alone, they spend a quarter less CPU
# (tests/spark: 230 s against 302) than with C2's compiler threads, on a suite bound by two cores.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

# The fixtures that start a process: a server, moto, a cluster of servers, Spark's JVM, the SDK generator.
PROCESS_FIXTURES = frozenset({
    "moto_server", "server", "s3_server", "nodes", "shared_nodes", "cluster", "cluster_of", "spark",
    "sdk_modules",
})  # fmt: skip


class UnmarkedProcess(Exception):
    """A test started a process without ``pytest.mark.process``."""


_running: pytest.Item | None = None
_popen_init = subprocess.Popen.__init__


def _watched_popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    item = _running
    if item is not None and item.get_closest_marker("process") is None:
        self._child_created = False  # nothing started: Popen.__del__ has nothing to reap
        raise UnmarkedProcess(
            f"{item.nodeid} starts a process ({args[0] if args else kwargs.get('args')!r}): mark it "
            "pytest.mark.process, or add the fixture that starts it to tests/conftest.py's PROCESS_FIXTURES"
        )
    _popen_init(self, *args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)  # before xdist's, which names each item's group from these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)
        if item.get_closest_marker("process") is not None:
            item.add_marker(pytest.mark.xdist_group(process_group(item)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when xdist did not name the groups (``--dist loadgroup``).

    A module's tests would be scattered over the workers, each starting the
    module's servers, and the README's blocks would run out of order.
    """
    if not getattr(session.config.option, "loadgroup", False):
        return
    items = session.items
    ungrouped = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not group {ungrouped[0]} (and {len(ungrouped) - 1} more): "
            "is pytest newer than pyproject.toml allows?"
        )


def process_group(item: pytest.Item) -> str:
    """The xdist group of a test that starts processes (``pytest -n 3 --dist loadgroup``).

    A module's tests form one group (they share module fixtures), which one
    worker runs in order; each worker takes the next group as it frees up,
    so as many such modules run side by side as there are workers, and the
    tests that start nothing fill the gaps. The tests that use the Spark
    session share its JVM: one group; the other tests under tests/spark/
    (a server, a driver process of their own) group by module as usual.
    """
    if "spark" in getattr(item, "fixturenames", ()):
        return "spark"
    return item.nodeid.split("::", 1)[0]


# The longest work units of ``make test`` (a group, or a test that starts nothing, by its module):
# seconds each took in one run on two loaded cores, rounded. They are handed out first, longest
# first, so that none starts late and keeps one worker busy while the other has nothing left (xdist
# alone orders units by their number of tests, which put long modules of one or three tests among
# the last). The others follow in xdist's order; a stale figure only costs some balance.
LONGEST_UNITS = {
    "spark": 450,
    "tests/test_readme.py": 240,
    "tests/test_cluster_failover.py": 175,
    "tests/app/test_schemathesis.py": 130,
    "tests/test_processes.py": 130,
    "tests/test_cluster_nodes.py": 110,
    "tests/test_deploy.py": 110,
    "tests/console/test_console.py": 95,
    "tests/test_cluster_surfaces.py": 70,
    "tests/test_cluster.py": 70,
    "tests/test_tier1_s3.py": 70,
    "tests/streams/test_conformance.py": 70,
    "tests/test_cluster_wide.py": 60,
    "tests/test_startup.py": 60,
    "tests/s3/test_awscli.py": 50,
    "tests/engine/cluster/test_node.py": 45,
    "tests/test_crash.py": 45,
    "tests/s3/test_overwrites.py": 45,
    "tests/test_cluster_hop.py": 40,
    "tests/test_tier2_s3.py": 40,
    "tests/client/test_installed_alone.py": 35,
    "tests/test_local_cluster.py": 35,
    "tests/scopes/test_cluster_reader_groups.py": 35,
    "tests/test_tier2_outage.py": 33,
    "tests/client/test_cli.py": 30,
    "tests/scopes/test_reader_group_processes.py": 30,
    "tests/scopes/test_cluster_streams.py": 30,
    "tests/test_transaction_crash.py": 28,
    "tests/scopes/test_kill.py": 25,
}


class LongestFirstScheduling(LoadGroupScheduling):
    """xdist's ``loadgroup`` scheduling, with the units of ``LONGEST_UNITS`` handed out first."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ordered:  # the work queue is complete before the first unit is handed out
            self._ordered = True
            units = sorted(self.workqueue.items(), key=lambda unit: -_expected_s(unit[0]))
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)


def _expected_s(unit: str) -> int:
    return LONGEST_UNITS.get(unit.split("::", 1)[0], 0)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadGroupScheduling | None:
    return LongestFirstScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    _running = item
    try:
        yield
    finally:
        _running = None


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: MotoServer) -> Iterator[str]:
    """The moto server's URL, with fake AWS credentials in this process's environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS_ENV.items():
            patch.setenv(name, value)
        for name in UNSET_AWS_ENV:
            patch.delenv(name, raising=False)
        yield moto_server.url


@pytest.fixture(scope="session")
def s3_client(moto_endpoint: str) -> Any:
    """One boto3 S3 client for the moto server (building a client costs about 0.1 s)."""
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def s3_bucket(moto_server: MotoServer, s3_client: Any) -> Iterator[str]:
    """A fresh, empty bucket; moto forgets everything after the test."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    moto_server.reset()


def random_seed() -> int:
    """A seed for a randomized test: ``SEGSTORE_TEST_SEED`` if set (to replay a failure), else a new one.

    It is printed, so a failing test's captured output names it.
    """
    raw = os.environ.get("SEGSTORE_TEST_SEED")
    seed = int(raw) if raw else random.randrange(2**32)
    print(f"random seed {seed} (SEGSTORE_TEST_SEED={seed} replays it)")
    return seed
