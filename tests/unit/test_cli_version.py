"""One version everywhere a user looks: `kata-sizing --version`, the package metadata, the
chart, the image label and the Deployment's image tag."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import yaml

import kata_sizing
from tests.support.paths import ROOT


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as stream:
        return tomllib.load(stream)["project"]["version"]


def test_version_flag_prints_the_release() -> None:
    result = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "--version"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kata-sizing {project_version()}"


def test_every_place_says_the_same_version() -> None:
    version = project_version()
    assert kata_sizing.__version__ == version
    chart = yaml.safe_load((ROOT / "charts" / "kata-sizing" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^ARG VERSION={re.escape(version)}$", dockerfile, re.M)
    assert f"ghcr.io/kata-sizing/kata-sizing:{version}" in (ROOT / "manifests" / "deployment.yaml").read_text()


def test_the_changelog_has_an_entry_for_the_release() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(project_version())}\]?", text, re.M)


def test_the_license_is_the_apache_license_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    with (ROOT / "pyproject.toml").open("rb") as stream:
        declared = tomllib.load(stream)["project"]["license"]
    assert declared == {"text": "Apache-2.0"}
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
