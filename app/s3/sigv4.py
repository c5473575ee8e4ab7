"""AWS Signature V4 checks, header form and presigned URL, recomputed with botocore's signer.

The request is rebuilt as a botocore ``AWSRequest`` holding exactly the
headers the client signed, the canonical path (the decoded path encoded
once, as S3 does) and the decoded query parameters; botocore's
``S3SigV4Auth`` / ``S3SigV4QueryAuth`` then compute the canonical request,
the string to sign and the signature, which is compared in constant time.
A signed request may be up to 15 minutes off the server's clock; a
presigned URL is good from its date until date + ``X-Amz-Expires``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials
from flask import Request

from app.auth import ADMIN_ALL, AuthConfig, Principal
from app.s3.errors import S3Error

CLOCK_SKEW_MAX_S = 15 * 60
PRESIGN_EXPIRES_MAX_S = 7 * 24 * 3600
_ALGORITHM = "AWS4-HMAC-SHA256"
_TIMESTAMP = "%Y%m%dT%H%M%SZ"
_AUTH_FIELD = re.compile(r"(\w+)=([^,\s]*)")
ANONYMOUS = Principal("anonymous", ADMIN_ALL)


@dataclass(frozen=True)
class Signing:
    """What an aws-chunked body with chunk signatures is checked against."""

    key: bytes
    timestamp: str
    scope: str
    seed_signature: str

    def chunk_signature(self, previous: str, chunk_sha256: str) -> str:
        string_to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                self.timestamp,
                self.scope,
                previous,
                hashlib.sha256(b"").hexdigest(),
                chunk_sha256,
            ]
        )
        return hmac.new(self.key, string_to_sign.encode(), hashlib.sha256).hexdigest()

    def trailer_signature(self, previous: str, trailer: bytes) -> str:
        string_to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-TRAILER",
                self.timestamp,
                self.scope,
                previous,
                hashlib.sha256(trailer).hexdigest(),
            ]
        )
        return hmac.new(self.key, string_to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Verdict:
    principal: Principal
    signing: Signing | None  # None for anonymous requests


class _AsSent:
    """Signs exactly the headers the client listed, at the canonical path of the request.

    botocore picks the headers to sign itself and normalizes the path; a
    verifier must take the client's choice instead.
    """

    signed: tuple[str, ...] = ()
    path = "/"

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        chosen = HTTPHeaders()
        for name in self.signed:
            chosen[name] = request.headers.get(name, "")
        return chosen

    def _normalize_url_path(self, path: str) -> str:
        return self.path


class _HeaderVerifier(_AsSent, S3SigV4Auth):
    pass


class _QueryVerifier(_AsSent, S3SigV4QueryAuth):
    pass


def canonical_path(req: Request) -> str:
    """The path decoded then URI-encoded once (``/`` and ``~`` kept), as S3 signs it."""
    raw = req.environ.get("PATH_INFO", "/").encode("latin-1")
    return quote(raw, safe="/~")


def query_pairs(req: Request) -> list[tuple[str, str]]:
    """The query parameters, percent-decoded (a ``+`` stays a plus), in the order given."""
    pairs = []
    for item in req.environ.get("QUERY_STRING", "").split("&"):
        if item:
            key, _, value = item.partition("=")
            pairs.append((unquote(key), unquote(value)))
    return pairs


def _parse_time(text: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(text, _TIMESTAMP).replace(tzinfo=dt.UTC)
    except ValueError:
        raise S3Error("AccessDenied", f"the request date {text!r} is not YYYYMMDDTHHMMSSZ") from None


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _credential(text: str) -> tuple[str, str, str, str]:
    parts = text.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise S3Error(
            "AuthorizationHeaderMalformed",
            f"the credential {text!r} is not AK/date/region/service/aws4_request",
        )
    return parts[0], parts[1], parts[2], parts[3]


def verify(req: Request, auth: AuthConfig, now: dt.datetime | None = None) -> Verdict:
    """The principal behind ``req``, or an S3Error (AccessDenied, SignatureDoesNotMatch, ...)."""
    now = now or dt.datetime.now(dt.UTC)
    header = req.headers.get("Authorization", "")
    query = query_pairs(req)
    params = dict(query)
    presigned = params.get("X-Amz-Algorithm") == _ALGORITHM
    if not header and not presigned:
        if auth.s3_anonymous:
            return Verdict(ANONYMOUS, None)
        raise S3Error("AccessDenied", "this server needs requests signed with AWS Signature V4")
    if header and not header.startswith(_ALGORITHM + " "):
        raise S3Error("AccessDenied", "only AWS Signature V4 (AWS4-HMAC-SHA256) is supported")
    if not auth.s3_secrets:
        if auth.s3_anonymous:  # signed with whatever the client had: nothing to check it against
            return Verdict(ANONYMOUS, None)
        raise S3Error("AccessDenied", "no S3 keys are configured (SEGSTORE_S3_KEYS)")
    if presigned:
        fields = {
            "Credential": params.get("X-Amz-Credential", ""),
            "SignedHeaders": params.get("X-Amz-SignedHeaders", ""),
            "Signature": params.get("X-Amz-Signature", ""),
        }
        timestamp = params.get("X-Amz-Date", "")
    else:
        fields = dict(_AUTH_FIELD.findall(header[len(_ALGORITHM) :]))
        timestamp = req.headers.get("X-Amz-Date", "")
    access_key, date, region, service = _credential(fields.get("Credential", ""))
    secret = auth.s3_secrets.get(access_key)
    if secret is None:
        raise S3Error(
            "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
        )
    when = _parse_time(timestamp)
    if presigned:
        expires = params.get("X-Amz-Expires", "")
        if not expires.isdigit() or int(expires) > PRESIGN_EXPIRES_MAX_S:
            raise S3Error("AccessDenied", "X-Amz-Expires must be a number of seconds up to 604800")
        if now > when + dt.timedelta(seconds=int(expires)):
            raise S3Error("AccessDenied", "Request has expired")
        if when - now > dt.timedelta(seconds=CLOCK_SKEW_MAX_S):
            raise S3Error("AccessDenied", "Request is not valid yet")
    elif abs((now - when).total_seconds()) > CLOCK_SKEW_MAX_S:
        raise S3Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the server's time is too large.",
        )
    if date != timestamp[:8]:
        raise S3Error("SignatureDoesNotMatch", "the credential's date is not the request's date")
    signed = [name.strip() for name in fields.get("SignedHeaders", "").lower().split(";") if name.strip()]
    if "host" not in signed:
        raise S3Error("AccessDenied", "the Host header must be signed")
    verifier = _QueryVerifier if presigned else _HeaderVerifier
    signer = verifier(Credentials(access_key, secret), service, region)
    signer.signed = tuple(signed)
    signer.path = canonical_path(req)
    # A header sent twice is signed as its values joined by commas, as botocore joins them.
    headers = {name: ",".join(req.headers.getlist(name)) if name != "host" else req.host for name in signed}
    if not presigned:
        payload = req.headers.get("X-Amz-Content-SHA256")
        if payload is None:
            raise S3Error("InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
        headers["X-Amz-Content-SHA256"] = payload
    unsigned_query = [(k, v) for k, v in query if k != "X-Amz-Signature"]
    aws_request = AWSRequest(
        method=req.method, url=f"http://{req.host}/", headers=headers, params=unsigned_query
    )
    aws_request.context["timestamp"] = timestamp
    canonical = signer.canonical_request(aws_request)
    expected = signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)
    if not hmac.compare_digest(expected, fields.get("Signature", "")):
        raise S3Error(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method.",
        )
    principal = auth.s3_principals[access_key]
    key = _signing_key(secret, date, region, service)
    return Verdict(principal, Signing(key, timestamp, f"{date}/{region}/{service}/aws4_request", expected))
