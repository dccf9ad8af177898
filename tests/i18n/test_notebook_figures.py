"""A figure in a Japanese notebook (FLASHLIB_LANG=ja) is the Japanese site's figure: texts,
tick labels written by the axis's formatter (category names) included, as
flashlib.book.plots.japanese_png draws it for the site."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from flashlib.book import i18n, plots  # noqa: E402
from flashlib.book.site import STATIC_ENV  # noqa: E402


def _bars():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2), layout="constrained")
    ax.barh(["naive backward (float32)", "within noise"], [1, 2])  # category ticks
    ax.set_xlabel("slower")
    return fig


@pytest.fixture
def japanese():
    i18n.set_language("ja")
    yield
    i18n.set_language("en")


def test_a_japanese_notebook_shows_the_japanese_sites_figure(monkeypatch, japanese) -> None:
    monkeypatch.setenv(STATIC_ENV, "1")
    site = plots.show(_bars(), alt="Two bars.")
    monkeypatch.delenv(STATIC_ENV)
    notebook = plots.show(_bars(), alt="Two bars.")
    assert site.png_ja is not None and notebook.png_ja is None
    assert notebook.png == site.png_ja  # the category ticks translated too
    assert notebook.png != site.png
