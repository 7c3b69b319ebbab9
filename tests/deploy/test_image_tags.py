"""Every tag of kmq's own images (kmq, kmq-spark) written under deploy/ and helm/ is the
release version, kmq.version.__version__ (the one place it is written). Tags are found by
pattern, not from a list of files, so a new manifest naming the image is checked too;
scripts/release.sh runs the same check before it builds (tests/deploy/test_release.py)."""

from __future__ import annotations

import re

import yaml

from kmq.version import __version__
from tests.deploy.conftest import ROOT

OWN = ("kmq", "kmq-spark")
# "<registry/>kmq:<tag>" or "kmq-spark:<tag>"; "kmq:" as a YAML key or prose ("kmq: the...") has no tag.
REF = re.compile(r"(?<![\w.-])(kmq(?:-spark)?):([A-Za-z0-9_][\w.+-]*)")


def _files():
    for top in ("deploy", "helm"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file():
                try:
                    yield path.relative_to(ROOT), path.read_text()
                except UnicodeDecodeError:
                    continue


def _image_tags() -> list[tuple[str, str]]:
    """(where, tag) for every tag of kmq's images under deploy/ and helm/."""
    found = []
    for rel, text in _files():
        for n, line in enumerate(text.splitlines(), 1):
            found += [(f"{rel}:{n} {m.group(0)}", m.group(2)) for m in REF.finditer(line)]
        if rel.suffix not in (".yaml", ".yml"):
            continue
        try:
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        except yaml.YAMLError:  # a chart template: its tags come from values.yaml / Chart.yaml
            continue
        for d in docs:
            if d.get("kind") == "Kustomization":
                found += [(f"{rel} images {i['name']} newTag", str(i["newTag"]))
                          for i in d.get("images") or [] if i.get("name") in OWN and "newTag" in i]
            if rel.name == "values.yaml":
                found += [(f"{rel} {k}.tag", str(d[k]["tag"])) for k in ("image", "sparkImage")
                          if (d.get(k) or {}).get("tag")]
    return found


def test_every_tag_of_kmqs_images_in_deploy_and_helm_is_the_release_version():
    tags = _image_tags()
    wrong = [f"{w} is {t}" for w, t in tags if t != __version__]
    assert not wrong, f"kmq/version.py says {__version__}: " + "; ".join(wrong)
    # The search still sees the places known today (a pattern that matched nothing would pass).
    where = " ".join(w for w, _ in tags)
    for known in ("deploy/k8s/kustomization.yaml images kmq newTag",
                  "deploy/k8s/lag-job-local/kustomization.yaml images kmq-spark newTag",
                  "deploy/k8s/lag-job-operator/sparkapplication.yaml:"):
        assert known in where, f"{known} not found among {where}"


def test_the_chart_tags_its_images_with_its_appversion():
    # Chart templates name no tag themselves: an empty values tag means .Chart.AppVersion, which
    # test_release.py and release.sh hold equal to kmq/version.py.
    chart = yaml.safe_load((ROOT / "helm/kmq/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm/kmq/values.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == __version__
    assert values["image"]["tag"] in ("", __version__) and values["sparkImage"]["tag"] in ("", __version__)
    helpers = (ROOT / "helm/kmq/templates/_helpers.tpl").read_text()
    assert "default .appVersion .tag" in helpers
