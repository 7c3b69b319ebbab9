#!/usr/bin/env bash
# Build a kmq release with one version everywhere:
#   sdist + wheel, the container images (runtime and spark targets), the packaged Helm chart,
#   SHA256SUMS and release.json (versions, digests, what was skipped and why).
#
#   scripts/release.sh [--out DIR] [--image REGISTRY/NAME] [--push] [--require-image]
#
# The version is written in one place, kmq/version.py (__version__); pyproject.toml reads it
# (dynamic version); helm/kmq/Chart.yaml's version and appVersion, and every tag of kmq's own
# images (kmq, kmq-spark) written under deploy/ and helm/ (kustomize newTag, image: kmq-spark:<tag>,
# values.yaml image tags, docker build -t examples) must equal it (the script stops and names
# the file to fix otherwise). Without a running container engine (docker or
# podman) the images are skipped with a clear note and everything else is
# still built; --require-image makes that an error (CI with an engine).
# With --push the images are pushed and their digests recorded, and the
# install command pinning the image by digest is printed (docs/deploy.md).
#
# Exit status: 0 built (images possibly skipped), 1 failed, 2 usage.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=dist
IMAGE=kmq
PUSH=0
REQUIRE_IMAGE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --image) IMAGE="$2"; shift 2 ;;
    --push) PUSH=1; shift ;;
    --require-image) REQUIRE_IMAGE=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "release.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
die() { echo "release.sh: $*" >&2; exit 1; }

# ------------------------------------------------------------ one version
VERSION=$("$PY" - <<'EOF'
import re, sys, tomllib
from pathlib import Path

try:
    import yaml
except ImportError:
    sys.exit("release.sh: PyYAML is needed to check the image tags (pip install pyyaml)")

# The one source: kmq/version.py. pyproject.toml must read it rather than state a version of its own.
version = re.search(r'^__version__ = "([^"]+)"', Path("kmq/version.py").read_text(), re.M).group(1)
project = tomllib.loads(Path("pyproject.toml").read_text())
dynamic = project.get("tool", {}).get("setuptools", {}).get("dynamic", {}).get("version", {}).get("attr")
if "version" in project["project"] or "version" not in project["project"].get("dynamic", []) \
        or dynamic != "kmq.version.__version__":
    sys.exit("release.sh: pyproject.toml must take its version from kmq/version.py: "
             'dynamic = ["version"] and [tool.setuptools.dynamic] version = {attr = "kmq.version.__version__"}')
chart = Path("helm/kmq/Chart.yaml").read_text()
chart_version = re.search(r"^version:\s*\"?([^\"\s]+)", chart, re.M).group(1)
app_version = re.search(r"^appVersion:\s*\"?([^\"\s]+)", chart, re.M).group(1)
found = [("helm/kmq/Chart.yaml version", chart_version), ("helm/kmq/Chart.yaml appVersion", app_version)]

# Every tag of kmq's own images (kmq, kmq-spark) written under deploy/ and helm/, found by
# pattern rather than listed: "<registry/>kmq-spark:<tag>" anywhere (manifests, Dockerfile
# examples), kustomize "images:" entries and the chart's values.yaml image tags when set.
OWN = ("kmq", "kmq-spark")
REF = re.compile(r"(?<![\w.-])(kmq(?:-spark)?):([A-Za-z0-9_][\w.+-]*)")
for path in sorted(p for top in ("deploy", "helm") for p in Path(top).rglob("*") if p.is_file()):
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        continue
    for n, line in enumerate(text.splitlines(), 1):
        for m in REF.finditer(line):
            found.append((f"{path}:{n} {m.group(0)} tag", m.group(2)))
    if path.suffix not in (".yaml", ".yml"):
        continue
    try:
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError:  # a chart template: not YAML until rendered (its tags come from values/Chart)
        continue
    for d in docs:
        if d.get("kind") == "Kustomization":
            for img in d.get("images") or []:
                if img.get("name") in OWN and "newTag" in img:
                    found.append((f"{path} images {img['name']} newTag", str(img["newTag"])))
        if path.name == "values.yaml":
            for key in ("image", "sparkImage"):
                tag = (d.get(key) or {}).get("tag")
                if tag:
                    found.append((f"{path} {key}.tag", str(tag)))
wrong = [f"{where} is {v}" for where, v in found if v != version]
if wrong:
    sys.exit(f"release.sh: versions differ: kmq/version.py says {version} but " + "; ".join(wrong)
             + ": make them equal, then run again")
print(version)
EOF
) || exit 1
echo "==> kmq $VERSION into $OUT/"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# ------------------------------------------------------------ Python packages
echo "==> sdist and wheel"
"$PY" -m build --sdist --wheel --outdir "$OUT" . >"$OUT/build.log" 2>&1 \
  || die "python -m build failed; see $OUT/build.log (pip install build; needs setuptools and wheel from your index)"
