"""The student edition gives no answer away: no checker passes with what the student edition
shows (issue 25).  For every exercise, every checker is run on

- every function the chapter **imports** (called as the student would call it: the library's
  own function, which the checker refuses where the exercise asks for it), every function it
  **shows** (``literalinclude`` outside solutions, and the functions its code cells define;
  as the student's copy, compiled again, since a student can paste shown code), whose
  arguments fit the exercise's function;
- every **number printed** on the chapter's student page (the text, the code cells'
  outputs, the widgets' data; the notebooks print the same numbers, computed by the same
  cells), as the answer itself where the exercise asks for a number (the number the
  solution's answer rounds to, and every printed number within a factor of 2 of it: a
  student guessing among the page's numbers), and as a function that
  looks the answer up among the printed numbers (the book's solution says which number is
  the answer to each call, standing for a student reading the page); only numbers with three
  significant digits or more count (a 4 or a 64 is printed everywhere).

And, for every exercise whose answer is a number, a set, a letter or a formula (issue 35),
the student page's **prose** is searched for that answer (the book's variant 0, the one the
site prints) near the exercise's key terms (:data:`STATED`); tests/tools/test_student_prose.py
runs the same search on the chapters without their solutions when the site is not built, and
checks that it catches the six answers the site stated before issue 35 (:data:`BEFORE`).

An exercise that passes is a spoiler.  The exercises that spoil today are listed in
:data:`KNOWN_SPOILERS` with why; issues 23 and 24 rework them.  The test fails on a spoiler
not on the list, and on a listed one that no longer spoils (so the list cannot go stale):
remove it from the list when its exercise is reworked.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import functools
import html
import importlib
import inspect
import io
import math
import re
import signal
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grading import chapters, grade, made_up_class
from tools import convert, toc
from tools.paths import STUDENT_HTML

pytestmark = [pytest.mark.site, pytest.mark.student_site]

#: Exercises that the student edition answers today, with what answers them.  Issues 23 and
#: 24 rework each one (different sizes, another variant, a derivation) so that the student
#: edition asks for something its pages have not printed, shown or imported.
KNOWN_SPOILERS: dict[str, str] = {}
# Reworked by issue 35 once issue 31 made the shown teaching functions right on the empty
# state: 3.1 asks for the update of a block of values at once (online_update, shown, reads one
# value and returns arrays for a block); 3.2 merges states handed over normalised, (m, l,
# o = acc / l) (merge_states, shown, merges o as if it were acc).
# Answered before issue 25 and no longer: 4.4 (paper_block_sizes, imported), 8.1 (round_to),
# 8.2 (dot), 9.2 (io_count, imported under the exercise's name), 11.1 (naive_attention over
# all the keys), 11.2 (flash_attention): their checkers refuse the library's function
# (flashlib.book.exercises.forbidding), which the chapter imports but does not show.
# Reworked by the chapters (issues 23, 24) so that nothing shown or printed answers them:
# 1.4 asks for (O, lse) (naive_attention, shown, returns O alone); 2.1 asks for zeros on an
# all -inf row (safe_softmax, shown, gives NaN); 2.2 asks for bfloat16 too (the three printed
# thresholds do not cover it, exp_overflow_threshold is no longer shown and refuses
# bfloat16); 3.2: merge_partials' _merge is no longer shown (merge_states, shown, has no
# guard for two empty states); 4.1 asks for the state (m, l, acc) (flash1_forward and
# flash2_forward, shown, return O); 6.1's tile_class takes start and stop (band_tile_class,
# shown, takes 7 arguments); 7.1 asks for D with dL (delta_from_O, shown, takes 2); 8.4 asks
# for FlashAttention-3's allowance (assert_error_within, shown, takes no dtype); 9.1 asks for
# N = 2000, d = 80 (the widget holds N = 1024); 9.3 asks for FlashAttention-2's crossover
# (the page prints Algorithm 1's), at d = 96: at d = 64 the page's 8,064 and 8,192 lie in the
# threshold's block of M, whose every value the checker accepts.

#: Checkers given more time than the others are not tried on every candidate: the GPU chapter's
#: run a Triton kernel per case (seconds in the interpreter), so only candidates whose name
#: says they are the piece (a function of the same name) are tried there.
SLOW = ("flashlib.book.exercises.gpu.",)
#: Modules whose functions answer no exercise (the book's figures, glue, widgets, checkers;
#: the measuring helpers): not tried, to keep the test fast.
HELPERS = ("flashlib.book", "flashlib.core.measure", "matplotlib", "IPython")
NUMBER = re.compile(r"(?<![\w.])[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
                    r"(?![\w])")


# ---------------------------------------------------------------------------------------------
# What the student edition shows
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Printed:
    value: float
    text: str
    tolerance: float  # half a unit of its last printed digit


def _parse_number(text: str) -> Printed | None:
    clean = text.replace("\u2212", "-").replace(",", "")
    try:
        value = float(clean)
    except ValueError:
        return None
    mantissa, _, exponent = clean.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    digits = len(mantissa.lstrip("-").replace(".", "").lstrip("0"))
    if digits < 3 or not math.isfinite(value):
        return None  # 4, 64, 0.5: printed everywhere, they answer nothing by themselves
    tolerance = 0.5 * 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)
    return Printed(value, text, tolerance)


@functools.cache
def printed_numbers(chapter: str) -> tuple[Printed, ...]:
    """Every distinctive number of the chapter's student page: its text, outputs and the
    widgets' data (script elements included)."""
    page = STUDENT_HTML / "book" / f"{chapter}.html"
    text = html.unescape(page.read_text(encoding="utf-8"))
    text = re.sub(r"<(?:link|meta)[^>]*>", " ", text)  # asset names and hashes
    found = {}
    for match in NUMBER.finditer(text):
        number = _parse_number(match[0])
        if number is not None:
            found.setdefault((number.value, number.tolerance), number)
    return tuple(sorted(found.values(), key=lambda p: p.value))


