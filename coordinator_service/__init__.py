"""sink-coordinator: a two-phase commit coordinator from Spark micro-batches to Apache Iceberg."""

# pyproject.toml's version, written here too: the package also runs from a --py-files zip, where no installed
# metadata says it (tests/unit/test_release_versions.py holds the two, and the chart, to one version).
__version__ = "0.1.0"
