"""``kmq ui`` as a real process, for the tests that drive it over HTTP or from a browser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import yaml

from tests.helpers.kafka import wait_until


class UiProcess:
    """``kmq ui`` in its own process; the port comes from its log line."""

    def __init__(self, cfg, workdir, *args: str, env: dict | None = None) -> None:
        path = workdir / f"ui-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
        self.log = workdir / f"{path.stem}.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "kmq", "ui", "--config", str(path), "--port", "0", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})

    def wait_port(self, timeout: float = 30.0) -> int:
        def port():
            m = re.search(rb"kmq ui listening on http://\S+:(\d+)/", self.log.read_bytes())
            if self.proc.poll() is not None:
                raise AssertionError(f"kmq ui exited with {self.proc.returncode}: {self.log.read_text()}")
            return int(m.group(1)) if m else None

        return wait_until(port, timeout, what="kmq ui listening")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
