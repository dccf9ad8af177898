"""A chapter as a clean notebook: book/NAME.md (a MyST Markdown notebook) -> nbformat.

:func:`clean_notebook` is the conversion; ``python -m tools.notebooks write`` saves its result
in notebooks/ (and, with ``student=True``, the student edition's in notebooks/student/), and
the drift check compares against it. The notebooks have no outputs and deterministic cell ids
and metadata, so converting an unchanged chapter gives the same notebook.

What the notebooks add to the chapters (none of it is on the website):

- the Colab set-up cell, after the title (tools/colab.py's `colab_cell`);
- before every markdown cell that cites glued numbers, a collapsed code cell that prints them,
  `print_glued("name:.2f", ...)` -> `name = 1.23`, as the text formats them (Jupyter and Colab
  cannot render glue roles; the text shows `name` in code font);
- solutions inside `<details>` (collapsed until clicked, in Jupyter and Colab), their code
  cells collapsed too (`jupyter.source_hidden`, Colab's form view).

Plain Jupyter and Colab render CommonMark, not MyST, so the markdown cells are rewritten
(`jupyter_markdown`); code cells are copied unchanged, except solution code cells (a `#@title`
line first):

    ```{literalinclude} ../flashlib/x.py    a ```python block: the current source of `f`, cut
    :pyobject: f                            out of x.py with ast (the whole file without
    ```                                     :pyobject:)
    {doc}`name`                             [its title](Colab URL of name.ipynb at the release
                                            tag, `colab_link`: relative links do not work on
                                            Colab); a page that is not a notebook
                                            (References): its title in italics
    {cite:p}`k1,k2` (and {cite}`k`)         ([Author et al., 2022](url); ...), from references.bib
    {cite:t}`k`                             [Author et al.](url) (2022)
    {glue:text}`name:.2f` (any {glue})      `name` in code font, printed by the cell before (see
                                            above); the title cell gets a note saying so
    {math}`x`                               $x$; any other role: its text in code font
    {term}`HBM` (or {term}`text <HBM>`)     [HBM](Colab URL of glossary.ipynb#HBM): the
                                            glossary notebook, whose terms are headings
    :::{exercise} / {solution-start} L      "### Exercise C.K" + the text quoted / <details>
                                            with "Solution to Exercise C.K" as its summary (C
                                            the chapter's number, `chapter_number`, K the
                                            exercise's rank in it: the site's numbers) up to
                                            {solution-end}, or to the end of the cell,
                                            reopened in the next one
    :::{dropdown} title (and :class: dropdown)  <details> with the title as its summary
    {glossary}                              each term a "#### term" heading, then its text
    ::::{grid} with :::{grid-item-card}s    the cards one after the other, each title in bold
    {math}, {figure}/{image}, admonitions   $$ block, ![caption](raw GitHub URL), "> **Note**"
    (label)= lines, % comments              dropped; markdown cells left empty are dropped

Code cells tagged ``hide-input`` or ``remove-input`` (the chapters' bookkeeping: glue calls,
asserts about the prose, plotting) are collapsed in the notebooks, under a ``#@title`` taken
from their first comment line; their numbers are printed before the text that cites them.
A page without code cells (the glossary) gets no set-up cell.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jupytext
import nbformat

from tools.colab import COLLAPSED_CODE, colab_cell, colab_link, student_cell
from tools.myst import CODE_FENCE, DIRECTIVE, LABEL, OPTION, ROLE
from tools.paths import ROOT
from tools.project import repository
from tools.student import without_solutions
from tools.toc import chapter_number, page_titles

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

ADMONITIONS = {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger",
               "error", "seealso", "admonition"}
GLUE_NOTE = (
    "> **In this notebook** a name in code font such as `{name}` stands for a number that the "
    "code computes: run the cells, and the collapsed cell just before each text cell prints "
    "the numbers that text cites, as `{name} = ...` (the book's website shows them in the "
    "text). `flashlib.book.glued()` lists every value by name."
)
SOLUTION_MARK = re.compile(r"\x00solution-(?P<kind>start|end)(?: (?P<number>[\d.]+))?\x00")
#: Tags of the code cells the website hides (myst-nb): collapsed in the notebooks.
HIDDEN_INPUT = {"hide-input", "remove-input"}
#: The page whose {glossary} the {term} role links to.
GLOSSARY = "book/glossary"
#: An exercise's heading in the notebooks as `directive` writes it ("### Exercise 2",
#: "### Exercise 1.2: title"): how grading/grade.py finds a notebook's exercises.
EXERCISE_HEADING = re.compile(r"^#{1,6} (?:Exercise|練習) (?P<number>\d+(?:\.\d+)*)(?![\d.]*\d)",
                              re.MULTILINE)
GLUE_NOTE_JA = (
    "> **このノートブックでは** `{name}` のようなコード書体の名前は、コードが計算する数値を表し"
    "ます。セルを実行すると、各テキストセルの直前にある折りたたまれたセルが、そのテキストが引用"
    "する数値を `{name} = ...` の形で表示します（本書のウェブサイトでは数値が本文に入ります）。"
    "`flashlib.book.glued()` はすべての値を名前つきで一覧します。"
)
#: What the notebooks add to a chapter, in each edition's language ("ja": tools/ja_edition.py
#: translates the chapter's prose; these are the notebooks' own words).
WORDS = {
    "en": {"exercise": "Exercise", "solution to": "Solution to Exercise {number}",
           "solution": "Solution", "continued": " (continued)",
           "numbers in solution": "Numbers in the solution below",
           "numbers in text": "Numbers in the text below", "show code": "Show the code",
           "on the website": "(on the book's website)", "glue note": GLUE_NOTE},
    "ja": {"exercise": "練習", "solution to": "練習 {number} の解答", "solution": "解答",
           "continued": "（続き）", "numbers in solution": "下の解答が引用する数値",
           "numbers in text": "下の本文が引用する数値", "show code": "コードを表示",
           "on the website": "（本書のウェブサイトにあります）", "glue note": GLUE_NOTE_JA},
}
ADMONITION_TITLES_JA = {"note": "注", "tip": "ヒント", "hint": "ヒント", "important": "重要",
                        "warning": "警告", "caution": "注意", "attention": "注意",
                        "danger": "危険", "error": "エラー", "seealso": "参照",
                        "dropdown": "詳しく"}


@dataclass
class Page:
    """What the rewriting of one chapter needs to know, and its exercise numbers.

    ``solution``: the number of the solution open at this point of the chapter (its
    ``{solution-start}`` seen, not yet its ``{solution-end}``), or None; ``cited``: the glue
    references (``name:format``) of the markdown cell being rewritten, each with whether it
    sits inside a solution."""

    source: Path
    student: bool = False  # the student edition: links go to notebooks/student/
    lang: str = "en"  # "ja": the Japanese notebooks (notebooks/ja/), links among them

    def word(self, key: str, **values: str) -> str:
        return WORDS[self.lang][key].format(**values)
    exercises: dict[str, str] = field(default_factory=dict)
    n_exercises: int = 0
    glue_names: list[str] = field(default_factory=list)
    solution: str | None = None
    cited: list[tuple[str, bool]] = field(default_factory=list)


@cache
def bibliography() -> dict[str, tuple[str, str, str]]:
    """references.bib as ``key -> (authors as the book cites them, year, url)``."""
    from pybtex.database import parse_file
    from pybtex.richtext import Text

    entries = {}
    for key, entry in parse_file(str(ROOT / "references.bib")).entries.items():
        names = [Text.from_latex(" ".join(p.last_names)).render_as("text")
                 for p in entry.persons.get("author", [])]
        if len(names) >= 3:
            authors = f"{names[0]} et al."
        else:
            authors = " and ".join(names) or key
        entries[key] = (authors, entry.fields.get("year", "n.d."), entry.fields.get("url", ""))
    return entries


def _link(text: str, url: str) -> str:
    return f"[{text}]({url})" if url else text


def cite(keys: str, textual: bool = False) -> str:
    """``{cite:p}`a,b``` -> ``([A, 2022](url); [B, 2023](url))``; textual: ``[A](url) (2022)``."""
    bib = bibliography()
    parts = []
    for key in (k.strip() for k in keys.split(",")):
        if key not in bib:
            raise ValueError(f"citation key {key!r} is not in references.bib")
        authors, year, url = bib[key]
        parts.append(f"{_link(authors, url)} ({year})" if textual
                     else _link(f"{authors}, {year}", url))
    return "; ".join(parts) if textual else "(" + "; ".join(parts) + ")"



def doc_link(target: str, page: Page) -> str:
    """``{doc}`target``` or ``{doc}`text <target>``` as a link to the target's notebook."""
    match = re.fullmatch(r"(?P<text>.*?)\s*<(?P<target>[^<>]+)>", target)
    text, target = (match["text"], match["target"]) if match else (None, target)
    base = ROOT if target.startswith("/") else page.source.parent
    rel = (base / target.lstrip("/")).resolve().relative_to(ROOT).as_posix()
    if rel not in page_titles():
        raise ValueError(f"{{doc}}`{target}`: no page {rel} in _toc.yml")
    title, notebook = page_titles()[rel]
    if page.lang != "en":
        from tools.ja_edition import page_title

        title = page_title(Path(rel).name, title)
    text = text or title
    if not notebook:
        return f"*{text}* {page.word('on the website')}"
    return f"[{text}]({colab_link(Path(rel).name, page.student, page.lang)})"


