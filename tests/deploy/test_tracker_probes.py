"""The probes of the rendered chart hit what the real tracker serves: start
`kmq tracker run` with the chart's own kmq.yaml and container args against the
test broker, then GET exactly the rendered probe paths and port."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kmq.dev.broker import free_port
from tests.conftest import TEST_GROUP_TIMING
from tests.deploy.conftest import ROOT, find, render

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # not listening yet


def wait_for(cond, proc: subprocess.Popen, log: Path, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"tracker exited with {proc.returncode} while waiting for {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_rendered_probes_get_200_from_a_real_tracker(queue_topics, bootstrap, tmp_path):
    _, q = queue_topics(partitions=2)
    port = free_port()
    docs = render({
        "kafka": {"bootstrapServers": bootstrap},
        "queues": [{"name": q.name, "lease": "5s"}],
        "tracker": {"httpPort": port, "groupId": f"tracker-{q.name}"},
        "extraConfig": {"kafka": TEST_GROUP_TIMING},
    })
    config = tmp_path / "kmq.yaml"
    config.write_text(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"])
    dep = find(docs, "Deployment", "-tracker")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        target = container[probe]["httpGet"]
        probes[probe] = (target["path"], ports.get(target["port"], target["port"]))
    assert probes == {"startupProbe": ("/healthz", port), "readinessProbe": ("/readyz", port),
                      "livenessProbe": ("/healthz", port)}

    # The container's args after the image's entry point (kmq.cli:main, here `python -m kmq`
    # from the source tree), with the ConfigMap mount replaced by the file; loopback only here.
    args = [str(config) if a == "/etc/kmq/kmq.yaml" else a for a in container["args"]]
    log = tmp_path / "tracker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kmq", *args, "--http-host", "127.0.0.1"], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        path, p = probes["startupProbe"]
        startup = container["startupProbe"]
        # The startup probe's window covers a real start (connect, topic checks, HTTP bind).
        wait_for(lambda: get(p, path)[0] == 200, proc, log, startup["periodSeconds"] * startup["failureThreshold"],
                 f"GET {path} on {p} = 200")
        path, p = probes["livenessProbe"]
        assert get(p, path)[0] == 200
        path, p = probes["readinessProbe"]
        status, body = wait_for(lambda: (r := get(p, path))[0] == 200 and r, proc, log, 60, f"GET {path} on {p} = 200")
        svc = find(docs, "Service", "-tracker")["spec"]["ports"][0]
        assert svc["targetPort"] == "http" and svc["port"] == port
        status, metrics = get(port, "/metrics")
        assert status == 200 and "kmq_tracker_markers_total" in metrics
        # SIGTERM: the tracker drains, commits and exits within the pod's grace period.
        grace = pod["terminationGracePeriodSeconds"]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=grace) == 0, log.read_text()[-3000:]
        assert time.monotonic() - started < grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
