"""Secrets of the links: ``kafka.security`` of headwater.yaml, and how a URL's password is shown.

``kafka.security`` is how every Kafka client authenticates and encrypts its link.

One declaration for every client (kafka-python, librdkafka; :mod:`headwater.pipelines.kafka` turns
it into their options)::

    kafka:
      security:
        protocol: SASL_SSL            # PLAINTEXT (the default) | SSL | SASL_SSL
        ca_file: certs/ca.pem         # the authority that signed the brokers' certificates
        cert_file: certs/client.pem   # optional, with key_file: a client certificate (mTLS)
        key_file: certs/client.key
        sasl:
          mechanism: SCRAM-SHA-512
          username: headwater
          password_env: KAFKA_PASSWORD   # or password_file: secrets/kafka-password

A secret is never written in headwater.yaml: only the name of the environment variable or the file
that holds it, so the model (and every repr, log line or ``headwater config`` output of it) holds no
secret. :func:`read_secret` reads it when a client is built. Relative paths resolve against the
config file's folder (:meth:`KafkaSecurity.resolved`).

:func:`redact_url` masks the password of a Redis URL (``rediss://USER:PASSWORD@HOST:PORT``) wherever
one is shown: ``headwater config``, error messages, logs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictStr, model_validator

from headwater.registry.errors import HeadwaterError

MASK = "***"
"""What a password reads as in every message, log line and ``headwater config`` output."""

_SECRET_QUERY = re.compile(r"(?i)([?&][^=&#]*pass[^=&#]*=)[^&]*")  # a value ends at "&", as for redis-py

Protocol = Literal["PLAINTEXT", "SSL", "SASL_SSL"]
Mechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256"]


class SecretError(HeadwaterError, ValueError):
    """A secret named by the config (an environment variable or a file) cannot be read."""


class Secret(str):
    """A secret's text: usable wherever a ``str`` is, but its ``repr`` (logs, dict dumps) is ``'***'``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


class SaslConfig(BaseModel):
    """SASL authentication: a SCRAM user whose password comes from the environment or a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Mechanism = "SCRAM-SHA-512"
    username: StrictStr
    password_env: StrictStr | None = None
    """The environment variable that holds the password."""
    password_file: StrictStr | None = None
    """A file whose content (trailing newline stripped) is the password."""

    @model_validator(mode="after")
    def _one_source(self) -> SaslConfig:
        if (self.password_env is None) == (self.password_file is None):
            msg = (
                "name the password's source exactly once: password_env: VAR or password_file: PATH "
                "(never the password itself)"
            )
            raise ValueError(msg)
        return self


class KafkaSecurity(BaseModel):
    """The security settings of every Kafka client; the default is plaintext without authentication."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Protocol = "PLAINTEXT"
    ca_file: StrictStr | None = None
    """PEM file of the authority that signed the brokers' certificates (SSL, SASL_SSL)."""
    cert_file: StrictStr | None = None
    """PEM client certificate, with ``key_file``: the client authenticates by TLS (mTLS)."""
    key_file: StrictStr | None = None
    sasl: SaslConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        tls = self.protocol in ("SSL", "SASL_SSL")
        if not tls and (self.ca_file or self.cert_file or self.key_file):
            msg = f"ca_file, cert_file and key_file need protocol SSL or SASL_SSL (found {self.protocol})"
            raise ValueError(msg)
        if (self.cert_file is None) != (self.key_file is None):
            msg = "cert_file and key_file go together (a client certificate and its key), or neither"
            raise ValueError(msg)
        if self.protocol == "SASL_SSL" and self.sasl is None:
            msg = "protocol SASL_SSL needs sasl: {mechanism, username, password_env or password_file}"
            raise ValueError(msg)
        if self.protocol != "SASL_SSL" and self.sasl is not None:
            msg = f"sasl needs protocol SASL_SSL (found {self.protocol}): a password only goes over TLS"
            raise ValueError(msg)
        return self

    def resolved(self, root: Path) -> KafkaSecurity:
        """Return these settings with every relative path made absolute against ``root``."""

        def absolute(value: str | None) -> str | None:
            if value is None:
                return None
            path = Path(value).expanduser()
            return str(path if path.is_absolute() else root / path)

        sasl = self.sasl
        if sasl is not None and sasl.password_file is not None:
            sasl = sasl.model_copy(update={"password_file": absolute(sasl.password_file)})
        return self.model_copy(
            update={
                "ca_file": absolute(self.ca_file),
                "cert_file": absolute(self.cert_file),
                "key_file": absolute(self.key_file),
                "sasl": sasl,
            }
        )

    def describe(self) -> str:
        """One line for ``headwater config``: what is used, where each secret comes from, no secret."""
        parts: list[str] = [self.protocol]
        if self.ca_file:
            parts.append(f"ca {self.ca_file}")
        if self.cert_file:
            parts.append(f"client cert {self.cert_file}")
        if self.sasl is not None:
            source = f"${self.sasl.password_env}" if self.sasl.password_env else self.sasl.password_file
            parts.append(f"{self.sasl.mechanism} user {self.sasl.username} (password from {source})")
        return ", ".join(parts)


def read_secret(sasl: SaslConfig, where: str) -> Secret:
    """Read the SASL password from its environment variable or file.

    Raises:
        SecretError: the variable is unset or empty, or the file cannot be read or is empty; the
            message names ``where`` (the setting's ``file:line``) and what to do, never a secret.
    """
    if sasl.password_env is not None:
        value = os.environ.get(sasl.password_env, "")
        if not value:
            msg = (
                f"{where}: kafka.security.sasl.password_env names ${sasl.password_env}, which is not set "
                f"(or empty); export it with the password of Kafka user {sasl.username!r}"
            )
            raise SecretError(msg)
        return Secret(value)
    path = Path(str(sasl.password_file))
    try:
        value = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{where}: kafka.security.sasl.password_file {path} cannot be read ({exc}); fix the path"
        raise SecretError(msg) from exc
    if not value:
        msg = f"{where}: kafka.security.sasl.password_file {path} is empty; write the password in it"
        raise SecretError(msg)
    return Secret(value)


def redact_url(url: str) -> str:
    """Return ``url`` with its password (userinfo or a ``password=`` query option) replaced by ``***``.

    Never raises, whatever the text: it is used in the messages about URLs that cannot be parsed.
    Everything between ``://`` and the last ``@`` after it but the user name is masked, so a password
    holding ``/``, ``?``, ``#`` or ``@`` without percent-encoding is masked too.
    """
    url = _SECRET_QUERY.sub(lambda m: m.group(1) + MASK, url)  # first: its value may hold an "@"
    scheme, sep, rest = url.partition("://")
    prefix, rest = (scheme + sep, rest) if sep else ("", url)
    if "@" in rest:
        userinfo, _, hostpart = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        # Without a colon, "name@host" names a user only (redis-py sends no password): kept.
        if colon:
            url = f"{prefix}{user}:{MASK}@{hostpart}"
    return url
