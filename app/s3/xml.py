"""S3's XML documents: a small builder for answers and a tolerant reader for request bodies."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from flask import Response

from app.s3.errors import S3Error

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
Node = tuple[str, "str | int | bool | Iterable[Node] | None"]


def iso8601(unix_s: float) -> str:
    """S3's timestamp form in XML: ``2026-11-23T11:00:00.000Z``."""
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _render(node: Node, out: list[str]) -> None:
    tag, value = node
    if value is None:
        return
    out.append(f"<{tag}>")
    if isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, (str, int)):
        out.append(escape(str(value)))
    else:
        for child in value:
            _render(child, out)
    out.append(f"</{tag}>")


def document(root: str, children: Iterable[Node], *, headers: dict[str, str] | None = None) -> Response:
    """An XML answer ``<root xmlns=...>children</root>``; ``None`` values are left out."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n', f'<{root} xmlns="{NAMESPACE}">']
    for child in children:
        _render(child, out)
    out.append(f"</{root}>")
    return Response("".join(out), headers=headers or {}, content_type="application/xml")


def parse(body: bytes) -> ElementTree.Element:
    """A request body's XML with namespaces dropped from tag names; MalformedXML if it is not XML."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise S3Error("MalformedXML", "The XML you provided was not well-formed.") from None
    for element in root.iter():
        element.tag = element.tag.rpartition("}")[2]
    return root
