"""kata-sizing: size Kata Containers RuntimeClasses from one policy, and keep them in sync."""

# The release; pyproject.toml, charts/kata-sizing/Chart.yaml and the Dockerfile's VERSION
# say the same (tests/unit/test_cli_version.py keeps them equal).
__version__ = "0.1.0"
