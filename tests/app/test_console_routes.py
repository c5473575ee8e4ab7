"""The console's page and assets: served from the package under a strict policy, never as an S3 bucket."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.s3.errors import S3Error
from app.s3.objects import check_bucket_name


@pytest.fixture
def browser(app: Flask) -> FlaskClient:
    """A plain test client: the console's paths are not in openapi.yaml, which the ``client`` checks."""
    return app.test_client()


def test_the_page_and_its_scripts_are_served_with_a_strict_policy(browser: FlaskClient) -> None:
    with browser.get("/console/", buffered=True) as page:  # a file's answer holds the file open until closed
        assert page.status_code == 200 and page.mimetype == "text/html"
        assert b'src="static/js/app.js"' in page.data
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    with browser.get("/console/static/js/app.js", buffered=True) as script:
        assert script.status_code == 200 and script.mimetype == "text/javascript"
    assert browser.get("/console").headers["Location"].endswith("/console/")


def test_console_is_no_bucket(browser: FlaskClient) -> None:
    with pytest.raises(S3Error):
        check_bucket_name("console")
    assert browser.put("/console").status_code == 405
    assert browser.get("/console/some-key").status_code == 404
    assert b"console" not in browser.get("/").data
