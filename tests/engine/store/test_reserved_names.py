"""Reserved names (``#<owner>/...``): the surfaces' state, taken by the engine, never by a user.

They route by their own name, are never reaped as stale transactions, and
show in a listing only when the prefix is itself reserved.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from engine import InvalidName, ReservedNames, SegmentNotFound, SegmentStore, reserve, validate_segment_name
from engine.naming import (
    container_for,
    is_internal,
    is_reserved,
    parent_of,
    transaction_name,
    validate_name,
)
from tests.engine.conftest import Node
from tests.polling import wait_until

NAMES = reserve("test")


def test_a_surface_claims_its_owner_once_and_builds_its_names_from_it() -> None:
    assert ReservedNames("test") == NAMES
    assert NAMES.prefix() == "#test/" and NAMES.prefix("records") == "#test/records/"
    assert NAMES.name("records", "b/k") == "#test/records/b/k" and NAMES.migrated == "#test/migrated"
    with pytest.raises(ValueError, match="claimed already"):
        reserve("test")
    for owner in ["", "Test", "a/b", "a#b", "1a", "a" * 33]:
        with pytest.raises(ValueError, match="owner"):
            reserve(owner)


@pytest.mark.parametrize("name", ["#s3/buckets/b", "#stream/meta/a~2Fb", "#x/y/z"])
def test_reserved_names_are_the_engines_not_a_users(name: str, store: SegmentStore) -> None:
    assert validate_name(name) == name and is_reserved(name)
    with pytest.raises(InvalidName):
        validate_segment_name(name)
    store.create(name)
    store.append(name, b"x")
    assert store.read(name).data == b"x"


MALFORMED = ["#", "#s3", "#s3/", "#/a", "#s3/a#b", "#s3/a//b", "a#b", "#s3/" + "a" * 1021]


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_reserved_names_are_refused(name: str, store: SegmentStore) -> None:
    with pytest.raises(InvalidName):
        validate_name(name)
    with pytest.raises(InvalidName):
        store.create(name)


def test_a_reserved_name_is_its_own_parent_and_its_transactions_belong_to_it() -> None:
    upload = NAMES.name("uploads", "u1")
    tx = transaction_name(upload, uuid.uuid4())
    assert parent_of(upload) == upload and not is_internal(upload)
    assert parent_of(tx) == upload and is_internal(tx)
    assert parent_of("a/b#transaction.x") == "a/b" and parent_of("a/b") == "a/b"
    assert container_for(tx, 7) == container_for(upload, 7)


def test_reserved_names_spread_over_the_containers() -> None:
    names = [NAMES.name("staging", str(i)) for i in range(64)]
    assert len({container_for(n, 8) for n in names}) == 8
    assert len({container_for(NAMES.name("data", f"s/{i:016x}"), 8) for i in range(64)}) == 8


def test_listings_show_reserved_names_only_to_a_reserved_prefix(store: SegmentStore) -> None:
    marker = NAMES.name("buckets", "b")
    store.create(marker)
    store.create("b/key")
    store.open_transaction(marker)
    assert [i.name for i in store.list("")[0]] == ["b/key"]
    assert [i.name for i in store.list("#")[0]] == [marker]
    assert [i.name for i in store.list(NAMES.prefix("buckets"))[0]] == [marker]
    assert store.list(marker)[0][0].name == marker  # its transaction stays hidden


def test_idle_reserved_segments_are_not_reaped_but_their_transactions_are(
    make_node: Callable[..., Node],
) -> None:
    store = make_node(transaction_timeout_s=0.2).store
    upload = NAMES.name("uploads", "u1")
    store.create(upload)
    txid = store.open_transaction(upload)

    def aborted() -> bool:
        try:
            store.transaction_info(upload, txid)
        except SegmentNotFound:
            return True
        return False

    wait_until(aborted, "the idle transaction of a reserved segment is aborted")
    time.sleep(0.5)  # past the timeout twice over
    assert store.info(upload).length == 0
