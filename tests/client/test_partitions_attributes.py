"""SegmentClient's partitions and attributes against a real server."""

from __future__ import annotations

import itertools
import uuid

import pytest

from client import errors
from client.results import AttributeUpdate
from client.segment_client import SegmentClient


def test_partitions_cover_the_segment_on_append_boundaries(client: SegmentClient, name: str) -> None:
    client.create(name)
    boundaries = {0}
    for i in range(40):
        boundaries.add(client.append(name, bytes([i]) * 10_000).length)
    ranges = client.partitions(name, 64 * 1024)
    assert ranges[0][0] == 0 and ranges[-1][1] == 400_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert len(ranges) > 1
    assert {start for start, _ in ranges} <= boundaries
    assert client.partitions(name) == [(0, 400_000)]


def test_attributes_get_update_and_conditions(client: SegmentClient, name: str) -> None:
    client.create(name)
    key, other = uuid.uuid4(), uuid.uuid4()
    assert client.get_attributes(name, [key, other]) == {str(key): None, str(other): None}
    client.update_attributes(
        name, [AttributeUpdate(key, "replace_if_greater", 5), AttributeUpdate(other, "replace", -3)]
    )
    assert client.get_attributes(name, [key, other]) == {str(key): 5, str(other): -3}
    with pytest.raises(errors.ConditionalCheckFailed):
        client.update_attributes(
            name, [AttributeUpdate(other, "replace", 9), AttributeUpdate(key, "replace_if_greater", 4)]
        )
    assert client.get_attributes(name, [key, other]) == {str(key): 5, str(other): -3}
    client.update_attributes(name, [AttributeUpdate(other, "replace_if_equals", 1, expected=-3)])
    assert client.get_attributes(name, [other]) == {str(other): 1}
