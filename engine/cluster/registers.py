"""Registers: small objects changed only by compare-and-set, the cluster's one coordination primitive.

A cluster of segstore nodes coordinates through its bucket and nothing else
(docs/cluster.md): S3's conditional writes are strongly consistent, so a
PutObject with ``If-None-Match: *`` creates a register only if it is absent
and one with ``If-Match: <ETag>`` replaces it only if nobody changed it since
it was read. Every write carries bytes unique to that write (the callers put
a fresh write id in each record), which is what makes an ambiguous answer
decidable: when a retried write answers 412, the write won if the register
now holds exactly its bytes.

``MemoryRegisters`` is atomic under a lock, so races are tested on it; moto
checks conditions without a lock (two racing conditional PUTs can both
succeed there), so on moto only sequential conflicts are meaningful.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from engine.tier2.s3 import error_code, error_status, make_client, was_retried

# 412: the condition failed; 409: another conditional write of the key was under way (nothing written).
_CONFLICTS = ("PreconditionFailed", "ConditionalRequestConflict")


class RegisterError(Exception):
    """The register store could not be reached or answered an error (transient or not)."""


class RegisterConflict(Exception):
    """The condition of a write failed: the register exists (create) or changed (replace)."""


@dataclass(frozen=True, slots=True)
class Register:
    data: bytes
    version: str  # opaque: the S3 ETag, or a counter in memory


class Registers(Protocol):
    """Compare-and-set registers under one prefix."""

    def read(self, name: str) -> Register | None:
        """The register's bytes and version, or None if there is none."""
        ...

    def create(self, name: str, data: bytes) -> str:
        """Create the register holding ``data`` if it is absent; its version. RegisterConflict if present."""
        ...

    def replace(self, name: str, data: bytes, version: str) -> str:
        """Replace the register if it still has ``version``; the new version. RegisterConflict otherwise."""
        ...

    def names(self, prefix: str) -> list[str]:
        """The names of the registers under ``prefix``, sorted."""
        ...


class MemoryRegisters:
    """Registers in a dict, each write atomic: the binding races are tested on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registers: dict[str, Register] = {}
        self._writes = 0

    def _next_version(self) -> str:
        self._writes += 1
        return f"v{self._writes}"

    def read(self, name: str) -> Register | None:
        with self._lock:
            return self._registers.get(name)

    def create(self, name: str, data: bytes) -> str:
        with self._lock:
            if name in self._registers:
                raise RegisterConflict(f"register {name!r} exists")
            version = self._next_version()
            self._registers[name] = Register(bytes(data), version)
            return version

    def replace(self, name: str, data: bytes, version: str) -> str:
        with self._lock:
            current = self._registers.get(name)
            if current is None or current.version != version:
                raise RegisterConflict(f"register {name!r} changed")
            new_version = self._next_version()
            self._registers[name] = Register(bytes(data), new_version)
            return new_version

    def names(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(name for name in self._registers if name.startswith(prefix))


class S3Registers:
    """Registers as objects in ``bucket`` under ``prefix``, written with S3's conditional PutObject."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client if client is not None else make_client(endpoint_url)

    def read(self, name: str) -> Register | None:
        def get() -> Register | None:
            try:
                answer = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)
            except ClientError as exc:
                if error_code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            with contextlib.closing(answer["Body"]) as body:
                return Register(body.read(), answer["ETag"])

        with _translated("read", name):
            return get()

    def create(self, name: str, data: bytes) -> str:
        return self._put(name, data, IfNoneMatch="*")

    def replace(self, name: str, data: bytes, version: str) -> str:
        try:
            return self._put(name, data, IfMatch=version)
        except RegisterError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and error_code(cause) in ("NoSuchKey", "404"):
                raise RegisterConflict(f"register {name!r} is gone") from None
            raise

    def _put(self, name: str, data: bytes, **condition: str) -> str:
        """One conditional PutObject; a 412 after a retry is a win if the register holds our bytes."""
        with _translated("write", name):
            try:
                key = self.prefix + name
                answer = self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **condition)
                return str(answer["ETag"])
            except ClientError as exc:
                if error_code(exc) not in _CONFLICTS and error_status(exc) != 412:
                    raise
                if was_retried(exc):
                    current = self.read(name)
                    if current is not None and current.data == data:
                        return current.version
                raise RegisterConflict(f"register {name!r}: {error_code(exc) or 412}") from None

    def names(self, prefix: str) -> list[str]:
        def listed() -> list[str]:
            found: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                found.extend(obj["Key"][len(self.prefix):] for obj in page.get("Contents", ()))
            return sorted(found)

        with _translated("list", prefix):
            return listed()


@contextlib.contextmanager
def _translated(what: str, name: str) -> Iterator[None]:
    """botocore's errors as RegisterError; RegisterConflict passes through."""
    try:
        yield
    except ClientError as exc:
        code = error_code(exc) or error_status(exc)
        raise RegisterError(f"S3 {what} of register {name!r} failed: {code}") from exc
    except BotoCoreError as exc:
        raise RegisterError(f"S3 {what} of register {name!r} failed: {exc}") from exc
