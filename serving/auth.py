"""Who is calling: credentials and roles at the service's edges, protocol-neutral.

:class:`Authenticator` takes a request's headers (REST) or metadata (gRPC) as a mapping of
lower-case names to values and the role the call needs, and returns the caller's
:class:`Identity` or raises :class:`Unauthenticated` (REST 401, gRPC UNAUTHENTICATED) or
:class:`Forbidden` (403, PERMISSION_DENIED). The adapters map them; the messages say no more than
``invalid or expired credential`` (why a token failed is counted in
``headwater_auth_refused_total{reason}``, never sent).

A credential is ``Authorization: Bearer <token>``, where the token is either

- an **API key**: the service holds only its SHA-256 (a key is 32 random bytes, so a plain hash is
  enough; see :func:`new_api_key`), compared with every entry in constant time. The entries come
  from ``auth.api_keys_file`` (re-read when its modification time changes: keys rotate without a
  restart) or ``auth.api_keys_env``; each names its roles, user class, own quota;
- a **JWT** (three dot-separated parts) verified against the JWKS of ``auth.jwt`` (a URL or a
  file): the algorithm must be in the allow-list, the ``kid`` known, the signature, ``iss``,
  ``aud``, ``exp`` and ``nbf`` valid; roles and user class come from its claims.

The user class of a request is the credential's (:attr:`Identity.class_source`), never the caller's
own ``x-user-class`` header or body field, except for a credential with the ``gateway`` role, whose
``x-user-class`` header is honoured (a trusted gateway that authenticated the user). With ``auth:
none`` every caller is :data:`OPEN`: every role, and the class it claims.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jwt
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from headwater.registry.errors import HeadwaterError
from headwater.registry.yamlsrc import YamlSyntaxError, parse_yaml
from headwater.serving.config import ROLES, AuthConfig, CredentialQuota, JwtConfig, Role

logger = logging.getLogger(__name__)
AUTHORIZATION = "authorization"
INVALID = "invalid or expired credential"
MISSING = "no credential: send Authorization: Bearer <API key or token>"
JWKS_REFETCH_S = 30.0
"""An unknown ``kid`` fetches the JWKS again at most this often (random kids cannot flood the issuer)."""
JWKS_TIMEOUT_S = 5.0
"""A JWKS fetch waits at most this long (it runs on the request path, on a cache miss only)."""
KEY_PREFIX = "hw_"
VERIFIED_TOKENS = 4096
"""Tokens whose verification is remembered (an RS256 check costs ~40x an API key's: bench_auth.py)."""
VERIFIED_TTL_S = 60.0
"""How long a verified token is trusted without checking its signature again (never past its exp)."""
ClassSource = Literal["credential", "gateway", "caller"]


class AuthError(HeadwaterError):
    """A request without a credential the service accepts for the call (the adapters map it)."""


class Unauthenticated(AuthError):
    """No credential, or one that is invalid or expired: REST 401, gRPC UNAUTHENTICATED."""


class Forbidden(AuthError):
    """A valid credential without the role the call needs: REST 403, gRPC PERMISSION_DENIED."""


class AuthConfigError(HeadwaterError, ValueError):
    """The key file (or variable) or the JWKS cannot be read; the message names it and the fix."""


@dataclass(frozen=True)
class Identity:
    """The caller: its name (key id or token subject), roles, user class and own quota."""

    subject: str
    roles: frozenset[str]
    user_class: str | None = None
    """The credential's class (None: the admission's default class)."""
    quota: CredentialQuota | None = None
    """The credential's own bucket, taken on top of its class's."""
    class_source: ClassSource = "credential"
    """Where the request's class comes from: the credential; a gateway's ``x-user-class`` header
    (then the credential's); the caller's own claim (``auth: none`` only)."""


OPEN = Identity("anonymous", frozenset(ROLES) - {"unsolicited"}, None, None, "caller")
"""Every caller with ``auth: none``: every role but ``unsolicited``, the class it claims (loopback
only). Not ``unsolicited``: a page in the user's browser can post to a loopback service, so without
credentials feedback stays limited to items served to that user (``feedback.trust.allow_unsolicited``
lifts that for a deployment whose every caller is trusted)."""


class KeyEntry(BaseModel):
    """One API key of the key document: only its SHA-256 is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128)
    """The key's name in logs and metrics (never the key)."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the key's UTF-8 bytes."""
    roles: tuple[Role, ...] = Field(min_length=1)
    user_class: str | None = None
    quota: CredentialQuota | None = None


class KeyDocument(BaseModel):
    """The key file's (or variable's) content: ``keys: [...]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: tuple[KeyEntry, ...] = ()


