"""What the checks of scripts/helm_check.sh share: a render's documents, the values a render was given (the chart's
values.yaml under the value files, merged as Helm merges them), and the exit with the errors found."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def documents(manifest: str | Path) -> list[dict[str, Any]]:
    """The resources of a rendered manifest."""
    with open(manifest) as stream:
        return [document for document in yaml.safe_load_all(stream) if document]


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """over on top of base; maps are merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def values(files: list[str]) -> dict[str, Any]:
    """The values of the files, each over the ones before (the chart's values.yaml first)."""
    result: dict[str, Any] = {}
    for name in files:
        with open(name) as stream:
            result = merged(result, yaml.safe_load(stream) or {})
    return result


def report(errors: list[str]) -> None:
    """Exit 1 with the errors on stderr, or 0."""
    for error in errors:
        sys.stderr.write(error + "\n")
    sys.exit(1 if errors else 0)
