"""Checker messages that show what a learner's function returned are Japanese whatever it
returned. The table holds each such message once: ``{s0}``, ``{s1}`` for sets of names
(exercise 8.3: "returned {'S', 'm'} (2 names, ...), but {'m'} meets the rule ..."), ``{r0}``
for the value after a final "got " ("expected a number, got 'eleven'")."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from flashlib.book import i18n
from flashlib.book.exercises import precision

EXERCISES = Path(precision.__file__).parent

#: Three English words in a row, outside code spans: a part left untranslated.
ENGLISH = re.compile(r"[A-Za-z]{3,}(?:\s+[A-Za-z]{2,}){2,}")
SETS = [None] + [frozenset(c) for k in range(len(precision.QUANTITIES) + 1)
                 for c in itertools.combinations(precision.QUANTITIES, k)]


def test_a_set_is_a_hole_of_the_template() -> None:
    words = {"returned {s0}, but {s1} passes ({0} calls)": "{s0} ではなく {s1}（{0} 回）"}
    assert i18n._lookup("returned {'S', 'm'}, but set() passes (3 calls)", words) == (
        "{'S', 'm'} ではなく set()（3 回）")
    assert i18n._lookup("returned {'S'}, but nothing passes", words) is None


@pytest.mark.parametrize("label, ratio", precision.MADE_UP,
                         ids=[label[:40] for label, _ in precision.MADE_UP])
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


def _got_messages() -> list[tuple[str, str]]:
    """(module, message head) of each f-string in flashlib/book/exercises that ends with
    "got {value!r}": the head after its last ": " (the part translated on its own), when no
    other value is put into it."""
    found = []
    for path in sorted(EXERCISES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.JoinedStr) and node.values
                    and isinstance(node.values[-1], ast.FormattedValue)
                    and node.values[-1].conversion == ord("r")):
                continue
            head = "".join(v.value if isinstance(v, ast.Constant) else "\0"
                           for v in node.values[:-1])
            if re.search(r"(^|[,;] )got $", head):
                head = i18n.parts(head + "x")[-1][:-1]
                if "\0" not in head:
                    found.append((path.name, head))
    return found


@pytest.mark.parametrize("module, head", _got_messages(), ids=lambda x: x[:40])
def test_what_a_learner_returned_is_shown_in_a_japanese_message(module, head) -> None:
    for value in ("'eleven'", "[1.5, 2]", "None", "<object object at 0x7f3a>"):
        text = i18n.translate(head + value, "ja")
        assert text != head + value and value in text, f"{module}: {head + value!r} -> {text!r}"
