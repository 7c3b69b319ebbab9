"""The OAUTHBEARER token provider with a real command and a real file (no broker needed):
refreshed before expiry, re-read when the file rotates, and accepted by kafka-python."""

from __future__ import annotations

import shlex
import sys

from kafka.net.sasl.oauth import SaslMechanismOAuth

from kmq.client.kafka_python.settings import client_kwargs
from kmq.config import Config
from kmq.client.oauth import TokenProvider


def _counting_command(tmp_path, expires_in: int) -> str:
    """A token command that prints token-1, token-2, ... (counting its runs in a file)."""
    script = tmp_path / "get_token.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"p = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        f"print(json.dumps({{'access_token': f'token-{{n}}', 'expires_in': {expires_in}}}))\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_command_token_is_reused_then_refreshed_before_expiry(tmp_path):
    now = [1000.0]
    provider = TokenProvider(token_command=_counting_command(tmp_path, expires_in=100), clock=lambda: now[0])
    assert provider.token() == "token-1"
    now[0] = 1079.0  # 79 % of the lifetime: still the same token, no new run
    assert provider.token() == "token-1" and provider.fetches == 1
    now[0] = 1081.0  # past 80 %: fetched again while the old one is still valid
    assert provider.token() == "token-2" and provider.fetches == 2


def test_file_token_is_reread_when_the_file_rotates(tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    provider = TokenProvider(token_file=str(token), clock=lambda: 1000.0)
    assert provider.token() == "first-token" and provider.token() == "first-token"
    token.write_text("second-token-after-rotation\n")  # another size: seen even where mtime is coarse
    assert provider.token() == "second-token-after-rotation" and provider.fetches == 2


def test_kafka_python_sends_the_providers_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc.def.ghi\n")
    cfg = Config.from_dict({"kafka": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER",
                                      "sasl_oauth_token_file": str(token)}})
    kw = client_kwargs(cfg.kafka)
    assert "sasl_plain_password" not in kw and "sasl_plain_username" not in kw
    mech = SaslMechanismOAuth(**kw)  # what kafka-python builds on each connection
    assert mech.auth_bytes() == b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"
