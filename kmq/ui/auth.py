"""Who may use the console: the bind rule and the credential check. Pure.

The rule: bound to a loopback name (``127.0.0.1``, ``::1``, ``localhost``)
the console is only reachable from this machine and needs no credential.
Any other address, including the rest of ``127.0.0.0/8`` and ``0.0.0.0``,
needs a token: ``kmq ui`` refuses to start without one. A request then
carries it as ``Authorization: Bearer TOKEN`` (scripts) or as the password
of HTTP basic auth with any user name (browsers prompt for it).
"""

from __future__ import annotations

import base64
import binascii
import hmac

__all__ = ["LOCAL_HOSTS", "needs_token", "authorized"]

LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def needs_token(host: str) -> bool:
    """True unless ``host`` is one of :data:`LOCAL_HOSTS`."""
    return host.strip("[]").lower() not in LOCAL_HOSTS


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (Bearer, or Basic password)."""
    if not header or not token:
        return False
    scheme, _, value = header.partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer":
        given = value
    elif scheme == "basic":
        try:
            given = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    else:
        return False
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))
