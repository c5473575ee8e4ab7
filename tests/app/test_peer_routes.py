"""Node-to-node routes on a single node: refused as if absent (cluster nodes: tests/test_cluster_wide.py)."""

from __future__ import annotations

from flask.testing import FlaskClient


def test_a_single_node_answers_peer_calls_with_404(client: FlaskClient) -> None:
    for op in ("list", "heads", "read", "bogus"):
        answer = client.post(f"/v1/peer/{op}", json={}, headers={"Segstore-Peer-Secret": ""})
        assert answer.status_code == 404 and answer.json["code"] == "NotFound"
