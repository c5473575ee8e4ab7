"""Node-to-node calls (``/v1/peer/<op>``): the HTTP side of ``engine/cluster/peer_service.py``.

Only the nodes of a cluster use these routes, to serve each other's
whole-cluster operations (docs/cluster.md "Whole-cluster operations"). A
single node answers 404, a call without the cluster's secret 403 (the secret
is compared in constant time and never echoed). Client tokens play no part:
``auth`` leaves these paths to this check.
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app, request

from app.errors import problem
from engine import PEER_PATH, PEER_SECRET_HEADER, PeerService, SegmentStore

bp = Blueprint("peer", __name__)
_SERVICE_KEY = "segstore.peer"


def init_app(app: Flask, store: SegmentStore) -> None:
    app.extensions[_SERVICE_KEY] = PeerService(store)
    app.register_blueprint(bp)


@bp.post(PEER_PATH + "<op>", provide_automatic_options=False)
def call(op: str) -> Response:
    """One call of another node of the cluster, answered by the engine's peer service."""
    service: PeerService = current_app.extensions[_SERVICE_KEY]
    if not service.enabled or not service.knows(op):
        return problem("NotFound", "no such route")
    if not service.admits(request.headers.get(PEER_SECRET_HEADER)):
        return problem("Forbidden", "node-to-node calls need the cluster's secret")
    status, body = service.answer(op, request.get_data())
    return Response(body, status=status, content_type="application/json")
