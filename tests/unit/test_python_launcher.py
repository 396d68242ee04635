"""Spark's zips leave the path of Spark's Python processes only where the installed package is the same version."""

from __future__ import annotations

import zipfile
from pathlib import Path

from spark_writer.python_launcher import path_without_redundant_zips


def _installed(site: Path, package: str, version: str) -> None:
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text("")
    (site / package / "version.py").write_text(f'__version__ = "{version}"\n')


def _zipped(path: Path, package: str, version: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
        archive.writestr(f"{package}/version.py", f'__version__ = "{version}"\n')
    return str(path)


def test_zips_of_installed_packages_of_the_same_version_leave_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _installed(site, "pyspark", "4.3.0")
    _installed(site, "py4j", "0.10.9.9")
    pyspark_zip = _zipped(tmp_path / "pyspark.zip", "pyspark", "4.3.0")
    py4j_zip = _zipped(tmp_path / "py4j-0.10.9.9-src.zip", "py4j", "0.10.9.9")
    jar = str(tmp_path / "spark-core_2.13-4.3.0.jar")

    assert path_without_redundant_zips([pyspark_zip, py4j_zip, jar], [pyspark_zip, str(site)]) == [jar]


def test_a_zip_stays_where_the_installed_package_differs_or_is_missing(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _installed(site, "pyspark", "4.2.0")
    pyspark_zip = _zipped(tmp_path / "pyspark.zip", "pyspark", "4.3.0")
    py4j_zip = _zipped(tmp_path / "py4j-0.10.9.9-src.zip", "py4j", "0.10.9.9")

    path = [pyspark_zip, py4j_zip]
    assert path_without_redundant_zips(path, [str(site)]) == path


def test_a_zip_that_cannot_be_read_stays(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _installed(site, "pyspark", "4.3.0")
    broken = tmp_path / "pyspark.zip"
    broken.write_bytes(b"not a zip")

    assert path_without_redundant_zips([str(broken)], [str(site)]) == [str(broken)]