def term_anchor(term: str) -> str:
    """The anchor JupyterLab gives the glossary notebook's heading of ``term``."""
    return term.strip().replace(" ", "-")


def term_link(text: str, page: Page) -> str:
    """``{term}`HBM``` or ``{term}`text <HBM>``` as a link to the term in the glossary
    notebook (a heading there); in italics when the glossary is not a notebook."""
    match = re.fullmatch(r"(?P<text>.*?)\s*<(?P<target>[^<>]+)>", text)
    text, term = (match["text"], match["target"]) if match else (text, text)
    if GLOSSARY not in page_titles():
        raise ValueError(f"{{term}}`{term}`: no {GLOSSARY} in _toc.yml")
    if not page_titles()[GLOSSARY][1]:
        return f"*{text}*"
    here = page.source.resolve() == (ROOT / f"{GLOSSARY}.md").resolve()
    notebook = "" if here else colab_link(Path(GLOSSARY).name, page.student, page.lang)
    return f"[{text}]({notebook}#{term_anchor(term)})"


def glossary(body: str) -> str:
    """A {glossary} body (terms at the left margin, their text indented) as headings + text."""
    out: list[str] = []
    for line in body.split("\n"):
        if line.strip() and not line[:1].isspace():
            out.append(f"\n#### {line.strip()}\n")
        else:
            out.append(line.strip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


def role(name: str, text: str, page: Page) -> str:
    if name == "doc":
        return doc_link(text, page)
    if name in ("cite", "cite:p", "cite:ps"):
        return cite(text)
    if name in ("cite:t", "cite:ts"):
        return cite(text, textual=True)
    if name == "glue" or name.startswith("glue:"):
        glue_name, _, spec = text.partition(":")
        if glue_name not in page.glue_names:
            page.glue_names.append(glue_name)
        reference = glue_name if name == "glue:md" else text
        if all(ref != reference for ref, _ in page.cited):
            page.cited.append((reference, page.solution is not None))
        return f"`{glue_name}`"
    if name == "math":
        return f"${text}$"
    if name == "term":
        return term_link(text, page)
    match = re.fullmatch(r"(?P<text>.*?)\s*<(?P<target>[^<>]+)>", text)
    return f"`{match['text'] if match else text}`"


def inline(line: str, page: Page) -> str:
    """Rewrite the roles of one line of text (not inside code)."""
    return ROLE.sub(lambda m: role(m["name"], m["text"], page), line)


def pyobject_source(path: Path, name: str) -> str:
    """The source of function/class ``name`` (``Class.method`` too) in ``path``, via ast, as
    Sphinx's literalinclude ``:pyobject:`` shows it (decorators included, dedented)."""
    text = path.read_text(encoding="utf-8")
    body: list[ast.stmt] = ast.parse(text).body
    node = None
    for part in name.split("."):
        node = next((n for n in body if isinstance(
            n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part), None)
        if node is None:
            raise ValueError(f"{path.relative_to(ROOT)} has no {name}")
        body = node.body
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines()[start - 1 : node.end_lineno]
    return textwrap.dedent("\n".join(lines))


def literalinclude(arg: str, options: dict[str, str], page: Page) -> str:
    path = (page.source.parent / arg).resolve()
    if "pyobject" in options:
        code = pyobject_source(path, options["pyobject"])
    else:
        code = path.read_text(encoding="utf-8").rstrip("\n")
    language = options.get("language", "python" if path.suffix == ".py" else "")
    return f"```{language}\n{code}\n```"


def quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def raw_url(path: Path) -> str:
    url, branch = repository()
    repo = url.removeprefix("https://github.com/")
    return f"https://raw.githubusercontent.com/{repo}/{branch}/" + (
        path.resolve().relative_to(ROOT).as_posix())


def directive(name: str, arg: str, options: dict[str, str], body: str, page: Page) -> str:
    """One MyST directive as CommonMark (``body`` is already rewritten)."""
    if name == "literalinclude":
        return literalinclude(arg, options, page)
    if name == "exercise":
        page.n_exercises += 1
        number = f"{chapter_number(page.source)}.{page.n_exercises}"
        if "label" in options:
            page.exercises[options["label"]] = number
        title = f"### {page.word('exercise')} {number}" + (f": {arg}" if arg else "")
        return f"{title}\n\n{quote(body)}" if body else title
    if name in ("solution-start", "solution"):
        number = page.exercises.get(arg, "")
        start = f"\x00solution-start {number}\x00"
        if name == "solution":  # the whole solution in its body
            return f"{start}\n\n{body}\n\n\x00solution-end\x00"
        return start
    if name == "solution-end":
        return "\x00solution-end\x00"
    if name == "math":
        return f"$$\n{body}\n$$"
    if name == "glossary":
        return glossary(body)
    if name == "dropdown" or (name in ADMONITIONS and "dropdown" in options.get("class", "")):
        default = (ADMONITION_TITLES_JA.get(name, name) if page.lang == "ja"
                   else name.capitalize())
        title = re.sub(r"`([^`]*)`", r"<code>\1</code>", arg or default)  # HTML
        return f"<details>\n<summary>{title}</summary>\n\n{body}\n\n</details>"
    if name == "grid":  # sphinx-design's columns: in a notebook, one card after the other
        return body
    if name in ("grid-item-card", "card"):  # a card: its title in bold, then its body
        return (f"**{inline(arg, page)}**\n\n" if arg else "") + body
    if name in ("figure", "image"):
        alt = options.get("alt") or body or ""
        image = f"![{alt}]({raw_url(page.source.parent / arg)})"
        return f"{image}\n\n*{body}*" if name == "figure" and body else image
    if name in ("code-block", "code", "sourcecode"):
        return f"```{arg}\n{body}\n```"
    if name in ADMONITIONS:
        title = arg if name == "admonition" else (
            ADMONITION_TITLES_JA.get(name, name) if page.lang == "ja" else name.capitalize())
        return quote(f"**{title}**" + (f"\n\n{body}" if body else ""))
    return quote(f"**{name}**" + (f" {arg}" if arg else "") + (f"\n\n{body}" if body else ""))


def jupyter_markdown(text: str, page: Page) -> str:
    """A markdown cell's MyST as CommonMark that plain Jupyter and Colab render."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        code = CODE_FENCE.match(line)
        opened = DIRECTIVE.match(line)
        if code:  # a plain code block: copied verbatim
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].strip() == code["fence"]), len(lines) - 1)
            out.extend(lines[i : end + 1])
            i = end + 1
        elif opened:
            j = i + 1
            options = {}
            while j < len(lines) and (option := OPTION.match(lines[j])):
                options[option["key"]] = option["value"]
                j += 1
            end = next((k for k in range(j, len(lines))
                        if lines[k].strip() == opened["fence"]), len(lines))
            if opened["name"] in ("solution-start", "solution"):
                page.solution = page.exercises.get(opened["arg"], "")
            body = jupyter_markdown("\n".join(lines[j:end]).strip("\n"), page)
            out.append(directive(opened["name"], opened["arg"], options, body, page))
            if opened["name"] in ("solution-end", "solution"):
                page.solution = None
            i = end + 1
        elif LABEL.match(line) or line.startswith("%"):
            i += 1
        else:
            out.append(inline(line, page))
            i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


def exercise_numbers(markdown: str) -> list[str]:
    """The numbers of the exercises whose headings a notebook markdown cell contains, in
    order (``EXERCISE_HEADING``): ``["1.2"]`` for "### Exercise 1.2: ..."."""
    return [match["number"] for match in EXERCISE_HEADING.finditer(markdown)]


def collapsed_source(source: str, lang: str = "en") -> str:
    """A hidden cell's code under a ``#@title``: its first comment line (``# Bookkeeping:
    ...`` -> ``#@title Bookkeeping: ...``), else "Show the code"."""
    first, _, rest = source.partition("\n")
    if first.startswith("#@title"):
        return source
    if first.startswith("# "):
        return f"#@title {first[2:].strip()}\n{rest}"
    return f"#@title {WORDS[lang]['show code']}\n{source}"


def numbers_cell(cited: list[tuple[str, bool]], lang: str = "en") -> nbformat.NotebookNode:
    """The collapsed cell printing the glued numbers that the next markdown cell cites; the
    cell's output is collapsed too when every citation is inside a solution."""
    in_solution = all(solution for _, solution in cited)
    title = WORDS[lang]["numbers in solution" if in_solution else "numbers in text"]
    refs = ", ".join(f'"{ref}"' for ref, _ in cited)
    call = f"print_glued({refs})"
    if len(call) > 99:
        call = "print_glued(\n" + "".join(f'    "{ref}",\n' for ref, _ in cited) + ")"
    source = f"#@title {title}\nfrom flashlib.book import print_glued\n\n{call}"
    jupyter = {"source_hidden": True} | ({"outputs_hidden": True} if in_solution else {})
    return nbformat.v4.new_code_cell(source, metadata={"cellView": "form", "jupyter": jupyter})


def wrap_solutions(text: str, open_before: str | None, lang: str = "en") -> str:
    """Turn the solution marks of one rewritten markdown cell into ``<details>`` elements: a
    solution open when the cell starts (``open_before``) reopens as "(continued)"; one still
    open at its end is closed there (the next cell reopens it)."""

    def opening(number: str, continued: bool = False) -> str:
        words = WORDS[lang]
        title = words["solution to"].format(number=number) if number else words["solution"]
        return (f"<details>\n<summary>{title}{words['continued'] if continued else ''}"
                "</summary>\n\n")

    out, pos, open_now = [], 0, open_before
    if open_before is not None:
        out.append(opening(open_before, continued=True))
    for mark in SOLUTION_MARK.finditer(text):
        out.append(text[pos : mark.start()])
        if mark["kind"] == "start":
            open_now = mark["number"] or ""
            out.append(opening(open_now))
        else:
            open_now = None
            out.append("\n\n</details>\n\n")
        pos = mark.end()
    out.append(text[pos:])
    if open_now is not None:
        out.append("\n\n</details>")
    html = "".join(out)
    # a solution part with nothing in it (e.g. only its {solution-end} in this cell)
    html = re.sub(r"<details>\n<summary>[^<]*</summary>\s*</details>", "", html)
    return re.sub(r"\n{3,}", "\n\n", html).strip("\n")


def markdown_cell(text: str, page: Page) -> str:
    """One markdown cell of the chapter as the notebook shows it: `jupyter_markdown`, then
    its solutions wrapped in ``<details>``; ``page.cited`` lists its glue references."""
    open_before, page.cited = page.solution, []
    return wrap_solutions(jupyter_markdown(text, page), open_before, page.lang)


def clean_notebook(source: Path, citations: dict[str, list[str]] | None = None,
                   *, student: bool = False, lang: str = "en") -> nbformat.NotebookNode:
    """The chapter as a notebook: no outputs, only the metadata Jupyter/Colab need, markdown
    cells in CommonMark (`jupyter_markdown`), the cells the module docstring lists added.
    ``citations``, when given, receives ``{markdown cell id: [glue names it cites]}``;
    ``student``: the student edition, every solution removed (`without_solutions`);
    ``lang="ja"``: the Japanese notebook, its prose from the catalogs
    (`tools.ja_edition.translated_markdown`), its own words from :data:`WORDS`."""
    nb = jupytext.read(source, fmt="md:myst")
    if lang != "en":
        from tools.ja_edition import translated_markdown

        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = translated_markdown(cell.source, source.stem)
    if student:
        nb.cells = without_solutions(nb.cells)
    page = Page(source, student=student, lang=lang)
    cells, cited_by = [], []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = markdown_cell(cell.source, page)
            if not cell.source.strip():
                continue
            if page.cited:
                cells.append(numbers_cell(page.cited, lang))
                cited_by.append([])
        elif cell.cell_type == "code" and page.solution is not None:
            title = (page.word("solution to", number=page.solution) if page.solution
                     else page.word("solution to", number="").rstrip())
            cell.source = f"#@title {title}\n{cell.source}"
            cell.metadata = COLLAPSED_CODE | {"tags": cell.metadata.get("tags", [])}
        elif cell.cell_type == "code" and HIDDEN_INPUT & set(cell.metadata.get("tags", [])):
            cell.source = collapsed_source(cell.source, lang)
            cell.metadata = COLLAPSED_CODE | {"tags": cell.metadata.get("tags", [])}
        cells.append(cell)
        cited_by.append([ref.split(":", 1)[0] for ref, _ in page.cited]
                        if cell.cell_type == "markdown" else [])
    # the title alone first (with the note about glued numbers), then the set-up cell
    title = next(i for i, c in enumerate(cells) if c.cell_type == "markdown")
    heading = re.search(r"^# .*$", cells[title].source, re.MULTILINE)
    if heading is None:
        raise ValueError(f"{source.relative_to(ROOT)}: no `# title` in its first markdown cell")
    head = cells[title].source[: heading.end()]
    rest = cells[title].source[heading.end():].strip("\n")
    if page.glue_names:
        head += "\n\n" + page.word("glue note", name=page.glue_names[0])
    cells[title].source = head
    has_code = any(c.cell_type == "code" for c in cells)
    extra = [colab_cell(student=student, lang=lang)] if has_code else []
    if has_code and page.student and page.n_exercises:  # the student's id: their variants
        extra.append(student_cell(chapter_number(source), lang))
    if rest:
        extra.append(nbformat.v4.new_markdown_cell(rest))
        cited_by[title], cited_by_rest = [], cited_by[title]
    else:
        cited_by_rest = []
    cells[title + 1 : title + 1] = extra
    cited_by[title + 1 : title + 1] = ([[]] * (len(extra) - bool(rest))
                                       + ([cited_by_rest] if rest else []))
    if rest and cited_by_rest:  # numbers for the text after the title go before it
        raise ValueError(f"{source.relative_to(ROOT)}: the text before the first code cell "
                         f"cites glued numbers {cited_by_rest}; no cell has computed them")
    nb.cells = cells
    nb.metadata = nbformat.from_dict(
        {
            "kernelspec": KERNELSPEC,
            "language_info": {"name": "python"},
            "colab": {"provenance": []},
        }
    )
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
        keep = {key: cell.metadata[key] for key in ("cellView", "jupyter", "tags")
                if cell.metadata.get(key)}
        cell.metadata = nbformat.from_dict(keep)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if citations is not None and cited_by[i]:
            citations[cell.id] = cited_by[i]
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def glue_citations(source: Path) -> dict[str, list[str]]:
    """``{markdown cell id: [glue names its text cites]}`` of the chapter's notebook."""
    citations: dict[str, list[str]] = {}
    clean_notebook(source, citations)
    return citations

