"""Where a render's pods go and what keeps them: a PodDisruptionBudget (minAvailable 1, the pods' selector) iff
PDB is "pdb"; the pods' affinity the chart's soft anti-affinity by hostname (AFFINITY "soft"), none ("none"), or
exactly the affinity of VALUES_FILE ("values"); the memory request MEMORY, if given.

    python scheduling.py MANIFEST PDB AFFINITY [VALUES_FILE [MEMORY]]
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from chart_values import documents, report


def main(manifest: str, pdb: str, affinity: str, values_file: str = "", memory: str = "") -> None:
    docs = documents(manifest)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]["spec"]
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    errors = []
    if pdb == "pdb":
        if [(b["spec"].get("minAvailable"), b["spec"]["selector"]["matchLabels"]) for b in budgets] != [(1, selector)]:
            errors.append(f"want one PodDisruptionBudget, minAvailable 1, of the pods' selector; got {budgets}")
    elif budgets:
        errors.append("a PodDisruptionBudget is rendered")
    soft = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector},
                    },
                }
            ]
        }
    }
    want: dict[str, Any] | None = {"soft": soft, "none": None}.get(affinity)
    if affinity == "values":
        with open(values_file) as stream:
            want = (yaml.safe_load(stream) or {}).get("affinity")
    if pod.get("affinity") != want:
        errors.append(f"the pods' affinity is {pod.get('affinity')}, want {want}")
    [container] = [c for c in pod["containers"] if c["name"] == "coordinator"]
    if memory and container["resources"]["requests"]["memory"] != memory:
        errors.append(f"the memory request is {container['resources']['requests']['memory']}, want {memory}")
    report(errors)


if __name__ == "__main__":
    main(*sys.argv[1:])
