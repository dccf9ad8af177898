"""Exercise 8.3's checker names sets of quantities in its messages ("returned {'S', 'm'} (2
names, ...), but {'m'} meets the rule ..."): whatever set a learner returns, the Japanese
message has no English left, since the table holds each message once with ``{s0}``, ``{s1}``
for the sets (flashlib.book.i18n.NAMES)."""

from __future__ import annotations

import itertools
import re

import pytest

from flashlib.book import i18n
from flashlib.book.exercises import precision

#: Three English words in a row, outside code spans: a part left untranslated.
ENGLISH = re.compile(r"[A-Za-z]{3,}(?:\s+[A-Za-z]{2,}){2,}")
SETS = [None] + [frozenset(c) for k in range(len(precision.QUANTITIES) + 1)
                 for c in itertools.combinations(precision.QUANTITIES, k)]


def test_a_set_is_a_hole_of_the_template() -> None:
    words = {"returned {s0}, but {s1} passes ({0} calls)": "{s0} ではなく {s1}（{0} 回）"}
    assert i18n._lookup("returned {'S', 'm'}, but set() passes (3 calls)", words) == (
        "{'S', 'm'} ではなく set()（3 回）")
    assert i18n._lookup("returned {'S'}, but nothing passes", words) is None


@pytest.mark.parametrize("label, ratio", precision.MADE_UP, ids=lambda x: str(x)[:40])
def test_every_message_about_any_set_is_japanese(label, ratio) -> None:
    left = []
    for got, called in itertools.product(SETS, (0, 3)):
        problem = precision._keep_problem(ratio, got, called)
        if problem is None:
            continue
        text = i18n.translate(f"{label}: {problem}", "ja")
        if ENGLISH.search(re.sub(r"`[^`]*`", "", text)):
            left.append(text)
    assert not left, f"{len(left)} messages keep English, e.g. {left[:3]}"
