"""The project's identity, read from its configuration files without importing flashlib: the
GitHub repository and branch (``repository:`` in _config.yml) and flashlib's version (as
pyproject.toml declares it). The notebooks' set-up cell, the "Open in Colab" links and the
figures' raw URLs in the notebooks all take them from here."""

from __future__ import annotations

import ast

import tomllib
import yaml

from tools.paths import ROOT


def repository() -> tuple[str, str]:
    """``(url, branch)`` of ``repository:`` in _config.yml, the one place they are set."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    return config["url"], config.get("branch", "main")


#: The student notebooks' repository is the repository's URL with this ending: it holds the
#: student edition's notebooks and flashlib's wheel only (tools/student_notebooks.py), so
#: that no link a student is given, edited by hand, reaches a notebook with solutions.
STUDENT_SUFFIX = "-student"


def student_repository() -> str:
    """The URL of the student notebooks' repository (``repository.url`` + ``-student``)."""
    return repository()[0].rstrip("/").removesuffix(".git") + STUDENT_SUFFIX


def version() -> str:
    """flashlib's version as pyproject.toml declares it: ``project.version``, or the module
    attribute its dynamic version names (``flashlib.__version__``), read without importing."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    if "version" in project["project"]:
        return project["project"]["version"]
    module, _, name = project["tool"]["setuptools"]["dynamic"]["version"]["attr"].rpartition(".")
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path.relative_to(ROOT)}: no {name} = '...'")
