"""The test suite's fixtures and the markers that skip what this machine cannot run.

Markers (pyproject.toml): ``site`` needs the built book (``make book``: _build/html) and
``student_site`` its student edition (``make book-student``); ``browser`` needs Chromium
(tools/browser.py finds it); ``gpu`` needs a CUDA GPU; ``sandbox`` needs the grader's full
sandbox (bubblewrap, nested user namespaces: grading/sandbox.py's "namespaces" level);
``slow`` builds fresh virtual environments.  A test whose requirement is missing is skipped,
with the reason, so that a plain ``pytest`` on a fresh clone passes; ``make test`` sets
``FLASHLIB_REQUIRE_ALL=1``, and then a missing site, browser or sandbox fails the run
instead (only ``gpu`` may still skip, and the markers named in ``FLASHLIB_MAY_SKIP``).
Shared references and helpers: tests/helpers.py.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from tools.browser import find_chromium
from tools.paths import BUILD_HTML, STUDENT_HTML

# Deterministic, database-less hypothesis runs (CI and local runs see the same examples).
settings.register_profile(
    "flashlib-ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=50,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "flashlib-ci"))

# Keep the 2-core machine predictable: one BLAS thread, one torch thread.
try:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
except ImportError:  # pragma: no cover - threadpoolctl is pinned in requirements.txt
    pass

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is pinned in requirements.txt
    torch = None

REQUIRE_ALL = os.environ.get("FLASHLIB_REQUIRE_ALL") == "1"
#: Markers that may still skip under FLASHLIB_REQUIRE_ALL=1, comma-separated: .ci/run sets
#: ``FLASHLIB_MAY_SKIP=sandbox`` (and says why) on a CI machine whose container refuses the
#: user namespaces that bubblewrap needs.
MAY_SKIP = {name.strip() for name in os.environ.get("FLASHLIB_MAY_SKIP", "").split(",")
            if name.strip()}
MISSING = pytest.StashKey[str]()


@functools.cache
def _confinement():
    from grading.sandbox import probe

    return probe()


def _sandbox() -> bool:
    return _confinement().level == "namespaces"


def _cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


#: marker -> (is the requirement met?, why it is skipped (a text, or a function giving
#: it), may it skip under make test?)
REQUIREMENTS = {
    "site": (lambda: (BUILD_HTML / "index.html").exists(),
             "the site is not built (run `make book`)", False),
    "student_site": (lambda: (STUDENT_HTML / "index.html").exists(),
                     "the student site is not built (run `make book-student`)", False),
    "browser": (lambda: find_chromium() is not None,
                "no Chromium found (set CHROMIUM, install chromium, or "
                "`.venv/bin/python -m playwright install chromium`)", False),
    "gpu": (_cuda, "needs a CUDA GPU (torch sees none)", True),
    "sandbox": (_sandbox, lambda: "no full sandbox for the grader here (bubblewrap with user "
                          f"namespaces; grading/sandbox.py): {_confinement().describe()}",
                False),
}


def pytest_collection_modifyitems(config, items) -> None:
    met: dict[str, bool] = {}
    for item in items:
        for name, (check, reason, may_skip) in REQUIREMENTS.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in met:
                met[name] = bool(check())
            if met[name]:
                continue
            if callable(reason):
                reason = reason()
            if REQUIRE_ALL and not may_skip and name not in MAY_SKIP:
                item.stash[MISSING] = f"make test needs it: {reason}"
            else:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item) -> None:
    """Under FLASHLIB_REQUIRE_ALL=1, a test whose requirement is missing fails (an xfail
    would let the run pass)."""
    if MISSING in item.stash:
        pytest.fail(item.stash[MISSING], pytrace=False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _default_errstate():
    """numpy's default error handling, so RuntimeWarnings surface (pytest turns them into
    errors) whatever another test module did to the global state."""
    with np.errstate(divide="warn", over="warn", invalid="warn", under="ignore"):
        yield


def pytest_terminal_summary(terminalreporter) -> None:
    """The page weights the browser tests measured (tests/site/test_site.py), one line per
    page, also written to test-artifacts/page-weights.json."""
    browser = sys.modules.get("tests.browser")
    weights = getattr(browser, "PAGE_WEIGHTS", None)
    if not weights:
        return
    limit = browser.MAX_PAGE_BYTES
    terminalreporter.write_sep("-", f"page weights (limit {limit / 1e6:.1f} MB, everything "
                                    "the browser loads)")
    for page, size in sorted(weights.items()):
        terminalreporter.write_line(f"{size / 1e6:6.2f} MB  {page}")
    browser.write_weights()
