"""Access control for both surfaces: who is asking, and whether a grant covers the request.

Principals come from two places:

- bearer tokens, from the TOML file named by ``auth_file``
  (``SEGSTORE_AUTH_FILE``)::

      [[token]]
      name = "ingest"                       # what logs and errors show; never the token
      token = "a-long-random-string"
      grants = [{prefix = "sensors/", access = "write"}]

      [[s3_key]]
      access_key = "AKIAEXAMPLE"            # a key of SEGSTORE_S3_KEYS
      grants = [{prefix = "bucket/", access = "read"}]

- S3 access keys, from ``s3_keys`` (``access:secret,...``); a key without an
  ``[[s3_key]]`` entry has admin on everything when there is no auth file,
  and no grant when there is one.

A grant gives ``read``, ``write`` or ``admin`` (each includes the ones before
it) on every segment name that starts with its prefix (``""``: all names).
Native routes (``/v1/segments/{name}...`` and ``/v1/stream/{name}``, judged by
that name) need read for GET/HEAD and write for every other method; a
merge needs write on its target and on its source (the merge deletes the
source); a stream fork needs read on its source. A listing needs read on
its whole ``prefix``: a grant whose prefix starts the requested one
(otherwise 403; listings are not filtered). The stream API
(``/v1/scopes/...``) is judged by the name ``{scope}/{stream}/`` for a
stream's requests and ``{scope}/`` for a scope's, so a grant on
``{scope}/{stream}`` covers the stream and its data segments
(``{scope}/{stream}/{id}``); the scope listing needs read on every name. A surface adds the other names
a request touches (``add_touches``): the native surface a merge's source,
Durable Streams a fork's source; this module imports no surface.
``/healthz`` and ``/readyz`` are open (probes); ``/metrics`` needs any valid
token. This module is the one place that decides 401 and 403; tokens are
compared in constant time and never logged or echoed. ``judge`` reads a
native request from its WSGI environ alone, so Flask's ``before_request``
and the WSGI shortcuts in front of Flask (``app/shortcut.py``) judge it with
the same code.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import io
import json
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask, current_app, request
from werkzeug.wrappers import Request
from werkzeug.wsgi import get_content_length, get_path_info

from app.settings import HttpSettings
from engine import PEER_PATH, InvalidArgument, SegstoreError

_PEEK_BODY_MAX_BYTES = 64 * 1024
_TOUCHES_KEY = "segstore.auth.touches"
_OPEN_PATHS = ("/healthz", "/readyz")
# Native routes whose path names a segment (or stream) after the prefix.
_NAMED_ROUTES = ("/v1/segments/", "/v1/stream/")
_SCOPES = "/v1/scopes"


class Access(enum.IntEnum):
    """What a grant allows; a larger value includes the smaller ones."""

    READ = 1
    WRITE = 2
    ADMIN = 3


class Unauthorized(SegstoreError):
    """No credentials, or credentials that name no principal (401)."""

    code = "Unauthorized"


class Forbidden(SegstoreError):
    """Known credentials whose grants do not cover the request (403)."""

    code = "Forbidden"


@dataclass(frozen=True)
class Grant:
    prefix: str
    access: Access


@dataclass(frozen=True)
class Principal:
    """A token holder or an S3 access key: a display name and grants."""

    name: str
    grants: tuple[Grant, ...] = field(default=())

    def allows(self, access: Access, name: str) -> bool:
        """True when one grant covers ``name`` (a segment name or name prefix) at ``access``."""
        return any(g.access >= access and name.startswith(g.prefix) for g in self.grants)

    def touches(self, prefix: str) -> bool:
        """True when some grant reaches a name under ``prefix`` (or the prefix itself)."""
        return any(g.prefix.startswith(prefix) or prefix.startswith(g.prefix) for g in self.grants)


ADMIN_ALL = (Grant("", Access.ADMIN),)


@dataclass(frozen=True)
class AuthConfig:
    """Everything auth needs, loaded once per app."""

    # (SHA-256 of the token, principal); neither they nor the secrets appear in a repr.
    tokens: tuple[tuple[bytes, Principal], ...] = field(repr=False)
    s3_secrets: dict[str, str] = field(repr=False)
    s3_principals: dict[str, Principal]
    native_enabled: bool
    loopback: bool

    @property
    def s3_anonymous(self) -> bool:
        """No S3 keys and no auth file, bound to loopback: the S3 surface serves anyone local."""
        return not self.s3_secrets and not self.native_enabled and self.loopback

    def bearer(self, token: str) -> Principal | None:
        """The principal of ``token``: every configured token is compared, in constant time."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, principal in self.tokens:
            if hmac.compare_digest(known, digest):
                found = principal
        return found


