"""OAUTHBEARER tokens for kafka-python, from a file or a command, refreshed before expiry.

kafka-python asks its ``sasl_oauth_token_provider`` for a token on every new
connection (and on re-authentication). :class:`TokenProvider` answers from a
cached token and fetches a new one when 80 % of the token's lifetime has
passed, so a token is never sent close to its expiry.

Where the token comes from (``kafka.sasl_oauth_token_file`` or
``kafka.sasl_oauth_token_command``) may print either

* the bare token (a JWT's ``exp`` claim then gives its expiry), or
* a JSON object ``{"access_token": "...", "expires_in": 3600}`` (the OAuth 2
  token endpoint's answer; ``token`` and ``expires_at`` in epoch seconds are
  accepted too).

A token whose expiry cannot be known is fetched again after
:data:`UNKNOWN_LIFETIME_S`. A file is also re-read as soon as it changes
(Kubernetes rotates projected service-account tokens in place).

:func:`parse_token` is pure (time is passed in); :class:`TokenProvider` does
the I/O.
"""

from __future__ import annotations

import base64
import functools
import binascii
import json
import logging
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kafka.net.sasl.oauth import AbstractTokenProvider

from kmq.config import KafkaConfig
from kmq.core.errors import AuthenticationFailed

__all__ = ["Token", "TokenProvider", "token_provider", "parse_token", "REFRESH_FRACTION", "UNKNOWN_LIFETIME_S", "COMMAND_TIMEOUT_S"]

log = logging.getLogger(__name__)

REFRESH_FRACTION = 0.8  # fetch a new token after this share of its lifetime
UNKNOWN_LIFETIME_S = 60.0  # refetch interval when the token does not say when it expires
COMMAND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Token:
    """A bearer token, when it was obtained, when it expires (None: unknown) and when to refresh it."""

    value: str
    obtained_at: float
    expires_at: float | None

    @property
    def refresh_at(self) -> float:
        if self.expires_at is None:
            return self.obtained_at + UNKNOWN_LIFETIME_S
        return self.obtained_at + REFRESH_FRACTION * max(0.0, self.expires_at - self.obtained_at)

    def __repr__(self) -> str:  # never show the token itself
        return f"Token(obtained_at={self.obtained_at}, expires_at={self.expires_at})"


def _jwt_exp(value: str) -> float | None:
    parts = value.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


def parse_token(text: str, now: float, source: str) -> Token:
    """A :class:`Token` from what a token file or command gave (bare token or JSON). ``now``: epoch seconds."""
    text = text.strip()
    if not text:
        raise AuthenticationFailed(f"{source} gave an empty OAUTHBEARER token")
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            raise AuthenticationFailed(f"{source} gave text that starts like JSON but is not JSON") from None
        value = doc.get("access_token") or doc.get("token") if isinstance(doc, dict) else None
        if not isinstance(value, str) or not value.strip():
            raise AuthenticationFailed(f"{source} gave JSON without an access_token (or token) string")
        expires_at: float | None = None
        if isinstance(doc.get("expires_in"), (int, float)):
            expires_at = now + float(doc["expires_in"])
        elif isinstance(doc.get("expires_at"), (int, float)):
            expires_at = float(doc["expires_at"])
        else:
            expires_at = _jwt_exp(value.strip())
        return Token(value.strip(), now, expires_at)
    if any(ch.isspace() for ch in text):
        raise AuthenticationFailed(f"{source} gave more than one word; a bearer token is a single word (or JSON)")
    return Token(text, now, _jwt_exp(text))


class TokenProvider(AbstractTokenProvider):
    """kafka-python token provider reading ``token_file`` or running ``token_command``.

    Thread-safe; failures raise :class:`~kmq.core.errors.AuthenticationFailed`
    naming the key and the cause. ``clock`` returns epoch seconds (tests pass their own).
    """

    def __init__(self, token_file: str | None = None, token_command: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if bool(token_file) == bool(token_command):
            raise ValueError("give exactly one of token_file and token_command")
        self.token_file = token_file
        self.token_command = token_command
        self._clock = clock
        self._lock = threading.Lock()
        self._token: Token | None = None
        self._file_stamp: tuple[float, int] | None = None
        self.fetches = 0

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._token.refresh_at or self._file_changed():
                self._token = self._fetch(now)
                self.fetches += 1
                log.debug("new OAUTHBEARER token from %s (%r)", self._source, self._token)
            return self._token.value

    def token_and_expiry(self) -> tuple[str, float]:
        """The token and its expiry (epoch seconds; the refresh time when unknown), for
        confluent-kafka's ``oauth_cb``, which wants both."""
        value = self.token()
        with self._lock:
            tok = self._token
        expires = tok.expires_at if tok is not None and tok.expires_at is not None else (tok.refresh_at if tok else self._clock() + 60)
        return value, expires

    @property
    def _source(self) -> str:
        return "kafka.sasl_oauth_token_file" if self.token_file else "kafka.sasl_oauth_token_command"

    def _stamp(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.token_file)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def _file_changed(self) -> bool:
        return self.token_file is not None and self._stamp() != self._file_stamp

    def _fetch(self, now: float) -> Token:
        if self.token_file:
            self._file_stamp = self._stamp()
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise AuthenticationFailed(
                    f"cannot read the OAUTHBEARER token: kafka.sasl_oauth_token_file {self.token_file}: {exc.strerror}"
                ) from exc
            return parse_token(text, now, f"kafka.sasl_oauth_token_file {self.token_file}")
        cmd = self.token_command or ""
        try:
            done = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise AuthenticationFailed(f"kafka.sasl_oauth_token_command: program not found: {shlex.split(cmd)[0]!r}") from None
        except subprocess.TimeoutExpired:
            raise AuthenticationFailed(f"kafka.sasl_oauth_token_command did not finish within {COMMAND_TIMEOUT_S:g}s") from None
        except (OSError, ValueError) as exc:
            raise AuthenticationFailed(f"kafka.sasl_oauth_token_command cannot run: {exc}") from exc
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output on stderr)"])[-1][:300]
            raise AuthenticationFailed(f"kafka.sasl_oauth_token_command failed with exit code {done.returncode}: {last}")
        return parse_token(done.stdout, now, "kafka.sasl_oauth_token_command")


@functools.lru_cache(maxsize=16)
def token_provider(kafka: KafkaConfig) -> TokenProvider:
    """One shared OAUTHBEARER token provider per configuration (so the token is reused across clients)."""
    return TokenProvider(token_file=kafka.sasl_oauth_token_file, token_command=kafka.sasl_oauth_token_command)