def new_api_key() -> tuple[str, str]:
    """Return a fresh API key and its hex SHA-256 (the key goes to the caller, the hash to the key file)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key_hash(key)


def add_api_key(path: Path, key_id: str, roles: Collection[Role], user_class: str | None = None) -> str:
    """Add a fresh key named ``key_id`` to the key file at ``path`` (created if absent); return the key.

    The file is replaced whole (a new inode, a new mtime), so a running service reads it at its next
    check. Only the key's hash is written: the key itself is returned once and never stored here.
    """
    entries = list(parse_keys(path.read_text(encoding="utf-8"), str(path))) if path.exists() else []
    if any(e.id == key_id for e in entries):
        msg = f"API keys {path}: a key named {key_id!r} exists; pick another id (remove the old one later)"
        raise AuthConfigError(msg)
    key, digest = new_api_key()
    entries.append(KeyEntry(id=key_id, sha256=digest, roles=tuple(roles), user_class=user_class))
    doc = KeyDocument(keys=tuple(entries)).model_dump(mode="json", exclude_none=True)
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(fresh, path)
    return key


def key_hash(key: str) -> str:
    """Return the hex SHA-256 of ``key``'s UTF-8 bytes (lone surrogates kept: any str has a hash)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def parse_keys(text: str, where: str) -> tuple[KeyEntry, ...]:
    """Read a key document (YAML or JSON); raise :class:`AuthConfigError` naming ``where`` and the line."""
    try:
        doc = parse_yaml(text)
    except YamlSyntaxError as exc:
        msg = f"API keys {where}:{exc.line}: {exc}"
        raise AuthConfigError(msg) from exc
    try:
        entries = KeyDocument.model_validate(doc.data if doc.data is not None else {}).keys
    except ValidationError as exc:
        problems = "; ".join(
            f"line {doc.line_of(tuple(e['loc']))}: {'.'.join(map(str, e['loc'])) or 'top'}: {e['msg']}"
            for e in exc.errors()
        )
        msg = f"API keys {where}: {problems}"
        raise AuthConfigError(msg) from exc
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        msg = (
            f"API keys {where}: key ids must be unique; {sorted({i for i in ids if ids.count(i) > 1})} repeat"
        )
        raise AuthConfigError(msg)
    return entries


class Watched:
    """A file read again when its (mtime, size, inode) changes, looked at most every ``every_s``.

    A rewrite that does not parse keeps the last good content (logged): a half-written key file
    must not lock every caller out.
    """

    def __init__(
        self, path: Path, read: Callable[[str], Any], every_s: float, clock: Callable[[], float]
    ) -> None:
        self.path, self._read, self._every, self._clock = path, read, every_s, clock
        self._lock = threading.Lock()
        self._seen, self.value = self._load()
        self._checked = clock()

    def _stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _load(self) -> tuple[tuple[int, int, int], Any]:
        try:
            stamp = self._stamp()
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"{self.path}: cannot be read ({exc}); give an existing UTF-8 file"
            raise AuthConfigError(msg) from exc
        return stamp, self._read(text)

    def current(self) -> Any:
        """Return the content, re-read first if the file changed since it was last looked at."""
        now = self._clock()
        if now - self._checked < self._every:
            return self.value
        with self._lock:
            self._checked = now
            try:
                changed = self._stamp() != self._seen
            except OSError:
                changed = False  # gone for a moment (an editor's rename): keep what we have
            if changed:
                try:
                    self._seen, self.value = self._load()
                    logger.info("re-read %s after it changed", self.path)
                except AuthConfigError as exc:
                    logger.error("%s; keeping the previous content", exc)
        return self.value


