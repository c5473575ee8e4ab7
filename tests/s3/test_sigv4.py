"""Signature V4 checks in-process: clock skew, signed headers, the anonymous loopback mode."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from flask import Flask
from flask import request as flask_request

from app.auth import load_auth
from app.s3 import sigv4
from app.s3.errors import S3Error
from app.settings import HttpSettings

KEYS = "AKIDUNIT:unit-secret"


def _signed(url: str, secret: str = "unit-secret", headers: dict[str, str] | None = None) -> AWSRequest:
    request = AWSRequest(method="GET", url=url, headers=headers or {})
    S3SigV4Auth(Credentials("AKIDUNIT", secret), "s3", "us-east-1").add_auth(request)
    return request


def _verify(request: AWSRequest, settings: HttpSettings, *, now: dt.datetime | None = None, **extra: str):
    app = Flask(__name__)
    path, _, query = request.url.removeprefix("http://localhost").partition("?")
    headers = {**dict(request.headers.items()), **extra}
    with app.test_request_context(path, query_string=query, headers=headers, base_url="http://localhost"):
        return sigv4.verify(flask_request, load_auth(settings), now)


def test_a_botocore_signature_verifies() -> None:
    request = _signed("http://localhost/bucket/some%20key?list-type=2&prefix=a%2Fb")
    verdict = _verify(request, HttpSettings(s3_keys=KEYS))
    assert verdict.principal.name == "AKIDUNIT"
    assert verdict.signing is not None


def test_a_changed_signed_header_or_query_fails() -> None:
    request = _signed("http://localhost/bucket/key?list-type=2", headers={"X-Amz-Meta-A": "1"})
    with pytest.raises(S3Error) as err:
        _verify(request, HttpSettings(s3_keys=KEYS), **{"X-Amz-Meta-A": "2"})
    assert err.value.code == "SignatureDoesNotMatch"
    request.url = request.url.replace("list-type=2", "list-type=1")
    with pytest.raises(S3Error) as err:
        _verify(request, HttpSettings(s3_keys=KEYS))
    assert err.value.code == "SignatureDoesNotMatch"


def test_clock_skew_of_15_minutes() -> None:
    request = _signed("http://localhost/bucket")
    now = dt.datetime.now(dt.UTC)
    _verify(request, HttpSettings(s3_keys=KEYS), now=now + dt.timedelta(minutes=14))
    with pytest.raises(S3Error) as err:
        _verify(request, HttpSettings(s3_keys=KEYS), now=now + dt.timedelta(minutes=16))
    assert err.value.code == "RequestTimeTooSkewed"


def test_anonymous_only_without_keys_auth_file_and_on_loopback(tmp_path) -> None:
    request = _signed("http://localhost/bucket", secret="anything")
    assert _verify(request, HttpSettings()).principal is sigv4.ANONYMOUS
    with pytest.raises(S3Error) as err:
        _verify(request, HttpSettings(bind="0.0.0.0:80"))
    assert err.value.code == "AccessDenied"
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text("")
    with pytest.raises(S3Error) as err:
        _verify(request, HttpSettings(auth_file=str(auth_file)))
    assert err.value.code == "AccessDenied"
