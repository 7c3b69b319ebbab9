"""scripts/validate-deploy.py: the chart, the plain manifests and the alert rules pass
offline validation, and the validation fails when a template or values file breaks."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.deploy.conftest import ROOT, SCRIPT, vd

VALUES_SETS = vd.values_sets()
BAD_VALUES = sorted(vd.BAD_VALUES_DIR.glob("*.yaml"))


@pytest.mark.parametrize("set_name", sorted(VALUES_SETS))
def test_chart_lints_renders_and_validates_for_k8s_1_29_to_1_31(set_name):
    assert vd.check_chart(vd.CHART, {set_name: VALUES_SETS[set_name]}) == []


def test_values_sets_turn_every_toggle_on():
    toggles = ["hpa", "networkPolicy", "serviceMonitor", "prometheusRule", "sparkJob", "topicInit", "tests", "pdb",
               "podMonitor", "workerPodMonitor", "grafanaDashboard", "keda"]
    for toggle in toggles:
        assert any((v.get(toggle) or {}).get("enabled") for v in VALUES_SETS.values()), f"no values set enables {toggle}"
    modes = {(v.get("sparkJob") or {}).get("mode") for v in VALUES_SETS.values() if (v.get("sparkJob") or {}).get("enabled")}
    assert modes == {"local", "operator"}
    keda = {(v.get("keda") or {}).get("trigger", "prometheus") for v in VALUES_SETS.values() if (v.get("keda") or {}).get("enabled")}
    assert keda == {"prometheus", "kafka"}
    assert any(v.get("kafka", {}).get("existingSecret") for v in VALUES_SETS.values())
    assert any(v.get("kafka", {}).get("tls", {}).get("caSecret") for v in VALUES_SETS.values())
    assert any((v.get("topicInit") or {}).get("mode") == "strimzi" for v in VALUES_SETS.values())
    assert any(((v.get("tracker") or {}).get("staticMembership") or {}).get("enabled") for v in VALUES_SETS.values())
    for key in ("podSecurityContext", "priorityClassName", "extraEnv", "extraVolumes", "extraVolumeMounts"):
        assert any(key in v for v in VALUES_SETS.values()), f"no values set sets {key}"
    assert any((v.get("image") or {}).get("digest") for v in VALUES_SETS.values())
    assert any((v.get("redis") or {}).get("existingSecret") for v in VALUES_SETS.values())


def test_plain_manifests_validate_for_k8s_1_29_to_1_31():
    assert vd.check_manifests() == []


@pytest.mark.parametrize("path", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_bad_values_are_rejected_with_their_reason(path):
    assert vd.check_bad_values_file(vd.CHART, path) == []


def test_there_are_bad_values_for_schema_and_chart_checks():
    assert len(BAD_VALUES) >= 10


def test_promtool_check_and_unit_tests_pass(promtool_binary):
    assert vd.check_rules() == []


def test_chart_prometheus_rule_equals_plain_rules():
    assert vd.check_rules_match_chart() == []


def test_crd_kinds_are_checked_structurally_not_skipped():
    docs = vd.rendered_docs(vd.render_chart(vd.CHART, VALUES_SETS["all-on-operator"]))
    app = next(d for _, d in docs if d["kind"] == "SparkApplication")
    assert vd.validate_object(app, "x") == []
    app["spec"]["driver"]["memroy"] = "1g"
    assert any("memroy" in p for p in vd.validate_object(app, "x"))
    rule = next(d for _, d in docs if d["kind"] == "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(("
    assert vd.check_rendered_rules([("x", rule)]) != []


# ------------------------------------------------------------------ the script as CI runs it
def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_script_passes_on_the_repository():
    proc = run_script()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for check in vd.CHECKS:
        assert f"==> {check}: ok" in proc.stdout


def test_script_fails_on_a_values_file_that_breaks_a_template(tmp_path):
    # Passes the schema (resources are free-form) but renders an invalid Deployment.
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"tracker": {"resources": {"limits": {"memory": ["512Mi"]}}}}))
    proc = run_script("--only", "chart", "--values-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout
    assert "[broken]" in proc.stdout and "limits.memory" in proc.stdout


BREAKAGES = {
    "misspelled-field": ("tracker-deployment.yaml", "readinessProbe:", "readinesProbe:", "readinesProbe"),
    "template-syntax": ("tracker-service.yaml", "{{ .Values.tracker.httpPort }}", "{{ .Values.tracker.httpPort }", "render failed"),
    "lost-hardening": ("tracker-deployment.yaml", '{{- include "kmq.containerSecurityContext" . | nindent 12 }}',
                       "readOnlyRootFilesystem: false", "readOnlyRootFilesystem is not true"),
    "bad-yaml-indent": ("tracker-pdb.yaml", "  minAvailable:", "minAvailable:", "render failed"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_script_fails_when_a_template_breaks(tmp_path, breakage):
    file, old, new, expect = BREAKAGES[breakage]
    chart = tmp_path / "kmq"
    shutil.copytree(vd.CHART, chart)
    path = chart / "templates" / file
    text = path.read_text()
    assert old in text, f"{file} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))
    proc = run_script("--only", "chart", "--chart", str(chart))
    assert proc.returncode == 1, proc.stdout
    assert expect in proc.stdout, proc.stdout
