"""The Grafana dashboard of a render as the values say: none unless grafanaDashboard.enabled; else one ConfigMap
with the sidecar's label (grafanaDashboard.labels) and annotations, holding dashboards/sink-coordinator.json
unchanged.

    python dashboard.py CHART MANIFEST VALUES_FILE...   (the chart's values.yaml first)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from chart_values import documents, report, values

KEY = "sink-coordinator.json"


def main(chart: Path, manifest: str, value_files: list[str]) -> None:
    config = values(value_files)["grafanaDashboard"]
    maps = [d for d in documents(manifest) if d["kind"] == "ConfigMap" and KEY in (d.get("data") or {})]
    if not config["enabled"]:
        report(["a dashboard ConfigMap is rendered although grafanaDashboard.enabled is false"] if maps else [])
    if len(maps) != 1:
        report([f"{len(maps)} dashboard ConfigMaps rendered, want 1"])
    [config_map] = maps
    metadata = config_map["metadata"]
    errors = []
    if not config["labels"].items() <= metadata["labels"].items():
        errors.append(f"the dashboard ConfigMap's labels {metadata['labels']} lack {config['labels']}")
    if (metadata.get("annotations") or {}) != config["annotations"]:
        errors.append(f"the dashboard ConfigMap's annotations are {metadata.get('annotations')}")
    if json.loads(config_map["data"][KEY]) != json.loads((chart / "dashboards" / KEY).read_text()):
        errors.append(f"the dashboard ConfigMap does not hold dashboards/{KEY}")
    report(errors)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
