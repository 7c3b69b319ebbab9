"""scripts/release.sh: sdist, wheel and the packaged chart with one version (kmq/version.py,
which pyproject.toml reads); the image step says clearly that it was skipped where no
container engine runs (this machine); mismatched versions stop the release naming the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import zipfile

import pytest
import yaml

from tests.deploy.conftest import ROOT

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "release.sh"


def _engine_running() -> bool:
    for engine in ("docker", "podman"):
        if shutil.which(engine) and subprocess.run([engine, "info"], capture_output=True).returncode == 0:
            return True
    return False


def test_release_builds_python_packages_and_chart_with_one_version(tmp_path):
    from kmq.version import __version__ as version

    out = tmp_path / "dist"
    proc = subprocess.run([str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "release.json").read_text())
    assert manifest["version"] == version
    wheel, sdist, chart = (out / f"kmq-{version}-py3-none-any.whl", out / f"kmq-{version}.tar.gz",
                           out / f"kmq-{version}.tgz")
    with zipfile.ZipFile(wheel) as z:
        assert f"kmq-{version}.dist-info/METADATA" in z.namelist()
        assert "tracker/service.py" in z.namelist() and not any(n.startswith("tests/") for n in z.namelist())
    with tarfile.open(sdist) as t:
        assert f"kmq-{version}/pyproject.toml" in t.getnames()
    with tarfile.open(chart) as t:
        meta = yaml.safe_load(t.extractfile("kmq/Chart.yaml").read())
        assert (meta["version"], meta["appVersion"]) == (version, version)
        assert "kmq/dashboards/kmq.json" in t.getnames()
    sums = dict(reversed(line.split()) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert {a["file"]: a["sha256"] for a in manifest["artifacts"]} == sums
    assert manifest["chart"]["digest"] == "sha256:" + sums[chart.name]
    import helm_python

    with helm_python.Chart.load(str(chart)) as c:  # the packaged chart renders
        assert any(path.endswith("tracker-deployment.yaml") for path in c.render({}, name="kmq", namespace="kmq"))
    if not _engine_running():
        assert manifest["images"]["status"] == "skipped"
        assert "no container engine running here" in proc.stdout
        assert "docker build -f deploy/docker/Dockerfile" in manifest["images"]["note"]
        failed = subprocess.run([str(SCRIPT), "--out", str(tmp_path / "again"), "--require-image"],
                                capture_output=True, text=True, timeout=600)
        assert failed.returncode == 1 and "--require-image: no container engine" in failed.stderr


def _repo_copy(tmp_path):
    repo = tmp_path / "repo"
    for rel in ("pyproject.toml", "kmq/version.py", "scripts/release.sh"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    for tree in ("deploy", "helm"):  # the script checks the image tags written there
        shutil.copytree(ROOT / tree, repo / tree)
    return repo


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))


MISMATCHES = {
    # (file, old, new, what the error names)
    "chart version": ("helm/kmq/Chart.yaml", "\nversion: ", "\nversion: 9.9.9\nold_version: ",
                      "helm/kmq/Chart.yaml version is 9.9.9"),
    "chart appVersion": ("helm/kmq/Chart.yaml", "\nappVersion: ", "\nappVersion: 9.9.9\nold_app_version: ",
                         "helm/kmq/Chart.yaml appVersion is 9.9.9"),
    "kmq/version.py": ("kmq/version.py", '__version__ = "', '__version__ = "9.9.9"\nold = "',
                       "kmq/version.py says 9.9.9 but helm/kmq/Chart.yaml version is"),
    # kmq's image tags in the manifests (all of them are found by pattern: tests/deploy/test_image_tags.py)
    "kustomize tracker image": ("deploy/k8s/kustomization.yaml", 'newTag: "', 'newTag: "9.9.9"\n# was: "',
                                "deploy/k8s/kustomization.yaml images kmq newTag is 9.9.9"),
    "kustomize lag job image": ("deploy/k8s/lag-job-local/kustomization.yaml", 'newTag: "',
                                'newTag: "9.9.9"\n# was: "',
                                "deploy/k8s/lag-job-local/kustomization.yaml images kmq-spark newTag is 9.9.9"),
    "SparkApplication image": ("deploy/k8s/lag-job-operator/sparkapplication.yaml", "image: kmq-spark:",
                               "image: kmq-spark:9.9.9\n# was: ",
                               "deploy/k8s/lag-job-operator/sparkapplication.yaml:18 kmq-spark:9.9.9 tag is 9.9.9"),
    "a tag written in another manifest": ("deploy/k8s/tracker-deployment.yaml", "image: kmq\n", "image: registry.example.com/kmq:0.0.9\n",
                       "deploy/k8s/tracker-deployment.yaml:47 kmq:0.0.9 tag is 0.0.9"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_mismatched_versions_stop_the_release_naming_the_file(tmp_path, case):
    repo = _repo_copy(tmp_path)
    rel, old, new, expect = MISMATCHES[case]
    _edit(repo / rel, old, new)
    proc = subprocess.run([str(repo / "scripts/release.sh"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert expect in proc.stderr and "make them equal" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_version_written_in_pyproject_stops_the_release(tmp_path):
    # One source only: pyproject.toml reads kmq/version.py; a static version there would drift.
    repo = _repo_copy(tmp_path)
    _edit(repo / "pyproject.toml", 'dynamic = ["version"]', 'version = "0.1.0"')
    proc = subprocess.run([str(repo / "scripts/release.sh"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "pyproject.toml must take its version from kmq/version.py" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_pyproject_reads_the_version_from_kmq_version_py():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kmq.version.__version__"}