def _grants(entry: dict, where: str) -> tuple[Grant, ...]:
    grants = []
    for raw in entry.get("grants", []):
        if not isinstance(raw, dict) or not isinstance(raw.get("prefix"), str):
            raise InvalidArgument(f'{where}: each grant is {{prefix = "...", access = "read|write|admin"}}')
        try:
            access = Access[str(raw.get("access", "")).upper()]
        except KeyError:
            raise InvalidArgument(f"{where}: access must be read, write or admin") from None
        grants.append(Grant(raw["prefix"], access))
    return tuple(grants)


def parse_s3_keys(text: str) -> dict[str, str]:
    """``access:secret,...`` as a dict; whitespace around items is ignored."""
    keys = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        access, colon, secret = item.partition(":")
        if not colon or not access or not secret:
            raise InvalidArgument("setting s3_keys is access:secret,... ; an item lacks its secret")
        keys[access] = secret
    return keys


def load_auth(settings: HttpSettings) -> AuthConfig:
    """Read ``auth_file`` (if set) and ``s3_keys`` into an ``AuthConfig``."""
    secrets = parse_s3_keys(settings.s3_keys)
    tokens: list[tuple[bytes, Principal]] = []
    s3_principals: dict[str, Principal] = {}
    if settings.auth_file:
        try:
            raw = tomllib.loads(Path(settings.auth_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise InvalidArgument(f"setting auth_file: cannot read {settings.auth_file}: {err}") from None
        for i, entry in enumerate(raw.get("token", [])):
            token = entry.get("token")
            if not isinstance(token, str) or len(token) < 16:
                raise InvalidArgument(f"{settings.auth_file}: token #{i + 1} needs a token of 16+ characters")
            principal = Principal(
                str(entry.get("name", f"token#{i + 1}")), _grants(entry, settings.auth_file)
            )
            tokens.append((hashlib.sha256(token.encode("utf-8")).digest(), principal))
        for entry in raw.get("s3_key", []):
            access_key = entry.get("access_key")
            if not isinstance(access_key, str):
                raise InvalidArgument(f"{settings.auth_file}: each [[s3_key]] needs access_key")
            s3_principals[access_key] = Principal(access_key, _grants(entry, settings.auth_file))
    else:
        s3_principals = {key: Principal(key, ADMIN_ALL) for key in secrets}
    return AuthConfig(
        tokens=tuple(tokens),
        s3_secrets=secrets,
        s3_principals={key: s3_principals.get(key, Principal(key)) for key in secrets},
        native_enabled=bool(settings.auth_file),
        loopback=settings.bind_is_loopback,
    )


def config() -> AuthConfig:
    return current_app.extensions["segstore.auth"]


def require(principal: Principal, access: Access, name: str, what: str | None = None) -> None:
    """Raise Forbidden unless ``principal`` has ``access`` on ``name``."""
    if not principal.allows(access, name):
        raise Forbidden(f"{principal.name} may not {access.name.lower()} {what or repr(name)}")


def _bearer_principal(auth: AuthConfig, environ: dict[str, Any]) -> Principal:
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("this server needs Authorization: Bearer <token>")
    principal = auth.bearer(token.strip())
    if principal is None:
        raise Unauthorized("the bearer token is not known")
    return principal


def peek_json_member(environ: dict[str, Any], key: str) -> Any:
    """Member ``key`` of a small JSON object body, read ahead of the view; the body is put back for it.

    None when the body is not such an object.
    """
    stream = environ["wsgi.input"]
    length = get_content_length(environ)
    data = stream.read(_PEEK_BODY_MAX_BYTES + 1 if length is None else min(length, _PEEK_BODY_MAX_BYTES + 1))
    environ["wsgi.input"] = io.BytesIO(data)
    environ["CONTENT_LENGTH"] = str(len(data))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    try:
        return json.loads(data).get(key)
    except (ValueError, AttributeError):
        return None


# (WSGI environ, method, name, custom method) -> the (access, other name, what it is) it also needs.
Touches = Callable[[dict[str, Any], str, str, str], Iterable[tuple[Access, str, str]]]


def add_touches(app: Flask, route: str, touches: Touches) -> None:
    """Judge the other names a request under ``route`` (``/v1/segments/``, ``/v1/stream/``) touches."""
    app.extensions.setdefault(_TOUCHES_KEY, {})[route] = touches


def judge(app: Flask, environ: dict[str, Any]) -> None:
    """Raise Unauthorized (401) or Forbidden (403) unless ``app`` may serve this native request.

    Method, path and query are read as Flask's ``request`` reads them.
    """
    auth: AuthConfig = app.extensions["segstore.auth"]
    if not auth.native_enabled:
        return
    method = environ.get("REQUEST_METHOD", "GET").upper()
    path = "/" + get_path_info(environ).lstrip("/")
    if path in _OPEN_PATHS or method == "OPTIONS":
        return
    if path != "/metrics" and not path.startswith("/v1/"):
        return  # the S3 surface (the bucket "v1" is reserved)
    if path.startswith(PEER_PATH):
        return  # node-to-node calls: app/peer.py checks the cluster's secret instead
    principal = _bearer_principal(auth, environ)
    if path == "/v1/segments":
        prefix = Request(environ, populate_request=False, shallow=True).args.get("prefix", "")
        require(principal, Access.READ, prefix, f"list names starting with {prefix!r}")
        return
    if path == _SCOPES:
        require(principal, Access.READ, "", "list scopes")
        return
    if path.startswith(_SCOPES + "/"):
        require(principal, Access.READ if method in ("GET", "HEAD") else Access.WRITE, _scoped_name(path))
        return
    for route in _NAMED_ROUTES:
        if path.startswith(route):
            name, _, custom = path.removeprefix(route).partition(":")
            break
    else:
        return  # /metrics and unrouted paths: any valid token
    require(principal, Access.READ if method in ("GET", "HEAD") else Access.WRITE, name)
    touches = app.extensions.get(_TOUCHES_KEY, {}).get(route)
    if touches is not None:
        for needed, other, what in touches(environ, method, name, custom):
            require(principal, needed, other, what)


def _scoped_name(path: str) -> str:
    """The name a ``/v1/scopes/...`` request is judged by: ``{scope}/{stream}/``, or ``{scope}/``."""
    parts = path.removeprefix(_SCOPES + "/").split("/")
    if len(parts) >= 3 and parts[1] == "streams":
        return f"{parts[0]}/{parts[2].partition(':')[0]}/"
    return f"{parts[0]}/"


def _native_check() -> None:
    """before_request: the native request Flask is about to dispatch, judged."""
    judge(current_app, request.environ)


def install(app: Flask, settings: HttpSettings) -> None:
    """Load the auth configuration into ``app`` and check every native request before its view."""
    app.extensions["segstore.auth"] = load_auth(settings)
    app.before_request(_native_check)
