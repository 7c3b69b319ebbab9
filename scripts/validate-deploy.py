#!/usr/bin/env python3
"""Offline validation of kmq's deployment files (no cluster, no helm binary).

    .venv/bin/python scripts/validate-deploy.py            # everything
    .venv/bin/python scripts/validate-deploy.py --only chart --chart /tmp/copy-of-chart

Checks, each one a function the tests in tests/deploy/ call on its own:

* chart:     ``helm lint --strict`` (helm-python-sdk, per Kubernetes version) with the default values and
             with every values set in tests/deploy/values/ (all toggles on);
             render each set and validate every manifest with kubernetes-validate
             --strict for Kubernetes 1.29, 1.30 and 1.31; pod hardening rules.
* bad-values: every tests/deploy/bad-values/*.yaml must be rejected (by
             values.schema.json or by the chart's own checks) with the message
             its ``# expect:`` line names.
* manifests: deploy/k8s/**.yaml the same way, and every kustomization.yaml lists
             exactly the files next to it.
* rules:     ``promtool check rules`` + ``promtool test rules`` on
             deploy/prometheus/, and the chart's PrometheusRule equals rules.yaml.
* alerts:    every alert has a promtool unit test, a ``runbook_url`` into
             docs/operations.md and a runbook heading there (absolute http(s)
             URLs in every rendered PrometheusRule); every metric an
             alert uses is one kmq exports (kmq.telemetry.metrics.exported_metric_names).
* dashboard: helm/kmq/dashboards/kmq.json is a Grafana dashboard whose every
             query (panels and template variables) uses only metrics kmq exports.
* strimzi:   the chart renders topicInit.mode strimzi as KafkaTopic resources
             (three per queue, no hook Job, kafka.strimzi.io/v1 unless
             topicInit.strimzi.apiVersion says v1beta2) that pass their structural schema.

Custom resources (ServiceMonitor, PrometheusRule, SparkApplication, KafkaTopic,
KEDA's ScaledObject) are not in kubernetes-validate's schemas: they are checked
against the structural schemas in CRD_SCHEMAS below (the fields kmq uses,
unknown fields rejected), the PrometheusRule's groups also go through
``promtool check rules`` and a ScaledObject's Prometheus queries through
``promtool`` too (as recording rules).
Kustomization files are not Kubernetes objects and are skipped by kind.

Exit status: 0 when everything passes, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import copy
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kmq"
K8S_DIR = ROOT / "deploy" / "k8s"
RULES_DIR = ROOT / "deploy" / "prometheus"
VALUES_DIR = ROOT / "tests" / "deploy" / "values"
BAD_VALUES_DIR = ROOT / "tests" / "deploy" / "bad-values"
K8S_VERSIONS = ("1.29.0", "1.30.0", "1.31.0")
RELEASE, NAMESPACE = "kmq", "kmq"
DASHBOARD = CHART / "dashboards" / "kmq.json"
RUNBOOK = ROOT / "docs" / "operations.md"
# Metrics alerts and dashboards may use that kmq does not export itself.
EXTERNAL_METRICS = {"up"}

SKIPPED_KINDS = {("kustomize.config.k8s.io/v1beta1", "Kustomization")}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"}


# ---------------------------------------------------------------- custom resources
def _obj(props: dict, required: Iterable[str] = (), extra: bool = False) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": extra}


_STR, _INT, _BOOL, _OBJ, _ARR = ({"type": t} for t in ("string", "integer", "boolean", "object", "array"))
_META = _obj({"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
              "namespace": _STR, "labels": {"type": "object", "additionalProperties": _STR},
              "annotations": {"type": "object", "additionalProperties": _STR}}, ["name"])
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
_SPARK_POD = _obj({"cores": {"type": "integer", "minimum": 1}, "instances": {"type": "integer", "minimum": 1},
                   "memory": {"type": "string", "pattern": r"^[0-9]+[kmgt]?$"}, "serviceAccount": _STR,
                   "labels": {"type": "object", "additionalProperties": _STR}, "env": _ARR,
                   "securityContext": _OBJ, "volumeMounts": _ARR}, ["cores", "memory"])

_NUMBER_TEXT = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}
_BOOL_TEXT = {"enum": ["true", "false"]}
_HPA_RULES = _obj({"stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
                   "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
                   "policies": {"type": "array", "items": _obj({"type": {"enum": ["Pods", "Percent"]},
                                                                "value": {"type": "integer", "minimum": 1},
                                                                "periodSeconds": {"type": "integer", "minimum": 1}},
                                                               ["type", "value", "periodSeconds"])}})
# KEDA trigger metadata is a map of strings; the keys each scaler reads (keda.sh/docs, scalers).
_KEDA_TRIGGER_METADATA = {
    "prometheus": _obj({"serverAddress": {"type": "string", "pattern": "^https?://"}, "query": _STR,
                        "threshold": _NUMBER_TEXT, "activationThreshold": _NUMBER_TEXT, "namespace": _STR,
                        "customHeaders": _STR, "queryParameters": _STR, "ignoreNullValues": _BOOL_TEXT,
                        "unsafeSsl": _BOOL_TEXT, "authModes": _STR}, ["serverAddress", "query", "threshold"]),
    "kafka": _obj({"bootstrapServers": _STR, "consumerGroup": _STR, "topic": _STR, "lagThreshold": _NUMBER_TEXT,
                   "activationLagThreshold": _NUMBER_TEXT, "offsetResetPolicy": {"enum": ["latest", "earliest"]},
                   "allowIdleConsumers": _BOOL_TEXT, "excludePersistentLag": _BOOL_TEXT,
                   "scaleToZeroOnInvalidOffset": _BOOL_TEXT, "limitToPartitionsWithLag": _BOOL_TEXT,
                   "ensureEvenDistributionOfPartitions": _BOOL_TEXT, "partitionLimitation": _STR, "sasl": _STR,
                   "tls": {"enum": ["enable", "disable"]}, "version": _STR}, ["bootstrapServers", "consumerGroup"]),
}
_KEDA_TRIGGER = {**_obj({"type": {"enum": sorted(_KEDA_TRIGGER_METADATA)}, "name": _STR,
                         "metadata": {"type": "object", "additionalProperties": _STR},
                         "authenticationRef": _obj({"name": _STR, "kind": {"enum": ["TriggerAuthentication",
                                                                                      "ClusterTriggerAuthentication"]}},
                                                   ["name"]),
                         "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                         "useCachedMetrics": _BOOL}, ["type", "metadata"]),
                 "allOf": [{"if": {"properties": {"type": {"const": kind}}},
                            "then": {"properties": {"metadata": schema}}}
                           for kind, schema in _KEDA_TRIGGER_METADATA.items()]}


def _resource(api: str, kind: str, spec: dict) -> dict:
    return _obj({"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": _META, "spec": spec},
                ["apiVersion", "kind", "metadata", "spec"])


CRD_SCHEMAS: dict[tuple[str, str], dict] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _resource("monitoring.coreos.com/v1", "ServiceMonitor", _obj({
        "selector": _obj({"matchLabels": {"type": "object", "additionalProperties": _STR}}, ["matchLabels"]),
        "namespaceSelector": _obj({"matchNames": {"type": "array", "items": _STR}, "any": _BOOL}),
        "endpoints": {"type": "array", "minItems": 1, "items": _obj(
            {"port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION}, ["port"])},
    }, ["selector", "endpoints"])),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _resource("monitoring.coreos.com/v1", "PrometheusRule", _obj({
        "groups": {"type": "array", "minItems": 1, "items": _obj({"name": _STR, "interval": _DURATION, "rules": {
            "type": "array", "items": _obj({"alert": _STR, "record": _STR, "expr": _STR, "for": _DURATION,
                                            "labels": {"type": "object", "additionalProperties": _STR},
                                            "annotations": {"type": "object", "additionalProperties": _STR}},
                                           ["expr"])}}, ["name", "rules"])},
    }, ["groups"])),
    ("monitoring.coreos.com/v1", "PodMonitor"): _resource("monitoring.coreos.com/v1", "PodMonitor", _obj({
        "selector": {**_obj({"matchLabels": {"type": "object", "additionalProperties": _STR},
                             "matchExpressions": {"type": "array", "items": _obj(
                                 {"key": _STR, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                  "values": {"type": "array", "items": _STR}}, ["key", "operator"])}}),
                     "minProperties": 1},
        "namespaceSelector": _obj({"matchNames": {"type": "array", "items": _STR}, "any": _BOOL}),
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _obj(
            {"port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION,
             "relabelings": {"type": "array", "items": _obj(
                 {"targetLabel": _STR, "replacement": _STR, "sourceLabels": {"type": "array", "items": _STR},
                  "action": _STR, "regex": _STR})}}, ["port"])},
    }, ["selector", "podMetricsEndpoints"])),
    # Strimzi's v1 (0.49+, the only version of Strimzi 1.0) and v1beta2 (older operators): the same fields here.
    **{(api, "KafkaTopic"): _resource(api, "KafkaTopic", _obj({
        "topicName": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,249}$"},
        "partitions": {"type": "integer", "minimum": 1}, "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
        "config": {"type": "object", "additionalProperties": {"type": ["string", "integer", "number", "boolean"]}},
    }, ["partitions"])) for api in ("kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2")},
    # KEDA's ScaledObject (keda.sh/v1alpha1, KEDA 2.x): the spec fields of its CRD, triggers per scaler.
    ("keda.sh/v1alpha1", "ScaledObject"): _resource("keda.sh/v1alpha1", "ScaledObject", _obj({
        "scaleTargetRef": _obj({"apiVersion": _STR, "kind": _STR, "name": _META["properties"]["name"],
                                "envSourceContainerName": _STR}, ["name"]),
        "pollingInterval": {"type": "integer", "minimum": 1}, "cooldownPeriod": {"type": "integer", "minimum": 0},
        "initialCooldownPeriod": {"type": "integer", "minimum": 0}, "idleReplicaCount": {"type": "integer", "minimum": 0},
        "minReplicaCount": {"type": "integer", "minimum": 0}, "maxReplicaCount": {"type": "integer", "minimum": 1},
        "fallback": _obj({"failureThreshold": {"type": "integer", "minimum": 0}, "replicas": {"type": "integer", "minimum": 0},
                          "behavior": _STR}, ["failureThreshold", "replicas"]),
        "advanced": _obj({"restoreToOriginalReplicaCount": _BOOL,
                          "horizontalPodAutoscalerConfig": _obj({"name": _STR, "behavior": _obj(
                              {"scaleUp": _HPA_RULES, "scaleDown": _HPA_RULES})}),
                          "scalingModifiers": _obj({"formula": _STR, "target": _STR, "activationTarget": _STR,
                                                    "metricType": {"enum": ["AverageValue", "Value"]}})}),
        "triggers": {"type": "array", "minItems": 1, "items": _KEDA_TRIGGER},
    }, ["scaleTargetRef", "triggers"])),
    ("sparkoperator.k8s.io/v1beta2", "SparkApplication"): _resource("sparkoperator.k8s.io/v1beta2", "SparkApplication", _obj({
        "type": {"enum": ["Java", "Scala", "Python", "R"]}, "pythonVersion": {"enum": ["2", "3"]},
        "mode": {"enum": ["cluster", "client"]}, "image": _STR,
        "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        "imagePullSecrets": {"type": "array", "items": _STR},
        "mainApplicationFile": {"type": "string", "pattern": r"^(local|file|https?|s3a?|gs)://"},
        "arguments": {"type": "array", "items": _STR}, "sparkVersion": _STR,
        "sparkConf": {"type": "object", "additionalProperties": _STR},
        "deps": _obj({"packages": {"type": "array", "items": _STR}, "jars": {"type": "array", "items": _STR}}),
        "restartPolicy": _obj({"type": {"enum": ["Never", "Always", "OnFailure"]},
                               "onFailureRetryInterval": _INT, "onSubmissionFailureRetryInterval": _INT,
                               "onFailureRetries": _INT, "onSubmissionFailureRetries": _INT}, ["type"]),
        "volumes": _ARR, "driver": _SPARK_POD, "executor": _SPARK_POD,
    }, ["type", "mode", "image", "mainApplicationFile", "sparkVersion", "driver", "executor"])),
}


# ---------------------------------------------------------------- kubernetes-validate
@functools.lru_cache(maxsize=None)
def _kv_module():
    """kubernetes_validate with its schema files read once per process (it re-reads them per call)."""
    import kubernetes_validate.utils as kvu

    if not getattr(kvu.schema_contents, "_kmq_cached", False):
        cached = functools.lru_cache(maxsize=None)(kvu.schema_contents)
        cached._kmq_cached = True  # type: ignore[attr-defined]
        kvu.schema_contents = cached
    return kvu


def validate_object(doc: dict, source: str, versions: Iterable[str] = K8S_VERSIONS) -> list[str]:
    """Problems of one object: kubernetes-validate --strict per version, or the CRD schema."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    where = f"{source}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    if key in SKIPPED_KINDS:
        return []
    if key in CRD_SCHEMAS:
        import jsonschema

        validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[key])
        return [f"{where}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                for e in validator.iter_errors(doc)]
    kvu = _kv_module()
    problems = []
    for version in versions:
        try:
            kvu.validate(copy.deepcopy(doc), version, strict=True)
        except kvu.SchemaNotFoundError as exc:
            problems.append(f"{where}: k8s {version}: {exc.message}")
        except kvu.ValidationError as exc:
            path = ".".join(map(str, exc.absolute_path)) or "<root>"
            problems.append(f"{where}: k8s {version}: {path}: {exc.message}")
    return problems


# ---------------------------------------------------------------- pod hardening
def pod_specs(doc: dict) -> list[tuple[str, dict]]:
    """(name, pod spec) of a workload object."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return [("pod", spec)]
    if kind == "CronJob":
        return [("pod", spec["jobTemplate"]["spec"]["template"]["spec"])]
    if kind in WORKLOAD_KINDS:
        return [("pod", spec["template"]["spec"])]
    return []


def check_pod_hardening(doc: dict, source: str) -> list[str]:
    """kmq pods run as non-root, read-only root FS, no privilege escalation, no
    capabilities, RuntimeDefault seccomp, memory limits and CPU requests."""
    problems = []
    for _, pod in pod_specs(doc):
        where = f"{source}: {doc['kind']}/{doc['metadata']['name']}"
        psc = pod.get("securityContext") or {}
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: automountServiceAccountToken must be false (kmq needs no API access)")
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            csc = c.get("securityContext") or {}
            cw = f"{where} container {c['name']}"
            if not (csc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
                problems.append(f"{cw}: runAsNonRoot is not true")
            if csc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{cw}: readOnlyRootFilesystem is not true")
            if csc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cw}: allowPrivilegeEscalation is not false")
            if "ALL" not in ((csc.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{cw}: capabilities do not drop ALL")
            seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp != "RuntimeDefault":
                problems.append(f"{cw}: seccompProfile is {seccomp!r}, not RuntimeDefault")
            res = c.get("resources") or {}
            if "memory" not in (res.get("limits") or {}) or "cpu" not in (res.get("requests") or {}):
                problems.append(f"{cw}: needs resources.requests.cpu and resources.limits.memory")
            image = str(c.get("image", ""))
            if image.endswith(":latest"):
                problems.append(f"{cw}: image {image} uses the latest tag")
    return problems


# ---------------------------------------------------------------- chart
def load_docs(text: str, source: str) -> list[tuple[str, dict]]:
    return [(source, d) for d in yaml.safe_load_all(text) if d]


def values_sets(values_dir: Path = VALUES_DIR) -> dict[str, dict]:
    """Named values sets for lint and render: the defaults plus tests/deploy/values/*.yaml."""
    sets: dict[str, dict] = {"defaults": {}}
    for path in sorted(values_dir.glob("*.yaml")):
        sets[path.stem] = yaml.safe_load(path.read_text()) or {}
    return sets


def lint_chart(chart: Path, values: dict | None) -> list[str]:
    """``helm lint --strict``: warnings and errors are problems (info is not)."""
    import helm_python

    problems: list[str] = []
    for version in K8S_VERSIONS:
        report = helm_python.lint(str(chart), values or None, strict=True, kube_version=f"v{version}")
        found = [f"lint {m['path']}: {m['error'].strip()}" for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        found += [f"lint: {e.strip()}" for e in report.get("errors", []) if not any(e.strip() in p for p in found)]
        problems += [p for p in found if p not in problems]
    return problems


def render_chart(chart: Path, values: dict | None, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """Rendered templates by path (raises helm_python errors on bad values or templates)."""
    import helm_python

    with helm_python.Chart.load(str(chart)) as c:
        return c.render(values or {}, name=name, namespace=namespace, is_install=True)


def rendered_docs(rendered: dict[str, str]) -> list[tuple[str, dict]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt") or not text.strip():
            continue
        try:
            docs += load_docs(text, path)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} does not render to valid YAML: {exc}") from None
    return docs


def check_chart(chart: Path = CHART, sets: dict[str, dict] | None = None, versions: Iterable[str] = K8S_VERSIONS) -> list[str]:
    """Lint, render and validate the chart for every values set."""
    problems: list[str] = []
    for set_name, values in (sets if sets is not None else values_sets()).items():
        problems += [f"[{set_name}] {p}" for p in lint_chart(chart, values)]
        try:
            docs = rendered_docs(render_chart(chart, values))
        except Exception as exc:  # helm_python errors and bad YAML
            problems.append(f"[{set_name}] render failed: {type(exc).__name__}: {exc}")
            continue
        if not docs:
            problems.append(f"[{set_name}] rendered no manifests")
        for source, doc in docs:
            problems += [f"[{set_name}] {p}" for p in validate_object(doc, source, versions)]
            problems += [f"[{set_name}] {p}" for p in check_pod_hardening(doc, source)]
        problems += [f"[{set_name}] {p}" for p in check_rendered_rules(docs)]
        problems += [f"[{set_name}] {p}" for p in check_rendered_runbook_urls(docs)]
        problems += [f"[{set_name}] {p}" for p in check_scaled_object_queries(docs)]
    return problems


def expected_rejection(path: Path) -> str:
    """The ``# expect: TEXT`` line of a bad values file."""
    for line in path.read_text().splitlines():
        if line.startswith("# expect:"):
            return line.split(":", 1)[1].strip()
    raise ValueError(f"{path} has no '# expect: <part of the error message>' line")


def check_bad_values_file(chart: Path, path: Path) -> list[str]:
    """A bad values file must fail rendering with the message its ``# expect:`` line names."""
    expect = expected_rejection(path)
    values = yaml.safe_load(path.read_text()) or {}
    try:
        render_chart(chart, values)
    except Exception as exc:
        if expect not in str(exc):
            return [f"{path.name}: rejected, but not for {expect!r}: {str(exc).strip()}"]
        return []
    return [f"{path.name}: accepted, expected a rejection mentioning {expect!r}"]


def check_bad_values(chart: Path = CHART, bad_dir: Path = BAD_VALUES_DIR) -> list[str]:
    """Every tests/deploy/bad-values/*.yaml must be rejected."""
    files = sorted(bad_dir.glob("*.yaml"))
    if not files:
        return [f"no bad values files in {bad_dir}"]
    return [p for path in files for p in check_bad_values_file(chart, path)]


# ---------------------------------------------------------------- plain manifests
def check_manifests(k8s_dir: Path = K8S_DIR, versions: Iterable[str] = K8S_VERSIONS) -> list[str]:
    problems = []
    for kust in sorted(k8s_dir.rglob("kustomization.yaml")):
        listed = set((yaml.safe_load(kust.read_text()) or {}).get("resources", []))
        present = {p.name for p in kust.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        rel = kust.relative_to(ROOT) if kust.is_relative_to(ROOT) else kust
        for missing in sorted(listed - present):
            problems.append(f"{rel}: lists {missing}, which does not exist")
        for unlisted in sorted(present - listed):
            problems.append(f"{rel}: {unlisted} is not listed in resources")
    for path in sorted(k8s_dir.rglob("*.yaml")):
        rel = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        for source, doc in load_docs(path.read_text(), rel):
            problems += validate_object(doc, source, versions)
            problems += check_pod_hardening(doc, source)
    return problems


# ---------------------------------------------------------------- Prometheus rules
def promtool() -> str:
    binary = shutil.which("promtool")
    if not binary:
        raise RuntimeError("promtool not found: apt-get install prometheus (scripts/setup-env.sh ensure_promtool)")
    return binary


def _run(cmd: list[str], cwd: Path) -> list[str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return [f"{' '.join(cmd[:3])} failed ({proc.returncode}): {(proc.stdout + proc.stderr).strip()}"]
    return []


def check_rules(rules_dir: Path = RULES_DIR) -> list[str]:
    tool = promtool()
    return _run([tool, "check", "rules", "rules.yaml"], rules_dir) + _run([tool, "test", "rules", "rules.test.yaml"], rules_dir)


def check_rendered_rules(docs: list[tuple[str, dict]]) -> list[str]:
    """``promtool check rules`` on every rendered PrometheusRule's groups."""
    problems = []
    for source, doc in docs:
        if doc.get("kind") != "PrometheusRule":
            continue
        with tempfile.TemporaryDirectory(prefix="kmq-rules-") as tmp:
            Path(tmp, "rules.yaml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
            problems += [f"{source}: {p}" for p in _run([promtool(), "check", "rules", "rules.yaml"], Path(tmp))]
    return problems


def check_scaled_object_queries(docs: list[tuple[str, dict]]) -> list[str]:
    """A KEDA ScaledObject's Prometheus queries parse (``promtool check rules``, as recording rules) and
    read only kmq metrics that kmq exports (the queue-lag metric comes from elsewhere, kafka-exporter)."""
    problems, queries = [], []
    for source, doc in docs:
        if doc.get("kind") != "ScaledObject":
            continue
        for trigger in doc["spec"].get("triggers", []):
            if trigger.get("type") == "prometheus" and "query" in (trigger.get("metadata") or {}):
                queries.append((f"{source}: ScaledObject/{doc['metadata']['name']}", trigger["metadata"]["query"]))
    if not queries:
        return []
    known = _known_metrics()
    for where, query in queries:
        for metric in sorted(n for n in promql_metric_names(query) - known if n.startswith("kmq_")):
            problems.append(f"{where}: query uses {metric}, which kmq does not export (kmq/telemetry/metrics.py)")
    rules = [{"record": f"kmq:keda_query_{i}", "expr": query} for i, (_, query) in enumerate(queries)]
    with tempfile.TemporaryDirectory(prefix="kmq-keda-") as tmp:
        Path(tmp, "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": rules}]}))
        problems += [f"ScaledObject queries: {p}" for p in _run([promtool(), "check", "rules", "rules.yaml"], Path(tmp))]
    return problems


# The runbook base the equality check renders with: the chart requires an absolute URL,
# rules.yaml keeps the path in this repository (its header says to replace it).
_RUNBOOK_BASE_FOR_CHECK = "https://kmq.invalid/docs/operations.md"


def check_rules_match_chart(chart: Path = CHART, rules_dir: Path = RULES_DIR) -> list[str]:
    """The chart's PrometheusRule (release "kmq", default values) equals deploy/prometheus/rules.yaml,
    but for the runbook links' base (absolute in the chart, docs/operations.md in rules.yaml)."""
    docs = rendered_docs(render_chart(chart, {"prometheusRule": {"enabled": True,
                                                                  "runbookBaseUrl": _RUNBOOK_BASE_FOR_CHECK}}))
    rules = [d for _, d in docs if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        return [f"expected one PrometheusRule with prometheusRule.enabled, got {len(rules)}"]
    groups = rules[0]["spec"]["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        notes = rule.get("annotations") or {}
        if "runbook_url" in notes:
            notes["runbook_url"] = notes["runbook_url"].replace(_RUNBOOK_BASE_FOR_CHECK, "docs/operations.md", 1)
    plain = yaml.safe_load((rules_dir / "rules.yaml").read_text())["groups"]
    if groups != plain:
        return ["helm/kmq PrometheusRule differs from deploy/prometheus/rules.yaml; keep them equal"]
    return []


# ---------------------------------------------------------------- alerts, runbook, dashboard
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "inf", "nan", "le"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (Grafana's $__rate_interval etc. allowed).

    Strings, label matchers, ``by (...)`` lists, ranges and function names are
    dropped; what remains as identifiers are metric names.
    """
    import re

    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)              # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                              # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                              # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)                                   # dashboard variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = m.group(0), text[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the unit of 5m, 1e3
        names.add(word)
    return names


def _known_metrics() -> set[str]:
    sys.path.insert(0, str(ROOT))
    from kmq.telemetry.metrics import exported_metric_names

    return exported_metric_names() | EXTERNAL_METRICS


def _alert_rules(rules_dir: Path = RULES_DIR) -> list[dict]:
    doc = yaml.safe_load((rules_dir / "rules.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def runbook_anchors(path: Path = RUNBOOK) -> set[str]:
    """GitHub-style anchors of the ``### Name`` headings of docs/operations.md."""
    import re

    anchors = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def check_alerts(rules_dir: Path = RULES_DIR, runbook: Path = RUNBOOK) -> list[str]:
    """Every alert: a promtool test, a runbook_url whose anchor is a heading in docs/operations.md,
    and only metrics that kmq exports."""
    problems = []
    known = _known_metrics()
    anchors = runbook_anchors(runbook)
    tests = yaml.safe_load((rules_dir / "rules.test.yaml").read_text())["tests"]
    tested = {t["alertname"] for test in tests for t in test.get("alert_rule_test", []) if t.get("exp_alerts")}
    for rule in _alert_rules(rules_dir):
        name = rule["alert"]
        url = (rule.get("annotations") or {}).get("runbook_url", "")
        if "#" not in url or not url.split("#", 1)[0].endswith("operations.md"):
            problems.append(f"alert {name}: runbook_url {url!r} does not point into docs/operations.md")
        elif url.split("#", 1)[1] not in anchors:
            problems.append(f"alert {name}: docs/operations.md has no heading for #{url.split('#', 1)[1]}")
        if name not in tested:
            problems.append(f"alert {name}: no promtool test in rules.test.yaml expects it to fire")
        for metric in sorted(promql_metric_names(rule["expr"]) - known):
            problems.append(f"alert {name}: uses {metric}, which kmq does not export (kmq/telemetry/metrics.py)")
    return problems


def check_rendered_runbook_urls(docs: list[tuple[str, dict]], runbook: Path = RUNBOOK) -> list[str]:
    """Every alert of a rendered PrometheusRule links an absolute http(s) URL of operations.md whose
    anchor is a heading there: Alertmanager and Grafana open no relative link."""
    from urllib.parse import urlsplit

    anchors = runbook_anchors(runbook)
    problems = []
    for source, doc in docs:
        if doc.get("kind") != "PrometheusRule":
            continue
        for rule in (r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r):
            where = f"{source}: alert {rule['alert']}"
            url = (rule.get("annotations") or {}).get("runbook_url", "")
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                problems.append(f"{where}: runbook_url {url!r} is not an absolute http(s) URL")
            elif not parts.path.endswith("operations.md"):
                problems.append(f"{where}: runbook_url {url!r} does not point at operations.md")
            elif parts.fragment not in anchors:
                problems.append(f"{where}: runbook_url {url!r}: docs/operations.md has no heading #{parts.fragment}")
    return problems


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of a Grafana dashboard."""
    import re

    out = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for t in inner.get("targets", []):
                out.append((f"panel {inner.get('title')!r}", t["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.match(r"\s*label_values\((.*),\s*\w+\)\s*$", q)
            out.append((f"variable {var['name']}", m.group(1) if m else q))
    return out


def check_dashboard(path: Path = DASHBOARD) -> list[str]:
    """The Grafana dashboard is valid JSON with unique panel ids, and every query uses kmq's metrics only."""
    import json

    try:
        dash = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path.name}: not a readable JSON dashboard: {exc}"]
    problems = []
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dash:
            problems.append(f"{path.name}: missing {key!r}")
    ids = [p.get("id") for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        problems.append(f"{path.name}: panel ids are not unique")
    known = _known_metrics()
    queries = dashboard_queries(dash)
    if not queries:
        problems.append(f"{path.name}: no queries")
    for where, expr in queries:
        names = promql_metric_names(expr)
        if not names:
            problems.append(f"{path.name} {where}: {expr!r} reads no metric")
        for metric in sorted(names - known):
            problems.append(f"{path.name} {where}: uses {metric}, which kmq does not export (kmq/telemetry/metrics.py)")
    return problems


def check_strimzi(chart: Path = CHART) -> list[str]:
    """topicInit.mode strimzi renders three valid KafkaTopic resources per queue and no hook Job."""
    values = {"topicInit": {"mode": "strimzi", "strimzi": {"clusterName": "my-cluster"}},
              "queues": [{"name": "orders", "partitions": 6}, {"name": "payments", "partitions": 3,
                                                             "markers_topic": "payments.markers",
                                                             "markers_retention": "30d"}]}
    docs = rendered_docs(render_chart(chart, values))
    problems = []
    topics = {d["spec"]["topicName"]: d for _, d in docs if d.get("kind") == "KafkaTopic"}
    apis = {d["apiVersion"] for d in topics.values()}
    if apis != {"kafka.strimzi.io/v1"}:
        problems.append(f"strimzi mode renders KafkaTopic apiVersion {sorted(apis)}, expected kafka.strimzi.io/v1 "
                        "(Strimzi 1.0 serves no other)")
    want = {"orders": 6, "orders__markers": 6, "orders__dlq": 6, "payments": 3, "payments.markers": 3, "payments__dlq": 3}
    got = {name: d["spec"]["partitions"] for name, d in topics.items()}
    if got != want:
        problems.append(f"strimzi mode renders topics {got}, expected {want}")
    for name, d in topics.items():
        if d["metadata"]["labels"].get("strimzi.io/cluster") != "my-cluster":
            problems.append(f"KafkaTopic {name}: no strimzi.io/cluster label")
        problems += validate_object(d, f"KafkaTopic {name}", K8S_VERSIONS[-1:])
    markers = topics.get("orders__markers", {}).get("spec", {}).get("config", {})
    if str(markers.get("retention.ms")) != str(7 * 86400 * 1000):
        problems.append(f"markers KafkaTopic retention.ms is {markers.get('retention.ms')!r}, expected 7 days")
    own = topics.get("payments.markers", {}).get("spec", {}).get("config", {})
    if str(own.get("retention.ms")) != str(30 * 86400 * 1000):
        problems.append(f"a queue's own markers_retention is not its KafkaTopic retention.ms ({own.get('retention.ms')!r})")
    if any(d.get("kind") == "Job" for _, d in docs):
        problems.append("strimzi mode still renders the topic-init hook Job")
    return problems


# ---------------------------------------------------------------- main
CHECKS = {
    "chart": lambda a: check_chart(a.chart, values_sets(a.values_dir)),
    "bad-values": lambda a: check_bad_values(a.chart),
    "rules-match": lambda a: check_rules_match_chart(a.chart),
    "manifests": lambda a: check_manifests(),
    "rules": lambda a: check_rules(),
    "alerts": lambda a: check_alerts(),
    "dashboard": lambda a: check_dashboard(),
    "strimzi": lambda a: check_strimzi(a.chart),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chart", type=Path, default=CHART, help="chart directory (default helm/kmq)")
    parser.add_argument("--values-dir", type=Path, default=VALUES_DIR,
                        help="values sets rendered besides the defaults (default tests/deploy/values)")
    parser.add_argument("--only", action="append", choices=sorted(CHECKS), help="run only these checks (repeatable)")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.only or CHECKS:
        try:
            problems = CHECKS[name](args)
        except Exception as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        status = "ok" if not problems else f"{len(problems)} problem(s)"
        print(f"==> {name}: {status}")
        for p in problems:
            print(f"    {p}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
