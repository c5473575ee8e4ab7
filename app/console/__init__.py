"""The console: a read-only view of the node in the browser, served under ``/console/``.

Static HTML, CSS and JavaScript shipped in the package (no build step); the
page reads only the public HTTP API and ``/metrics``, with the bearer token
the user gives it (kept in the tab's ``sessionStorage``), so it shows
nothing a token could not read with curl. The path ``console`` is therefore
no S3 bucket name (``app/s3/objects.RESERVED_BUCKETS``).
"""

from app.console.routes import bp

__all__ = ["bp"]
