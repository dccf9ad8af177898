"""How long each chapter's main line is: the words a reader meets who opens no deep dive.

The chapter guide asks for about 3,500 words at most on a chapter's main line, outside collapsed
deep dives (``:::{dropdown}`` and directives with ``:class: dropdown``), code (code cells, code
blocks, literalincludes), outputs (which are not in the sources), math blocks and solutions.
The exercise statements are counted separately: they follow the main line, not inside it.

``python -m tools.main_path`` prints the table; tests/tools/test_main_path.py holds the limit.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tools import toc
from tools.myst import DIRECTIVE, OPTION

ROOT = Path(__file__).resolve().parent.parent

#: The guide's figure: about 3,500 words of main line per chapter.
LIMIT = 3500

#: The chapters, in the book's order (the toc's notebooks, the glossary included).
CHAPTERS = [path.stem for path in toc.chapters()]

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_EXERCISES = re.compile(r"^#{1,3} Exercises\s*$")
_HEADING = re.compile(r"^(#{1,6}) ")
_BARE = re.compile(r"^(`{3,}|:{3,}|~{3,})\s*$")
_FENCE = re.compile(r"^(`{3,}|~{3,})")


def _words(line: str) -> int:
    line = re.sub(r"\{glue(:\w+)?\}`[^`]*`", " 0 ", line)  # a glued number
    line = re.sub(r"\{[\w:-]+\}`([^`<]*)(<[^`]*>)?`", r"\1", line)  # {term}`SM` -> SM
    line = re.sub(r"`[^`]*`", " ", line)  # inline code
    line = re.sub(r"\$[^$]*\$", " ", line)  # inline math
    line = re.sub(r"\]\([^)]*\)", "]", line)  # link targets
    return len(_WORD.findall(line))


#: Directives whose body is code, math or machinery, never prose on the main line.
_CODE = {"code-cell", "literalinclude", "code", "code-block", "math", "glue:figure", "figure",
         "raw", "bibliography", "image", "solution-start", "solution-end", "mermaid"}
#: Directives that are collapsed deep dives.
_DEEP = {"dropdown", "toggle"}


def count(source: Path | str) -> dict[str, int]:
    """{"main": words of the main line, "deep": words in collapsed deep dives,
    "exercises": words of the exercise statements (outside solutions)} of one MyST chapter."""
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip() == "---":  # front matter
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
        lines = lines[end + 1:]
    counts = {"main": 0, "deep": 0, "exercises": 0}
    stack: list[list[str]] = []  # [fence, kind]: kind is "code", "deep" or "plain"
    in_solution = in_exercises = in_math = reading_options = False
    title = 0
    for line in lines:
        if stack and stack[-1][1] == "code":  # inside code only the closing fence matters
            bare = _BARE.match(line)
            if bare and bare[1][0] == stack[-1][0][0] and len(bare[1]) >= len(stack[-1][0]):
                stack.pop()
            continue
        if reading_options:
            option = OPTION.match(line)
            if option:
                if option["key"] == "class" and "dropdown" in option["value"].split():
                    stack[-1][1] = "deep"
                continue
            reading_options = False
            _add(counts, stack, title, in_exercises)  # the title, once its kind is known
        directive = DIRECTIVE.match(line)
        if directive:
            name = directive["name"]
            in_solution = {"solution-start": True, "solution-end": False}.get(name, in_solution)
            kind = "code" if name in _CODE else "deep" if name in _DEEP else "plain"
            stack.append([directive["fence"], kind])
            reading_options = kind != "code"
            title = 0 if in_solution else _words(directive["arg"])
            continue
        bare = _BARE.match(line)
        if bare:
            if stack and bare[1][0] == stack[-1][0][0] and len(bare[1]) >= len(stack[-1][0]):
                stack.pop()
            elif bare[1][0] in "`~":  # a bare ``` opens a code block
                stack.append([bare[1], "code"])
            continue
        if _FENCE.match(line):  # ```python and the like
            stack.append([_FENCE.match(line)[1], "code"])
            continue
        stripped = line.strip()
        if stripped.startswith("$$"):
            if stripped == "$$" or not stripped.endswith("$$"):
                in_math = not in_math
            continue
        if in_math or in_solution or (line.startswith("(") and stripped.endswith(")=")):
            continue
        if _HEADING.match(line) and len(_HEADING.match(line)[1]) <= 2:
            in_exercises = bool(_EXERCISES.match(line))
        _add(counts, stack, _words(line), in_exercises)
    return counts


def _add(counts: dict[str, int], stack: list[list[str]], words: int, in_exercises: bool) -> None:
    """Count ``words`` where the innermost open blocks put them."""
    if any(kind == "deep" for _, kind in stack):
        counts["deep"] += words
    elif in_exercises:
        counts["exercises"] += words
    else:
        counts["main"] += words


def table(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """The counts of every chapter, in the book's order."""
    return {name: count(root / "book" / f"{name}.md") for name in CHAPTERS}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tools.main_path",
        description="Words per chapter: main line (outside deep dives, code, math, outputs "
                    f"and solutions; the guide's limit is about {LIMIT:,}), deep dives, "
                    "exercise statements.")
    parser.parse_args(argv)
    rows = table()
    print(f"{'chapter':22} {'main line':>9} {'deep dives':>10} {'exercises':>9}")
    for name, c in rows.items():
        flag = "  over" if c["main"] > LIMIT else ""
        print(f"{name:22} {c['main']:9,} {c['deep']:10,} {c['exercises']:9,}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
