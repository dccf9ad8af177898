"""The Japanese edition's catalogs (locales/ja/LC_MESSAGES/**/*.po): a translator's tools and
the checks ``make test`` runs on them (tests/i18n/test_catalogs.py).

    python -m tools.catalogs check [FILE.po ...]     # every problem, one line each; exit 1 if any
    python -m tools.catalogs dump FILE.po > work.json  # the entries as [{"id", "str"}, ...]
    python -m tools.catalogs load FILE.po work.json    # write the "str"s back (fuzzy cleared)
    python -m tools.catalogs check-code [FILE.json]  # the code's strings: flashlib/book/locale/ja

What :func:`problems` refuses in an entry:

- **untranslated** (an empty msgstr shows the English silently) or **fuzzy** (the English
  changed since it was translated: the Japanese says something else);
- **markup drift**: the MyST roles differ from the English. Glue roles (``{glue:text}`x:.2f```:
  the same number must appear), citation keys, cross-reference targets (``{doc}``, ``{ref}``,
  ``{numref}``, ``{eq}``), term targets (``{term}`訳語 <tile>``` keeps the English target
  ``tile``), inline code, inline and display math, link URLs: each the same multiset as in the
  English;
- **literal asterisks**: ``**`` (or ``*``) that CommonMark will not read as emphasis next to
  Japanese text, because a punctuation mark (。、「」 $ ` ...) stands just inside the
  delimiter: ``**主張。**この`` renders its asterisks (write ``**主張**。この``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po, write_po

from tools.paths import ROOT

LOCALE_DIR = ROOT / "locales" / "ja" / "LC_MESSAGES"

_ROLE = re.compile(r"\{([a-z][\w:.-]*)\}`([^`]*)`")
_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)((?:\\.|[^$\\])+?)\$")
_URL = re.compile(r"\]\(([^)\s]+)\)")
_TARGET = re.compile(r"<([^<>]+)>\s*$")


def catalogs() -> list[Path]:
    return sorted(LOCALE_DIR.rglob("*.po"))


def read(path: Path) -> Catalog:
    with open(path, "rb") as f:
        return read_po(f, abort_invalid=True)


def write(path: Path, catalog: Catalog) -> None:
    with open(path, "wb") as f:
        write_po(f, catalog, width=0, omit_header=False, include_lineno=False)


def _strip_roles(text: str) -> str:
    return _ROLE.sub(" ", text)


def markup(text: str) -> dict[str, Counter]:
    """What must be the same in a message and its translation, by kind."""
    roles: Counter = Counter()
    for name, body in _ROLE.findall(text):
        if name in ("glue", "glue:text", "glue:md", "glue:any", "cite:p", "cite:t", "cite",
                    "eq", "math"):
            roles[f"{{{name}}}`{body}`"] += 1
        elif name in ("term", "doc", "ref", "numref", "download"):
            target = _TARGET.search(body)
            roles[f"{{{name}}} -> {(target.group(1) if target else body).strip()}"] += 1
        else:
            roles[f"{{{name}}}"] += 1
    rest = _strip_roles(text)
    code = Counter(m.group(2) for m in _CODE.finditer(rest))
    no_code = _CODE.sub(" ", rest)
    display = Counter(m.strip() for m in _DISPLAY_MATH.findall(no_code))
    inline = Counter(m for m in _INLINE_MATH.findall(_DISPLAY_MATH.sub(" ", no_code)))
    urls = Counter(_URL.findall(no_code))
    return {"roles": roles, "inline code": code, "display math": display,
            "inline math": inline, "link URLs": urls}


def _punct(ch: str) -> bool:
    return bool(ch) and (unicodedata.category(ch).startswith("P") or ch in "$`<>|~^=+")


def _space(ch: str) -> bool:
    return ch == "" or ch.isspace()


def literal_emphasis(text: str) -> list[str]:
    """``**`` runs CommonMark cannot use as emphasis (a run neither left- nor right-flanking
    in a Japanese sentence), with their context."""
    bad = []
    clean = _DISPLAY_MATH.sub(" ", _CODE.sub(" ", _strip_roles(text)))
    clean = _INLINE_MATH.sub("M", clean)
    for m in re.finditer(r"\*\*", clean):
        before = clean[m.start() - 1] if m.start() else ""
        after = clean[m.end()] if m.end() < len(clean) else ""
        left = not _space(after) and (not _punct(after) or _space(before) or _punct(before))
        right = not _space(before) and (not _punct(before) or _space(after) or _punct(after))
        if not left and not right:
            bad.append(clean[max(0, m.start() - 12): m.end() + 12])
    return bad


def problems(path: Path) -> list[str]:
    """Every problem of one catalog, one line each (empty: none)."""
    out = []
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for message in read(path):
        if not message.id:
            continue
        head = f"{rel}: {str(message.id)[:60]!r}"
        if message.fuzzy:
            out.append(f"{head}: fuzzy (the English changed; translate it again)")
            continue
        if not message.string:
            out.append(f"{head}: untranslated")
            continue
        en, ja = markup(str(message.id)), markup(str(message.string))
        # a title's message is its text ({doc}`tiling` rendered as "tiling"): its translation
        # may write the link back, and Sphinx then wants it there
        for key in list(ja["roles"] - en["roles"]):
            target = key.split(" -> ", 1)[-1]
            if key.startswith("{doc} -> ") and f"({target})" in str(message.id):
                ja["roles"][key] -= 1
        ja["roles"] += Counter()  # drops the zeros
        for kind in en:
            if en[kind] != ja[kind]:
                missing = sorted((en[kind] - ja[kind]).elements())
                extra = sorted((ja[kind] - en[kind]).elements())
                out.append(f"{head}: {kind} differ: missing {missing}, extra {extra}")
        for context in literal_emphasis(str(message.string)):
            out.append(f"{head}: ** shown as asterisks near {context!r} (move the punctuation "
                       "outside the ** or put a space beside it)")
    return out


CODE_TABLES = ROOT / "flashlib" / "book" / "locale" / "ja"


def code_problems(path: Path) -> list[str]:
    """Problems of one table of the code's strings (flashlib/book/locale/ja/*.json): an empty
    translation, or placeholders (``{0}``, ``{1}`` ... for numbers, ``{s0}`` ... for sets of
    names, ``{r0}`` for what a learner's function returned) not the same as the English's."""
    out = []
    table = json.loads(path.read_text(encoding="utf-8"))
    for key, value in table.items():
        head = f"{path.name}: {key[:60]!r}"
        if not isinstance(value, str) or not value.strip():
            out.append(f"{head}: untranslated")
            continue
        want = sorted(re.findall(r"\{[sr]?\d+\}", key))
        got = sorted(re.findall(r"\{[sr]?\d+\}", value))
        if want != got:
            out.append(f"{head}: placeholders differ: English {want}, Japanese {got}")
    return out


def dump(path: Path) -> str:
    entries = [{"id": str(m.id), "str": str(m.string or "")} for m in read(path) if m.id]
    return json.dumps(entries, ensure_ascii=False, indent=1)


def load(path: Path, work: Path) -> int:
    """Write the translations in ``work`` (dump's format) into ``path``; returns how many."""
    entries = json.loads(work.read_text(encoding="utf-8"))
    with open(path, "rb+") as handle:  # one writer at a time (translators may share a file)
        fcntl.flock(handle, fcntl.LOCK_EX)
        return _load(path, entries)


def _load(path: Path, entries: list[dict]) -> int:
    catalog = read(path)
    done = 0
    for entry in entries:
        message: Message | None = catalog.get(entry["id"])
        if message is None:
            raise SystemExit(f"no entry {entry['id'][:60]!r} in {path}")
        if entry.get("str"):
            message.string = entry["str"]
            message.flags.discard("fuzzy")
            done += 1
    write(path, catalog)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["check", "check-code", "dump", "load"])
    parser.add_argument("files", nargs="*", type=Path,
                        help="check: .po files (default all); check-code: .json tables "
                             "(default all); dump: FILE.po; load: FILE.po work.json")
    args = parser.parse_args(argv)
    files = [f.resolve() for f in args.files]
    if args.command == "check":
        paths = files or catalogs()
        found = [line for p in paths for line in problems(p)]
        print("\n".join(found) or f"{len(paths)} catalogs: no problem")
        return 1 if found else 0
    if args.command == "check-code":
        paths = files or sorted(CODE_TABLES.glob("*.json"))
        found = [line for p in paths for line in code_problems(p)]
        print("\n".join(found) or f"{len(paths)} tables: no problem")
        return 1 if found else 0
    if args.command == "dump" and len(files) == 1:
        print(dump(files[0]))
        return 0
    if args.command == "load" and len(files) == 2:
        print(f"{load(files[0], files[1])} entries written")
        return 0
    parser.error("dump takes FILE.po; load takes FILE.po work.json")
    return 2


if __name__ == "__main__":
    sys.exit(main())
