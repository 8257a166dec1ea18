"""TLS client contexts, built once at start-up from a component's settings: the Kafka clients' and the proxy's to
its ``https://`` backends.

One rule for both: the CAs of ``cafile`` (else the system's), the client certificate and its key when given, the
peer's certificate always verified, its host name checked unless the settings turn that off. A file that cannot be
loaded stops the process at start-up with a ``ConfigError`` naming the settings group and the files, rather than
failing the first connection.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from tokenpools.errors import ConfigError, ConfigProblem


def client_context(*, group: str, prefix: str, cafile: Path | None = None, certfile: Path | None = None,
                   keyfile: Path | None = None, key_password: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A verifying TLS client context; an error names the settings group and the files by their settings' names
    (``<prefix>cafile``, ...)."""
    try:
        context = ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)
        if certfile is not None:
            context.load_cert_chain(str(certfile), str(keyfile) if keyfile is not None else None, key_password)
    except (ssl.SSLError, OSError) as exc:
        files = ", ".join(f"{prefix}{name}={value}" for name, value in
                          (("cafile", cafile), ("certfile", certfile), ("keyfile", keyfile)) if value is not None)
        raise ConfigError([ConfigProblem(f"{group} settings", f"cannot load the TLS files "
                                         f"({files or 'system CAs'}): {exc}", path=group)]) from None
    context.check_hostname = check_hostname
    return context
