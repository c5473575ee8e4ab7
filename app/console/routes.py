"""The console's routes: its page and its static assets, with a strict Content-Security-Policy.

The policy allows scripts, styles and requests from this origin only, so a
name that slipped into markup could still run nothing; the scripts put every
name in the page as text (``textContent``) in the first place.
"""

from __future__ import annotations

from flask import Blueprint, Response, redirect, send_from_directory

bp = Blueprint("console", __name__, static_folder="static", static_url_path="/console/static")

_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@bp.get("/console")
def bare() -> Response:
    """``/console`` is the console's page at ``/console/``."""
    return redirect("/console/", code=308)  # type: ignore[return-value]


@bp.get("/console/")
def page() -> Response:
    """The console's one page; it shows each view (overview, segments, ...) by the URL's fragment."""
    assert bp.static_folder is not None
    return send_from_directory(bp.static_folder, "index.html", max_age=0)


@bp.after_request
def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = _POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
