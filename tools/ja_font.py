"""The Japanese edition's font: a subset of Noto Sans CJK JP with only the characters the
edition uses, shipped with the site (book/_static/fonts/), so that a machine without Japanese
fonts (headless Chromium on CI, many Linux desktops) shows the pages without tofu.

    python -m tools.ja_font            # after translating: rewrite the subset (needs Debian's
                                       # fonts-noto-cjk: apt-get install fonts-noto-cjk)

The characters are every non-ASCII character of the Japanese catalogs (locales/ja/...) and of
the strings the code draws in Japanese (flashlib/book/locale/ja/*.json), plus the kana and
punctuation blocks. tests/i18n/test_ja_site.py fails on a character of the built Japanese
pages that the subset lacks (then run this again). The font is SIL Open Font License 1.1
(its licence file is shipped beside it); book/_static/flashlib.css puts it after the reader's
own Japanese fonts, so a reader who has them never downloads it, and only Japanese pages use it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.paths import ROOT

#: One weight: a browser synthesises bold from it (a second weight would cost 427 KiB more on
#: every page of a machine without Japanese fonts, past the 3.5 MB budget).
SOURCES = {"Regular": Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")}
#: The face of Noto Sans CJK's collection that is Japanese ("Noto Sans CJK JP").
JP_FACE = 0
FONTS = ROOT / "book" / "_static" / "fonts"
CODE_STRINGS = ROOT / "flashlib" / "book" / "locale" / "ja"
#: Added to matplotlib's font only: ASCII (a label holding mathtext is drawn in the Japanese
#: font alone). The web font holds only the characters the pages use, ASCII left out: the
#: reader's own fonts come first in the CSS and draw it; every kilobyte counts, since a page
#: of a machine without Japanese fonts downloads the font within its 3.5 MB.
BLOCKS = [(0x20, 0x7E)]


#: The same subset (regular weight) for matplotlib, which cannot read woff2: the Japanese
#: labels of the book's PNG figures (flashlib.book.plots.japanese_png), on the site and Colab.
MATPLOTLIB_FONT = ROOT / "flashlib" / "book" / "fonts" / "NotoSansJP-subset-Regular.otf"


def font_path(weight: str) -> Path:
    return FONTS / f"NotoSansJP-subset-{weight}.woff2"


def characters() -> set[str]:
    """Every character the Japanese edition may show in its own font."""
    from tools.catalogs import catalogs, read

    chars: set[str] = set()
    for path in catalogs():
        for message in read(path):
            chars.update(str(message.string or ""))
    for table in sorted(CODE_STRINGS.glob("*.json")):
        for value in json.loads(table.read_text(encoding="utf-8")).values():
            chars.update(value)
    return {c for c in chars if not c.isspace() and ord(c) > 0x7E}


def _block_characters() -> set[str]:
    return {chr(c) for lo, hi in BLOCKS for c in range(lo, hi + 1)}


def covered(weight: str = "Regular") -> set[str]:
    """The characters the shipped subset has a glyph for."""
    from fontTools.ttLib import TTFont

    font = TTFont(font_path(weight))
    return {chr(c) for c in font.getBestCmap()}


def write() -> None:
    from fontTools import subset

    FONTS.mkdir(parents=True, exist_ok=True)
    text = "".join(sorted(characters()))
    for weight, source in SOURCES.items():
        if not source.is_file():
            raise SystemExit(f"{source}: missing (apt-get install fonts-noto-cjk)")
        options = subset.Options()
        options.flavor = "woff2"
        options.font_number = JP_FACE
        options.layout_features = ["*"]
        options.name_IDs = ["*"]
        options.notdef_outline = True
        font = subset.load_font(str(source), options)
        subsetter = subset.Subsetter(options)
        subsetter.populate(text=text)
        subsetter.subset(font)
        subset.save_font(font, str(font_path(weight)), options)
        print(f"{font_path(weight).relative_to(ROOT)}: {len(text)} characters, "
              f"{font_path(weight).stat().st_size / 1024:.0f} KiB")
        if weight == "Regular":
            options.flavor = None
            MATPLOTLIB_FONT.parent.mkdir(parents=True, exist_ok=True)
            font = subset.load_font(str(source), options)
            subsetter = subset.Subsetter(options)
            subsetter.populate(text=text + "".join(sorted(_block_characters())))
            subsetter.subset(font)
            subset.save_font(font, str(MATPLOTLIB_FONT), options)
            print(f"{MATPLOTLIB_FONT.relative_to(ROOT)}: "
                  f"{MATPLOTLIB_FONT.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
