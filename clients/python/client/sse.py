"""Server-Sent Events as the native live stream sends them (docs/api.md "Reads", live stream).

``events`` parses a ``text/event-stream`` body, as it arrives, into
``(event type, last event id, data)``; comments (keep-alives) are skipped.
Lines end in ``\\n`` or ``\\r\\n`` (segstore sends ``\\n``; a lone ``\\r``,
which the SSE grammar also allows, is not read as a line end).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

MEDIA_TYPE = "text/event-stream"


def events(read: Callable[[], bytes]) -> Iterator[tuple[str, str | None, str]]:
    """The events of a stream whose next bytes ``read()`` returns (``b""`` at its end).

    An event is dispatched at the blank line that ends it; one cut off by the
    end of the stream is dropped, as the SSE grammar says.
    """
    pending = b""
    kind, last_id = "message", None
    data: list[str] = []
    while chunk := read():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:
                if data:
                    yield kind, last_id, "\n".join(data)
                kind, data = "message", []
            elif not line.startswith(b":"):
                field, _, value = line.decode().partition(":")
                value = value.removeprefix(" ")
                if field == "event":
                    kind = value
                elif field == "data":
                    data.append(value)
                elif field == "id":
                    last_id = value
