"""Per-student variants (flashlib.book.exercises.variants, issue 35): the same id always asks
the same variant, different ids mostly different ones, a reader (no id) the book's variant 0,
and a classmate's answer (or the book's, variant 0) fails another student's variant."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from flashlib.book.exercises import beyond, io_model, masking, tiling, variants
from flashlib.book.exercises.variants import VARIANTS, as_student, draw, variant

IDS = [f"s{1000 + 37 * i}" for i in range(40)]
VARIED = ("4.3", "4.5", "6.4", "9.1", "11.3")


def test_the_varied_exercises_are_declared():
    assert set(VARIED) <= set(VARIANTS)


@pytest.mark.parametrize("number", VARIED)
def test_the_same_id_always_draws_the_same_variant(number):
    count = len(VARIANTS[number].choices)
    for sid in IDS:
        assert draw(number, count, sid) == draw(number, count, sid)
        assert 1 <= draw(number, count, sid) < count  # never the book's, whose answer is public
        with as_student(sid):
            assert variant(number) == variant(number, sid)
    # from another process too: the hash is not Python's salted hash()
    code = (f"from flashlib.book.exercises import variants as v; "
            f"print(v.draw({number!r}, {count}, {IDS[0]!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=os.environ | {"PYTHONHASHSEED": "123"})
    assert int(out.stdout) == draw(number, count, IDS[0])


def test_a_reader_gets_the_books_variant(monkeypatch):
    monkeypatch.setenv(variants.ENV, "")
    for number in VARIED:
        assert variant(number)["variant"] == 0
        with as_student(""):
            assert variant(number)["variant"] == 0
    assert variant("4.3") == tiling.O_WRITES_PROBLEM | {"variant": 0}
    assert variant("9.1") == io_model.STANDARD_PROBLEM | {"variant": 0}
    assert variant("4.5")["choices"] == tiling.CAP_CHOICES


def test_the_environment_names_the_student(monkeypatch):
    monkeypatch.setenv(variants.ENV, IDS[3])
    assert variants.student_id() == IDS[3]
    assert variant("4.3") == variant("4.3", IDS[3])
    with as_student(IDS[4]):  # the judge's choice wins over the environment
        assert variant("4.3") == variant("4.3", IDS[4])


@pytest.mark.parametrize("number", VARIED)
def test_different_ids_mostly_draw_different_variants(number):
    pairs = list(itertools.combinations(IDS, 2))
    same = sum(variant(number, a) == variant(number, b) for a, b in pairs)
    assert same / len(pairs) < 0.4, f"{same} of {len(pairs)} pairs share a variant"


def test_the_set_up_cell_prints_the_students_variants(capsys, monkeypatch):
    monkeypatch.setenv(variants.ENV, "")  # restored afterwards: use_student sets it
    who = variants.use_student(IDS[0], chapter="4")
    out = capsys.readouterr().out
    assert who == IDS[0] and os.environ[variants.ENV] == IDS[0]
    p = variant("4.3", IDS[0])
    assert f"N = {p['N']}, B_r = {p['B_r']}, B_c = {p['B_c']}" in out
    assert "Exercise 4.5" in out and "Exercise 9.1" not in out
    assert variants.use_student("", chapter="9") == IDS[0]  # the environment's id kept
    monkeypatch.setenv(variants.ENV, "")
    variants.use_student("", chapter="9")
    assert "No student id" in capsys.readouterr().out


# ---- a classmate's answer fails ---------------------------------------------------------------

def _first_with_other_variant(number: str, sid: str) -> str:
    mine = variant(number, sid)
    return next(other for other in IDS if variant(number, other) != mine)


def _right_letter(sid: str) -> str:
    p = variant("4.5", sid)
    size = {0.5: "M / 8", 2: "M / 2", 4: "M", 8: "2M"}[p["cap"]]
    return next(k for k, v in p["choices"].items() if v == size)


def test_a_copied_letter_fails():
    for sid in IDS[:10]:
        letter = _right_letter(sid)
        with as_student(sid):
            assert tiling.check_cap_reason(letter).passed
        other = next(o for o in IDS if _right_letter(o) != letter)
        with as_student(other):
            assert not tiling.check_cap_reason(letter).passed
    with as_student(IDS[0]):  # the book's letter, for a student whose letter differs
        if _right_letter(IDS[0]) != "c":
            assert not tiling.check_cap_reason("c").passed


def _count(N_q, N_k, d, d_v):
    return 4 * N_q * N_k + (N_q + N_k) * d + (N_k + N_q) * d_v


def test_a_copied_number_fails():
    for sid in IDS[:10]:
        p = variant("9.1", sid)
        number = _count(p["N_q"], p["N_k"], p["d"], p["d_v"])
        with as_student(sid):
            assert io_model.check_standard_count(number).passed
        with as_student(_first_with_other_variant("9.1", sid)):
            assert not io_model.check_standard_count(number).passed
    book = io_model.STANDARD_PROBLEM
    with as_student(IDS[0]):  # the book's number (variant 0) fails every student
        assert not io_model.check_standard_count(_count(*book.values())).passed


def test_a_copied_formula_fails():
    """6.4 and 11.3 ask for a function whose formula is the variant's: a classmate's function
    (the formula of their variant, written out) fails another variant."""
    for sid in IDS[:6]:
        p = variant("6.4", sid)
        (a, b), (c, e) = p["left"], p["right"]

        def theirs(W, a=a, b=b, c=c, e=e):
            return (a * W + b, c * W + e)

        with as_student(sid):
            assert masking.check_window_size(theirs).passed
        with as_student(_first_with_other_variant("6.4", sid)):
            assert not masking.check_window_size(theirs).passed

    def book_window(W):
        return (W - 1, W - 1)

    for sid in IDS[:6]:
        with as_student(sid):
            assert not masking.check_window_size(book_window).passed


def test_a_copied_kv_grad_fails():
    def tiled(dk_rep, h_kv):  # the book's variant, written out
        *lead, h_q, n_k, d = dk_rep.shape
        return dk_rep.reshape(*lead, h_q // h_kv, h_kv, n_k, d).sum(axis=-4)

    assert beyond.check_kv_grad(tiled).passed
    for sid in IDS[:6]:
        with as_student(sid):
            assert not beyond.check_kv_grad(tiled).passed


def test_o_writes_asks_the_students_sizes_first():
    def o_writes(N, B_r, B_c, order):
        T_r, T_c = -(-N // B_r), -(-N // B_c)
        return T_r * T_c if order == "v1" else T_r

    p = variant("4.3", IDS[0])
    with as_student(IDS[0]):
        fb = tiling.check_o_writes(o_writes)
    assert fb.passed
    assert f"v1, N = {p['N']}, B_r = {p['B_r']}, B_c = {p['B_c']}" in fb.passes[0]
    assert np.all([isinstance(v, str) for v in fb.passes])
