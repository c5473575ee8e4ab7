"""Assertions shared by the HTTP tests."""

from __future__ import annotations

from werkzeug.test import TestResponse


def assert_problem(response: TestResponse, status: int, code: str) -> dict:
    """The response is an RFC 9457 problem with this status and code; returns its body."""
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True))
    assert response.mimetype == "application/problem+json"
    body = response.get_json(force=True)
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] and body["title"] and body["detail"]
    return body


def segment_state(response: TestResponse) -> tuple[int, int, str]:
    """(Segment-Length, Segment-Start-Offset, Segment-Sealed) of a response."""
    headers = response.headers
    return (
        int(headers["Segment-Length"]),
        int(headers["Segment-Start-Offset"]),
        headers["Segment-Sealed"],
    )
