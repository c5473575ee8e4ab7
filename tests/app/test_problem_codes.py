"""Every problem ``code`` an answer can carry is in openapi.yaml's ``ProblemCode`` enum, and no other.

A generated SDK parses ``code`` into that enum: a code outside it makes the
SDK crash on the answer (``ValueError: 'NotFound' is not a valid
ProblemCode``) instead of returning the problem.
"""

from __future__ import annotations

import pytest
import werkzeug.exceptions
from flask import Flask, json

import app as segstore_app
from app.errors import STATUS_BY_CODE, problem, render_http_exception, render_segstore_error
from engine import SegstoreError
from tests.app.openapi_check import spec

# The werkzeug errors whose status has a code of its own; the rest are InvalidArgument or Internal.
_OWN_CODES = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
}


def _enum() -> list[str]:
    return spec()["components"]["schemas"]["ProblemCode"]["enum"]


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_the_enum_is_the_table_of_codes() -> None:
    assert len(_enum()) == len(set(_enum()))
    assert set(_enum()) == set(STATUS_BY_CODE)


def test_every_error_class_has_a_code_of_the_table() -> None:
    assert segstore_app.create_app  # every surface's errors are imported with the app
    classes = _subclasses(SegstoreError) | {SegstoreError}
    assert len(classes) > 20
    unknown = {cls.__qualname__: cls.code for cls in classes if cls.code not in STATUS_BY_CODE}
    assert not unknown


def test_a_code_outside_the_table_is_refused() -> None:
    with Flask(__name__).test_request_context("/"), pytest.raises(KeyError):
        problem("Teapot", "not a code of ours")


def test_an_error_with_a_code_outside_the_table_is_an_internal_error() -> None:
    class Stray(SegstoreError):
        code = "Stray"

    with Flask(__name__).test_request_context("/"):
        response = render_segstore_error(Stray("a code nobody listed"))
    assert response.status_code == 500
    assert json.loads(response.get_data())["code"] == "Internal"


@pytest.mark.parametrize(
    "error",
    sorted(werkzeug.exceptions.default_exceptions.values(), key=lambda cls: cls.code or 0),
    ids=lambda cls: cls.__name__,
)
def test_every_werkzeug_error_becomes_a_code_of_the_table(
    error: type[werkzeug.exceptions.HTTPException],
) -> None:
    with Flask(__name__).test_request_context("/v1/segments/a", method="PATCH"):
        if error is werkzeug.exceptions.MethodNotAllowed:
            raised = error(valid_methods=["GET", "HEAD", "OPTIONS", "POST"])
        else:
            raised = error()
        response = render_http_exception(raised)
    body = json.loads(response.get_data())
    assert body["code"] in _enum()
    assert (response.status_code, body["status"]) == (STATUS_BY_CODE[body["code"]][0],) * 2
    status = error.code or 500
    expected = _OWN_CODES.get(status, "InvalidArgument" if status < 500 else "Internal")
    assert body["code"] == expected
    if expected == "MethodNotAllowed":
        assert response.headers["Allow"] == "GET, POST"
