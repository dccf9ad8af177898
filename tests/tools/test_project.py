"""tools/project.py: the repository and the version, each set in one place."""

from __future__ import annotations

import re

import tomllib
import yaml

from tools import book_extension, project, toc
from tools.paths import ROOT


def test_repository_is_the_configured_one():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert project.repository() == (config["url"], config["branch"])
    assert book_extension.repository is project.repository
    assert book_extension.is_notebook is toc.is_notebook


def pyproject_version() -> str:
    """The version pip installs: pyproject.toml's (static or ``flashlib.__version__``)."""
    import flashlib

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    return project["project"].get("version", flashlib.__version__)


def test_one_version_everywhere():
    import importlib.metadata

    import flashlib

    assert flashlib.__version__ == pyproject_version() == project.version()
    assert importlib.metadata.version("flashlib") == flashlib.__version__  # as installed


def test_readme_says_releases_are_tagged():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"\btagged\s+`v<version>`", readme), (
        "README.md: say that each release is tagged v<version>")
