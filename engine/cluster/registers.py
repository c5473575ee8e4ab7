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

``FolderRegisters`` keeps them as files in a folder, for the processes of
one node that share a data folder (docs/design.md "Processes per node"): a
create links a written file into place (which fails if one is there), a
replace renames one over it under an ``flock``, so both are atomic between
processes as S3's conditional writes are between nodes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from engine.blocking import run_blocking, sync_folder
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


class FolderRegisters:
    """Registers as files under ``root``, atomic between the processes that share it.

    A file holds its version (a fresh id per write) on its first line, then
    the bytes. ``create`` writes a temporary file and links it to the
    register's name, which fails if the name exists; ``replace`` checks the
    version and renames a written file over the register, both under an
    ``flock`` of ``root/.lock`` that every replace takes. Each write is synced
    before it is visible, and its folder after. The disk calls run off the
    gevent hub (``run_blocking``).
    """

    _LOCK = ".lock"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        assert name and not name.startswith((".", "/")) and ".." not in name.split("/"), name
        return self.root / name

    def read(self, name: str) -> Register | None:
        return run_blocking(self._read, name)

    def _read(self, name: str) -> Register | None:
        try:
            raw = self._path(name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegisterError(f"read of register {name!r} failed: {exc}") from exc
        version, _, data = raw.partition(b"\n")
        return Register(data, version.decode("ascii"))

    def create(self, name: str, data: bytes) -> str:
        return run_blocking(self._create, name, data)

    def _create(self, name: str, data: bytes) -> str:
        path = self._path(name)
        version, temp = self._written(path, data)
        try:
            os.link(temp, path)
        except FileExistsError:
            raise RegisterConflict(f"register {name!r} exists") from None
        except OSError as exc:
            raise RegisterError(f"write of register {name!r} failed: {exc}") from exc
        finally:
            temp.unlink(missing_ok=True)
        sync_folder(path.parent)
        return version

    def replace(self, name: str, data: bytes, version: str) -> str:
        return run_blocking(self._replace, name, data, version)

    def _replace(self, name: str, data: bytes, version: str) -> str:
        path = self._path(name)
        new_version, temp = self._written(path, data)
        try:
            with self._locked():
                current = self._read(name)
                if current is None or current.version != version:
                    raise RegisterConflict(f"register {name!r} changed")
                os.rename(temp, path)
        except OSError as exc:
            raise RegisterError(f"write of register {name!r} failed: {exc}") from exc
        finally:
            temp.unlink(missing_ok=True)
        sync_folder(path.parent)
        return new_version

    def _written(self, path: Path, data: bytes) -> tuple[str, Path]:
        """A new version, and a synced temporary file beside ``path`` holding it and ``data``."""
        version = uuid.uuid4().hex
        temp = path.parent / f".{path.name}.{version}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(version.encode("ascii") + b"\n" + bytes(data))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise RegisterError(f"write of register {path.name!r} failed: {exc}") from exc
        return version, temp

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / self._LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the flock

    def names(self, prefix: str) -> list[str]:
        return run_blocking(self._names, prefix)

    def _names(self, prefix: str) -> list[str]:
        found: list[str] = []
        try:
            for folder, dirs, files in os.walk(self.root):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                base = os.path.relpath(folder, self.root)
                for file in files:
                    name = file if base == "." else f"{base}/{file}"
                    if not file.startswith(".") and name.startswith(prefix):
                        found.append(name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise RegisterError(f"listing of registers {prefix!r} failed: {exc}") from exc
        return sorted(found)



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
