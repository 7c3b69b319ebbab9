"""Files for ``spark-submit``: the kmq package as a zip plus a small main script.

``python -m kmq.spark.bundle OUTDIR`` writes ``OUTDIR/kmq.zip`` (for
``--py-files``) and ``OUTDIR/kmq_lag_job.py`` (the application file)::

    spark-submit --py-files OUTDIR/kmq.zip OUTDIR/kmq_lag_job.py --config kmq.yaml --checkpoint s3a://...

The cluster's Python needs kmq's dependencies (kafka-python, click, pyyaml,
prometheus-client, pyarrow, pandas); see docs/spark.md.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

__all__ = ["build_bundle", "MAIN_SCRIPT"]

MAIN_SCRIPT = '''"""spark-submit entry point of the kmq lag job (arguments as for `kmq lag-job`)."""
import sys

from kmq.cli import main

main(["lag-job", *sys.argv[1:]])
'''


def build_bundle(outdir: str | Path) -> tuple[Path, Path]:
    """Write kmq.zip and kmq_lag_job.py into ``outdir``; returns their paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]  # the kmq package directory
    zpath = out / "kmq.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".typed"):
                zf.write(f, Path("kmq") / f.relative_to(root))
    main = out / "kmq_lag_job.py"
    main.write_text(MAIN_SCRIPT)
    return zpath, main


if __name__ == "__main__":  # pragma: no cover - thin CLI
    if len(sys.argv) != 2:
        sys.exit("usage: python -m kmq.spark.bundle OUTDIR")
    z, m = build_bundle(sys.argv[1])
    print(f"{z}\n{m}")