WHEEL="kmq-$VERSION-py3-none-any.whl"
SDIST="kmq-$VERSION.tar.gz"
[ -f "$OUT/$WHEEL" ] && [ -f "$OUT/$SDIST" ] || die "build did not produce $WHEEL and $SDIST (see $OUT/build.log)"

# ------------------------------------------------------------ images
IMAGE_STATUS=skipped
IMAGE_NOTE=""
IMAGE_REF="" SPARK_REF=""
ENGINE=""
for candidate in docker podman; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" info >/dev/null 2>&1; then ENGINE=$candidate; break; fi
done
if [ -z "$ENGINE" ]; then
  IMAGE_NOTE="no container engine running here (docker/podman info failed): images not built. On a machine with one: docker build -f deploy/docker/Dockerfile -t $IMAGE:$VERSION . && docker build -f deploy/docker/Dockerfile --target spark -t $IMAGE-spark:$VERSION ."
  echo "==> images: SKIPPED: $IMAGE_NOTE"
  [ "$REQUIRE_IMAGE" = 1 ] && die "--require-image: $IMAGE_NOTE"
else
  echo "==> images with $ENGINE: $IMAGE:$VERSION, $IMAGE-spark:$VERSION"
  "$ENGINE" build -f deploy/docker/Dockerfile -t "$IMAGE:$VERSION" . || die "$ENGINE build (runtime) failed"
  "$ENGINE" build -f deploy/docker/Dockerfile --target spark -t "$IMAGE-spark:$VERSION" . || die "$ENGINE build (spark) failed"
  IMAGE_STATUS=built
  IMAGE_REF="$IMAGE:$VERSION" SPARK_REF="$IMAGE-spark:$VERSION"
  if [ "$PUSH" = 1 ]; then
    "$ENGINE" push "$IMAGE:$VERSION" && "$ENGINE" push "$IMAGE-spark:$VERSION" || die "$ENGINE push failed"
    IMAGE_REF=$("$ENGINE" inspect --format '{{index .RepoDigests 0}}' "$IMAGE:$VERSION")
    SPARK_REF=$("$ENGINE" inspect --format '{{index .RepoDigests 0}}' "$IMAGE-spark:$VERSION")
    IMAGE_STATUS=pushed
  fi
fi

# ------------------------------------------------------------ chart
echo "==> Helm chart"
CHART_TGZ=$("$PY" - "$OUT" "$VERSION" <<'EOF'
import sys

import helm_python

out, version = sys.argv[1], sys.argv[2]
print(helm_python.package("helm/kmq", destination=out, version=version, app_version=version))
EOF
) || die "packaging helm/kmq failed (pip install helm-python-sdk)"

# ------------------------------------------------------------ manifest
(cd "$OUT" && sha256sum "$WHEEL" "$SDIST" "$(basename "$CHART_TGZ")" > SHA256SUMS)
"$PY" - "$OUT" "$VERSION" "$CHART_TGZ" "$IMAGE_STATUS" "$IMAGE_REF" "$SPARK_REF" "$IMAGE_NOTE" <<'EOF'
import hashlib
import json
import sys
from pathlib import Path

import helm_python

out, version, chart, status, image, spark, note = sys.argv[1:8]
files = [f"kmq-{version}-py3-none-any.whl", f"kmq-{version}.tar.gz", Path(chart).name]
manifest = {
    "version": version,
    "artifacts": [{"file": f, "sha256": hashlib.sha256(Path(out, f).read_bytes()).hexdigest()} for f in files],
    "chart": {"file": Path(chart).name, "digest": helm_python.digest(chart)},
    "images": {"status": status, "runtime": image or None, "spark": spark or None, "note": note or None},
}
Path(out, "release.json").write_text(json.dumps(manifest, indent=2) + "\n")
EOF

echo "==> done: $OUT/$WHEEL, $OUT/$SDIST, $CHART_TGZ, SHA256SUMS, release.json"
if [ "$IMAGE_STATUS" = pushed ]; then
  echo "install pinned by digest:"
  echo "  helm install kmq $CHART_TGZ --set image.repository=${IMAGE_REF%@*} --set image.digest=${IMAGE_REF#*@}"
elif [ "$IMAGE_STATUS" = skipped ]; then
  echo "note: images were not built ($IMAGE_NOTE)"
fi