class JwtVerifier:
    """Verifies bearer tokens against a JWKS (URL: fetched and cached; file: re-read when it changes)."""

    def __init__(self, config: JwtConfig, every_s: float, clock: Callable[[], float]) -> None:
        self.config, self._clock = config, clock
        self._client: jwt.PyJWKClient | None = None
        self._file: Watched | None = None
        self._fetched_at = -JWKS_REFETCH_S
        self._set: jwt.PyJWKSet | None = None
        if config.jwks.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(
                config.jwks, cache_keys=False, lifespan=config.jwks_cache_s, timeout=JWKS_TIMEOUT_S
            )
            try:
                self._refresh()
            except jwt.PyJWTError as exc:  # the issuer may be back before the first token arrives
                logger.warning(
                    "JWKS %s not fetched at start (%s); fetched on the first token", config.jwks, exc
                )
        else:
            path = Path(config.jwks)
            self._file = Watched(path, lambda text: _jwk_set(text, path), every_s, clock)

    def _refresh(self) -> None:
        assert self._client is not None
        self._fetched_at = self._clock()
        self._set = self._client.get_jwk_set(refresh=True)

    def _key(self, kid: str | None) -> jwt.PyJWK:
        if self._file is not None:
            found = _find(self._file.current(), kid)
        else:
            found = _find(self._set, kid) if self._set is not None else None
            stale = self._clock() - self._fetched_at >= JWKS_REFETCH_S
            if (found is None and stale) or self._clock() - self._fetched_at >= self.config.jwks_cache_s:
                self._refresh()
                found = _find(self._set, kid)
        if found is None:
            msg = f"no key {kid!r} in the JWKS"
            raise jwt.InvalidKeyError(msg)
        return found

    def claims(self, token: str) -> dict[str, Any]:
        """Return the verified claims of ``token``; raise :class:`jwt.PyJWTError` when it is not valid."""
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if alg not in self.config.algorithms:  # checked before any key is looked for: 'none' stops here
            msg = f"algorithm {alg!r} is not allowed"
            raise jwt.InvalidAlgorithmError(msg)
        kid = header.get("kid")
        key = self._key(kid if isinstance(kid, str) else None)
        # The allow-list holds asymmetric algorithms only, and each prepares only its own key type:
        # a public key cannot be used as an HMAC secret, an EC key not for RS256.
        c = self.config
        claims: dict[str, Any] = jwt.decode(
            token, key.key, algorithms=[alg], audience=c.audience, issuer=c.issuer, leeway=c.leeway_s,
            options={"require": ["exp", "iss", "aud", "sub"]},
        )  # fmt: skip
        return claims


def _jwk_set(text: str, path: Path) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_json(text)
    except (jwt.PyJWTError, ValueError) as exc:
        msg = f"JWKS {path}: not a JWKS with a usable key ({exc}); give the issuer's jwks_uri document"
        raise AuthConfigError(msg) from exc


def _find(keys: jwt.PyJWKSet | None, kid: str | None) -> jwt.PyJWK | None:
    if keys is None:
        return None
    if kid is None:  # a token without a kid: only a set of one key can say which
        return keys.keys[0] if len(keys.keys) == 1 else None
    for key in keys.keys:
        if key.key_id == kid:
            return key
    return None


def _roles_of(claim: Any) -> frozenset[str]:
    if isinstance(claim, str):
        return frozenset(claim.split())
    if isinstance(claim, list):
        return frozenset(r for r in claim if isinstance(r, str))
    return frozenset()


