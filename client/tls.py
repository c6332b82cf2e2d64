"""TLS for every client of the service (RankingClient, IngestClient, the CLI): one set of options, one helper.

:class:`ClientTls` names the authority that signed the service's certificate (``ca_file``; None:
the system's trust store) and, for a service that requires client certificates (mTLS), the client's
certificate and key. It gives the ``ssl.SSLContext`` REST needs (httpx ``verify=``, urllib
``context=``) and the gRPC channel (``secure_channel`` with ``ssl_channel_credentials``).
:meth:`ClientTls.from_env` reads the same three files from the environment (:data:`ENV_CA`,
:data:`ENV_CERT`, :data:`ENV_KEY`), as the ``headwater rank``/``feedback``/``ingest push``
commands do.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_CA = "HEADWATER_TLS_CA"
"""The CA certificate (PEM) the service's certificate is checked against."""
ENV_CERT = "HEADWATER_TLS_CERT"
"""The client's certificate (PEM), sent when the service requires one (mTLS)."""
ENV_KEY = "HEADWATER_TLS_KEY"
"""The client certificate's private key (PEM)."""


class ClientTlsError(ValueError):
    """A TLS option of a client names a file that cannot be used; the message names it and what to do."""


@dataclass(frozen=True)
class ClientTls:
    """How a client checks the service's certificate and proves its own (see the module).

    ``ca_file``: PEM authority the service's certificate must chain to (None: the system's).
    ``cert_file`` and ``key_file``: the client's certificate and key for mTLS (both or neither).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            msg = (
                "a client certificate needs its key and the key its certificate: give both cert_file and"
                f" key_file ({ENV_CERT} and {ENV_KEY}), or neither"
            )
            raise ClientTlsError(msg)
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                msg = f"TLS {name} {path}: no such file; give the PEM file's path"
                raise ClientTlsError(msg)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTls | None:
        """Return the options of :data:`ENV_CA`, :data:`ENV_CERT`, :data:`ENV_KEY`; None if none is set."""
        source = os.environ if env is None else env
        paths = [source.get(name) or None for name in (ENV_CA, ENV_CERT, ENV_KEY)]
        if not any(paths):
            return None
        ca, cert, key = (Path(p) if p else None for p in paths)
        return cls(ca, cert, key)

    @classmethod
    def of(cls, ca: Path | None, cert: Path | None, key: Path | None) -> ClientTls | None:
        """Return the options of these files; None when none is given (plain, or the system's trust)."""
        return None if ca is None and cert is None and key is None else cls(ca, cert, key)

    def ssl_context(self) -> ssl.SSLContext:
        """Return a client ``SSLContext`` verifying the service (and presenting the client certificate)."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            msg = (
                f"TLS files ca {self.ca_file}, cert {self.cert_file}, key {self.key_file}: not usable"
                f" ({exc}); give PEM files, the key unencrypted and matching the certificate"
            )
            raise ClientTlsError(msg) from None
        return context

    def grpc_credentials(self) -> Any:
        """Return the ``grpc.ssl_channel_credentials`` of these files."""
        import grpc

        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def grpc_channel(target: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]] = ()) -> Any:
    """Return a gRPC channel to ``target``: ``secure_channel`` with ``tls``, else ``insecure_channel``."""
    import grpc

    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.grpc_credentials(), options=list(options))


def verify(tls: ClientTls | None) -> ssl.SSLContext | bool:
    """Return httpx's ``verify=``: the context of ``tls``, else True (the system's trust store)."""
    return True if tls is None else tls.ssl_context()
