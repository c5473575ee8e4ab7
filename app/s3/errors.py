"""S3 errors: one exception and one table from S3 error code to HTTP status.

``answers`` translates engine errors met on the S3 surface and renders each
error as an S3 ``<Error>`` document.
"""

from __future__ import annotations

STATUS_BY_CODE: dict[str, int] = {
    "AuthorizationHeaderMalformed": 400,
    "BadDigest": 400,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "IllegalLocationConstraintException": 400,
    "IncompleteBody": 400,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartOrder": 400,
    "InvalidRequest": 400,
    "InvalidWriteOffset": 400,
    "KeyTooLongError": 400,
    "MalformedXML": 400,
    "MetadataTooLarge": 400,
    "XAmzContentSHA256Mismatch": 400,
    "AccessDenied": 403,
    "InvalidAccessKeyId": 403,
    "RequestTimeTooSkewed": 403,
    "SignatureDoesNotMatch": 403,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "MethodNotAllowed": 405,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "OperationAborted": 409,
    "MissingContentLength": 411,
    "PreconditionFailed": 412,
    "InvalidPartNumber": 416,
    "InvalidRange": 416,
    "InternalError": 500,
    "NotImplemented": 501,
    "ServiceUnavailable": 503,
    "SlowDown": 503,
}


class S3Error(Exception):
    """An S3 error answer: ``code`` from the table, a message, and extra headers."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS_BY_CODE[code]
        self.headers = headers or {}