class Authenticator:
    """Turns a request's headers into an :class:`Identity`, or refuses it (module docstring)."""

    def __init__(
        self,
        config: AuthConfig | Literal["none"] | None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if isinstance(config, AuthConfig) else None
        self._file: Watched | None = None
        self._env: tuple[KeyEntry, ...] = ()
        self._jwt: JwtVerifier | None = None
        c = self.config
        if c is not None:
            if c.api_keys_file is not None:
                path = c.api_keys_file
                self._file = Watched(
                    path, lambda text: _digests(parse_keys(text, str(path))), c.reload_check_s, clock
                )
            if c.api_keys_env is not None:
                text = os.environ.get(c.api_keys_env)
                if text is None:
                    msg = f"auth.api_keys_env: {c.api_keys_env} is not set; export the key document in it"
                    raise AuthConfigError(msg)
                self._env = parse_keys(text, f"${c.api_keys_env}")
            if c.jwt is not None:
                self._jwt = JwtVerifier(c.jwt, c.reload_check_s, clock)
        self._env_digests = _digests(self._env)
        self._verified: OrderedDict[str, tuple[Identity, float, float]] = OrderedDict()
        """Verified tokens: identity, exp (wall clock), recheck at (monotonic)."""
        self._clock = clock
        self.refused = Counter(
            "headwater_auth_refused",
            "Requests refused at the edge by reason (missing, invalid, expired, forbidden).",
            ["reason"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        for reason in ("missing", "invalid", "expired", "forbidden"):
            self.refused.labels(reason)

    @property
    def open(self) -> bool:
        """Whether the service runs without credentials (``auth: none``, or no auth section in process)."""
        return self.config is None

    def needs(self, path_role: Role | None) -> bool:
        """Whether a call needing ``path_role`` (None: a public route) is checked at all."""
        return path_role is not None and not self.open

    def authenticate(self, headers: Mapping[str, str], role: Role) -> Identity:
        """Return the caller's identity if it may act as ``role``; raise Unauthenticated or Forbidden."""
        if self.config is None:
            return OPEN
        value = headers.get(AUTHORIZATION)
        if value is None or not value.strip():
            self.refused.labels("missing").inc()
            raise Unauthenticated(MISSING)
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            self.refused.labels("invalid").inc()
            raise Unauthenticated(INVALID)
        identity = self._jwt_identity(token) if token.count(".") == 2 else self._key_identity(token)
        if role not in identity.roles:
            self.refused.labels("forbidden").inc()
            msg = f"this credential may not call this ({role!r} role needed)"
            raise Forbidden(msg)
        return identity

    def _key_identity(self, token: str) -> Identity:
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: KeyEntry | None = None
        entries = (self._file.current() if self._file is not None else ()) + self._env_digests
        for stored, entry in entries:  # every entry compared, in constant time: no early exit
            if hmac.compare_digest(stored, digest):
                found = entry
        if found is None:
            self.refused.labels("invalid").inc()
            raise Unauthenticated(INVALID)
        return _identity(f"key:{found.id}", frozenset(found.roles), found.user_class, found.quota)

    def _jwt_identity(self, token: str) -> Identity:
        if self._jwt is None:
            self.refused.labels("invalid").inc()
            raise Unauthenticated(INVALID)
        known = self._verified.get(token)
        if known is not None and known[1] > time.time() and known[2] > self._clock():
            return known[0]
        try:
            claims = self._jwt.claims(token)
        except jwt.ExpiredSignatureError as exc:
            self.refused.labels("expired").inc()
            raise Unauthenticated(INVALID) from exc
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:  # malformed, bad signature, claims
            logger.debug("token refused: %s", exc)
            self.refused.labels("invalid").inc()
            raise Unauthenticated(INVALID) from exc
        c = self._jwt.config
        user_class = claims.get(c.class_claim)
        identity = _identity(
            f"sub:{claims['sub']}", _roles_of(claims.get(c.roles_claim)) & set(ROLES),
            user_class if isinstance(user_class, str) else None, c.subject_quota,
        )  # fmt: skip
        # Remembered for a minute (never past exp): a client sends the same token on every call.
        self._verified[token] = (identity, float(claims["exp"]), self._clock() + VERIFIED_TTL_S)
        while len(self._verified) > VERIFIED_TOKENS:
            self._verified.popitem(last=False)
        return identity


def _identity(
    subject: str, roles: frozenset[str], user_class: str | None, quota: CredentialQuota | None
) -> Identity:
    source: ClassSource = "gateway" if "gateway" in roles else "credential"
    return Identity(subject, roles, user_class, quota, source)


def _digests(entries: Collection[KeyEntry]) -> tuple[tuple[bytes, KeyEntry], ...]:
    return tuple((bytes.fromhex(e.sha256), e) for e in entries)