def printed_answer(chapter: str, value: Any) -> Any:
    """``value`` (a number, or a tuple or list of them) with each number replaced by a printed
    number it rounds to; LookupError if one is not printed."""
    if type(value) in (tuple, list):
        return type(value)(printed_answer(chapter, v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise LookupError(f"not a number: {value!r}")
    numbers = printed_numbers(chapter)
    values = [p.value for p in numbers]
    x = float(value)
    lo = bisect.bisect_left(values, x - max(1.0, abs(x) * 1e-3))
    near = []  # the printed numbers x rounds to; a student copies the most precise
    for p in numbers[lo:]:
        if p.value > x + max(1.0, abs(x) * 1e-3):
            break
        if abs(p.value - x) <= p.tolerance:
            near.append(p)
    if not near:
        raise LookupError(f"{value!r} is not printed on the page")
    best = min(near, key=lambda p: (abs(p.value - x), p.tolerance))
    if isinstance(value, int | np.integer) and best.value.is_integer():
        return int(best.value)
    return best.value


def chapter_imports(source: Path) -> dict[str, Any]:
    """The chapter's namespace as far as its imports go: every top-level import of its code
    cells (the student notebook's), run."""
    nb = convert.clean_notebook(source, student=True)
    namespace: dict[str, Any] = {"__name__": f"chapter_{source.stem}"}
    for cell in nb.cells:
        if cell.cell_type != "code" or "google.colab" in cell.source:
            continue
        tree = chapters._parse(cell.source)
        for node in tree.body if tree else ():
            if isinstance(node, ast.Import | ast.ImportFrom):
                with contextlib.suppress(Exception):
                    exec(compile(ast.Module([node], []), "<import>", "exec"),  # noqa: S102
                         namespace)
    return namespace


def shown_functions(source: Path, namespace: dict[str, Any]) -> dict[str, Any]:
    """``{name: function}``: the student's copies (compiled again) of every function the
    student page shows: literalinclude outside solutions, and the functions the chapter's own
    code cells define."""
    from tests.tools.test_student_edition import solutions

    text = solutions(source)[1]
    found: dict[str, Any] = {}
    for match in re.finditer(r"```\{literalinclude\}\s+(\S+)\n((?::[\w-]+:.*\n)*)", text):
        path = (source.parent / match[1]).resolve()
        if path.suffix != ".py" or not path.is_relative_to(grade.ROOT / "flashlib"):
            continue
        module = importlib.import_module(".".join(path.relative_to(grade.ROOT).with_suffix(
            "").parts))
        option = re.search(r":pyobject:\s*(\S+)", match[2])
        names = [option[1]] if option else [n for n, obj in vars(module).items()
                                            if inspect.isfunction(obj)
                                            and obj.__module__ == module.__name__]
        for name in names:
            obj = functools.reduce(getattr, name.split("."), module)
            copy = _copy(obj)
            if copy is not None:
                found[name.split(".")[-1]] = copy
    nb = convert.clean_notebook(source, student=True)
    exercise_cells = {i for ids in chapters.exercise_cells(nb).values() for i in ids}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in exercise_cells:
            continue
        tree = chapters._parse(cell.source)
        for node in tree.body if tree else ():
            if isinstance(node, ast.FunctionDef):
                local = dict(namespace)
                with contextlib.suppress(Exception):
                    exec(compile(ast.Module([node], []), f"<chapter cell {i}>", "exec"),  # noqa: S102
                         local)
                    found[node.name] = local[node.name]
    return found


def _copy(fn: Any) -> Any:
    """A student's copy of a shown library function (its code compiled again)."""
    try:
        original = inspect.unwrap(fn)
        namespace = dict(original.__globals__)
        exec(compile(textwrap.dedent(inspect.getsource(original)),  # noqa: S102
                     f"<copy of {original.__qualname__}>", "exec"), namespace)
        return namespace[original.__name__]
    except (TypeError, OSError, KeyError, SyntaxError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# Each exercise against it
# ---------------------------------------------------------------------------------------------

def _arity(fn: Any) -> tuple[int, int] | None:
    """(required, most) positional arguments ``fn`` takes; None if it cannot tell."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    star = any(p.kind == p.VAR_POSITIONAL for p in params)
    return required, (10**6 if star else len(positional))


class _TooLong(BaseException):
    """A candidate still running after :data:`CANDIDATE_SECONDS` (a BaseException, so that a
    checker's ``except Exception`` lets it through)."""


#: Seconds one checker may take with one candidate: a library function called with sizes it
#: was not meant for (a memory model asked about n = 10**6) is given up on, not a spoiler.
CANDIDATE_SECONDS = 10.0


def _quiet_check(checker: Any, *args: Any) -> bool:
    """Whether the checker passes (its learner's prints and warnings kept out of the log)."""
    def ring(signum: int, frame: Any) -> None:
        raise _TooLong

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, CANDIDATE_SECONDS)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return bool(checker(*args).passed)
    except _TooLong:
        return False
    except Exception:  # noqa: BLE001 - a checker never raises; if it does, no spoiler
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _starter_roles(starter: str, args: list[str]) -> list[tuple[str, int | None]]:
    """For each argument of the checker call: ``("function", n_params)`` when the exercise's
    cell defines it with ``def``, else ``("value", None)``."""
    tree = ast.parse(starter)
    defs = {f.name: len(f.args.args) for f in tree.body if isinstance(f, ast.FunctionDef)}
    return [("function", defs[a]) if a in defs else ("value", None) for a in args]


def _oracle(source: Path, number: str, namespace: dict[str, Any], args: list[str]) -> list:
    """The book's solution's objects for the checker call's arguments (None where the
    solution does not run on the imports alone)."""
    code = made_up_class.solutions(source).get(number)
    if not code:
        return [None] * len(args)
    local = dict(namespace)
    with contextlib.suppress(Exception), warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exec(compile(code, f"<solution {number}>", "exec"), local)  # noqa: S102
    return [local.get(a) for a in args]


def _printed_values(chapter: str, checker: Any, oracle: Any) -> list[Any]:
    """The printed numbers that are the answer to a "give a number" exercise: those the
    solution's number rounds to (a solution giving a function is asked for the problem the
    checker tries first, which is the one the exercise states)."""
    if oracle is None:
        return []
    if callable(oracle):
        asked: list[tuple] = []

        def recorder(*args: Any) -> Any:
            asked.append(args)
            return oracle(*args)

        _quiet_check(checker, recorder)
        if not asked:
            return []
        with contextlib.suppress(Exception):
            oracle = oracle(*asked[0])
    values = []
    with contextlib.suppress(Exception):  # not a number, or not printed
        values.append(printed_answer(chapter, oracle))
    if isinstance(oracle, (int, float, np.number)) and not isinstance(oracle, bool) and oracle:
        # and every printed number within a factor of 2 of the answer: a student guessing
        # among the page's numbers (an answer is a threshold whose neighbours pass too)
        values += [p.value for p in printed_numbers(chapter)
                   if 0.5 <= p.value / float(oracle) <= 2 and p.value not in values]
    return values


def _lookup(chapter: str, oracle: Any) -> Any:
    """A student's function answering each call with the printed number the solution's
    answer rounds to."""
    def looked_up(*args: Any) -> Any:
        return printed_answer(chapter, oracle(*args))

    return looked_up


def spoilers_of(source: Path) -> dict[str, list[str]]:
    """``{exercise number: [what passes its checker]}`` for one chapter."""
    chapter = chapters.load_chapter(source)
    namespace = chapter_imports(source)
    imported = {k: v for k, v in namespace.items() if callable(v) and not isinstance(v, type)
                and not getattr(v, "__module__", "").startswith(HELPERS)
                and not k.startswith("_")}
    shown = shown_functions(source, namespace)
    found: dict[str, list[str]] = {}
    for number, exercise in chapter.exercises.items():
        checker = chapters.checker_function(exercise.checker)
        _, args, _ = _parse_call(exercise.call)
        roles = _starter_roles("\n".join(chapter.starters[number]), args)
        oracle = _oracle(source, number, namespace, args)
        slow = exercise.checker.startswith(SLOW)
        hits: list[str] = []
        for position, (role, n_params) in enumerate(roles):
            def attempt(candidate: Any, position: int = position, oracle: list = oracle,
                        checker: Any = checker) -> bool:
                filled = [candidate if i == position else oracle[i]
                          for i in range(len(oracle))]
                if any(a is None for a in filled):
                    return False
                return _quiet_check(checker, *filled)

            if role == "function":
                for kind, pool in (("imported", imported), ("shown", shown)):
                    for name, fn in pool.items():
                        arity = _arity(fn)
                        if arity is None or not arity[0] <= n_params <= arity[1]:
                            continue
                        if slow and name != args[position]:
                            continue
                        if attempt(fn):
                            hits.append(f"{kind} {name}")
                if callable(oracle[position]) and not slow:
                    if attempt(_lookup(source.stem, oracle[position])):
                        hits.append("printed numbers")
            else:
                for value in _printed_values(source.stem, checker, oracle[position]):
                    if attempt(value):
                        hits.append(f"printed number {value}")
                        break
        if hits:
            found[number] = hits
    return found


def _parse_call(call: str) -> tuple[str, list[str], dict[str, str]]:
    from grading.judge import parse_call

    return parse_call(call)


CHAPTERS = toc.chapters()


@pytest.fixture(scope="module")
def spoilers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for source in CHAPTERS:
        if (STUDENT_HTML / "book" / f"{source.stem}.html").is_file():
            found |= spoilers_of(source)
    return found


def test_student_edition_answers_no_exercise_but_the_known_ones(spoilers):
    unknown = {n: what for n, what in spoilers.items() if n not in KNOWN_SPOILERS}
    assert not unknown, ("the student edition answers these exercises (rework them, or list "
                         f"them in KNOWN_SPOILERS with why): {unknown}")


def test_every_known_spoiler_still_spoils(spoilers):
    stale = sorted(set(KNOWN_SPOILERS) - set(spoilers), key=chapters.number_key)
    assert not stale, (f"no longer answered by the student edition: {stale}; remove them from "
                       "KNOWN_SPOILERS")


# ---------------------------------------------------------------------------------------------
# Answers stated in prose: numbers, sets, letters and formulas
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stated:
    """An exercise's answer as prose would state it: ``answers``, patterns of the answer of
    the book's variant (variant 0: the question the student site prints), and ``terms``,
    patterns of the exercise's key terms; the page states the answer when one of the
    answers lies within :data:`NEAR` characters of one of the terms."""

    page: str
    answers: tuple[str, ...]
    terms: tuple[str, ...]


#: Characters either side of an answer in which a key term makes it a statement of the answer.
NEAR = 300

#: The answers of the exercises whose answer is a number, a set, a letter or a formula (the
#: book's variant; a student's own variant has other parameters, flashlib.book.exercises.
#: variants), as a page would state them.
STATED: dict[str, Stated] = {
    "4.3": Stated("tiling", (r"\b288\b",), (r"writes? of \$?O", r"block writes")),
    # the letter's size, not as one of the offered choices ("(c) M / 2")
    "4.5": Stated("tiling", (r"(?<!\) )\bM\s*/\s*2\b", r"2d \\cdot M"),
                  (r"cap", r"score tile", r"S_\{ij\}")),
    "6.4": Stated("masking", (r"\(\s*W\s*-\s*1\s*,\s*W\s*-\s*1\s*\)",), (r"window",)),
    "9.1": Stated("io-model", (r"4\s*N_q\s*N_k", r"12,?448,?000"), (r"Algorithm 0", r"HBM")),
    "11.3": Stated("beyond", (r"h\s*\+\s*h_\{?kv\}?", r"h\s*(?:\\bmod|%)\s*h_\{?kv"),
                   (r"gradient", r"\bsum", r"dK")),
}

#: Exercises whose answer the student site still states in prose, with why.
KNOWN_STATED: dict[str, str] = {}
# 8.3 asked for the set {l, acc} of what must stay float32, which the precision chapter's
# overview states (and no variant could move: it is {l, acc} for every size and dtype tried);
# it now asks for a function, the search for the smallest set that meets the 2x rule, which
# its checker runs on the chapter's kernel and on made-up error ratios whose answers differ:
# no set the prose states answers it, so it is no longer in STATED.


def stated_answers(text: str, stated: Stated) -> list[str]:
    """Where ``text`` states the answer: each answer found near a key term, in context."""
    found = []
    for answer in stated.answers:
        for match in re.finditer(answer, text):
            around = text[max(0, match.start() - NEAR): match.end() + NEAR]
            if any(re.search(term, around) for term in stated.terms):
                found.append(text[max(0, match.start() - 60): match.end() + 60]
                             .replace("\n", " "))
    return found


def student_text(page: str, built: bool = True) -> str:
    """The student edition's text of ``page``: the chapter without its solutions (what the
    student site renders), and (``built``) the built student page's text where it is built."""
    from tests.tools.test_student_edition import solutions

    text = solutions(grade.ROOT / "book" / f"{page}.md")[1]
    page_file = STUDENT_HTML / "book" / f"{page}.html"
    if built and page_file.is_file():
        page_text = re.sub(r"<[^>]+>", " ", page_file.read_text(encoding="utf-8"))
        text += "\n" + html.unescape(page_text)
    return text


@pytest.mark.parametrize("number", sorted(STATED, key=chapters.number_key))
def test_the_student_site_does_not_state_the_answer(number):
    found = stated_answers(student_text(STATED[number].page), STATED[number])
    if number in KNOWN_STATED:
        assert found, f"{number} is no longer stated: remove it from KNOWN_STATED"
        return
    assert not found, f"the student site states the answer of {number}: {found}"


#: What the student site said before issue 35 reworked these exercises, and the answers as
#: they were: the test above would have caught each.
BEFORE = {
    "4.3": ("So FlashAttention-2 did not swap the loops to read less. Its gains are elsewhere: "
            "writes of $O$ (128 block writes against 16), divisions by",
            Stated("tiling", (r"\b128 block writes against 16\b",), (r"writes? of \$?O",))),
    "4.5": ("Why cap $B_r$ at $d$? Without the cap the score tile $S_{ij}$ would be $B_c "
            "\\times B_c$, about $(M/4d)^2$ elements. With $B_r \\le d$ it has at most "
            "$d \\cdot M/4d = M/4$ elements, the same budget as $K_j$ or $V_j$.",
            Stated("tiling", (r"\bM\s*/\s*4\b",), (r"cap", r"score tile"))),
    "6.4": ("flash-attn's `window_size=(left, right)` counts keys on each side of the diagonal, "
            "both bounds inclusive, so a causal window of $W$ tokens including the current one "
            "is `(W - 1, 0)`",
            Stated("masking", (r"\(W - 1, 0\)",), (r"window",))),
    "8.3": ("FlashAttention keeps $l$ and the output's {term}`accumulator` in float32;",
            Stated("precision", (r"\bl\$? and (?:the )?(?:output's )?(?:\{term\}`)?accumulator",
                                 r"\{\s*l\s*,\s*acc\s*\}", r"\bl\b[^.]{0,20}\bacc\b"),
                   (r"float32",))),
    "9.1": ("**Total:** $4N^2 + 4Nd$ elements. Algorithm 0 reads and writes HBM",
            Stated("io-model", (r"4N\^2 \+ 4Nd",), (r"Algorithm 0", r"HBM"))),
    "11.3": ("the backward functions return $dK$, $dV$ of $K$'s shape, summed over each group",
             Stated("beyond", (r"summed over each group",), (r"dK", r"gradient"))),
}


def test_the_lookup_finds_a_printed_number():
    """The numbers' reader: distinctive numbers only, each with its printed precision."""
    assert _parse_number("12,289") == Printed(12289.0, "12,289", 0.5 * (1 + 1e-9))
    assert _parse_number("11.09").tolerance == pytest.approx(0.005)
    assert _parse_number("\u22122.5e-3") is None  # two digits
    assert _parse_number("64") is None and _parse_number("0.5") is None
    assert _parse_number("1.25e-3").value == pytest.approx(1.25e-3)
