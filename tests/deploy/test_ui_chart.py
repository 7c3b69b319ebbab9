"""The chart's optional console: off by default; when on, `kmq ui` behind its own Service,
token file mounted where the command line reads it, pointed at the tracker's Service."""

from __future__ import annotations

from tests.deploy.conftest import find, render


def test_console_is_off_by_default():
    assert not [d for d in render({}) if d["metadata"]["name"].endswith("-ui")]


def test_console_deployment_service_and_policy():
    docs = render({"ui": {"enabled": True, "tokenSecret": "kmq-ui", "port": 8100},
                   "tracker": {"httpPort": 9200}, "networkPolicy": {"enabled": True}})
    pod = find(docs, "Deployment", "-ui")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert args[:2] == ["ui", "--config"] and args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == "8100" and c["ports"][0]["containerPort"] == 8100
    tracker_svc = find(docs, "Service", "-tracker")["metadata"]["name"]
    assert args[args.index("--tracker-url") + 1] == f"http://{tracker_svc}:9200"
    token_file = args[args.index("--token-file") + 1]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "ui-token")
    assert token_file == f"{mount['mountPath']}/token"
    vol = next(v for v in pod["volumes"] if v["name"] == "ui-token")
    assert vol["secret"]["secretName"] == "kmq-ui" and vol["secret"]["items"][0]["key"] == "token"
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"  # the one path served without the token
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["automountServiceAccountToken"] is False
    svc = find(docs, "Service", "-ui")
    assert svc["spec"]["ports"][0]["port"] == 8100 and svc["spec"]["selector"]["app.kubernetes.io/component"] == "ui"
    policy = find(docs, "NetworkPolicy", "-ui")
    assert policy["spec"]["ingress"][0]["ports"][0]["port"] == 8100
