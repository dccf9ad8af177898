"""The teaching functions the chapters show (the papers' algorithms, one head, no validation)
equal their library counterparts and the float64 reference on the awkward shapes the other
tests use: ragged last blocks, n = 1, blocks larger than n, n_q != n_k, B_r != B_c, 1 x 1
blocks, d_v != d.  float64 to 1e-12; float32 within the usual rounding."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import flashlib
from flashlib.algorithms import (
    delta_from_O,
    flash1_backward,
    flash1_forward,
    flash2_backward,
    flash2_dropout_backward,
    flash2_dropout_forward,
    flash2_forward,
    grouped_query_attention,
    masked_flash_forward,
    merge_states,
    online_attention_row,
    online_update,
    paged_kv_decode,
    recompute_P,
    safe_softmax,
    split_kv_decode,
    standard_attention,
    standard_attention_backward,
    two_pass_backward,
)
from flashlib.fast import online
from tests.helpers import (
    max_err,
    reference_attention,
    torch,
    torch_attention,
    torch_grads,
)

TEACHING = [safe_softmax, online_update, online_attention_row, merge_states, standard_attention,
            flash1_forward, flash2_forward, masked_flash_forward, standard_attention_backward,
            delta_from_O, recompute_P, flash1_backward, flash2_backward, two_pass_backward,
            flash2_dropout_forward, flash2_dropout_backward, split_kv_decode, paged_kv_decode,
            grouped_query_attention]

# (n_q, n_k, d, d_v, B_r, B_c)
SHAPES = {
    "ragged_last_blocks": (100, 70, 16, 16, 32, 32),
    "n1": (1, 1, 8, 8, 64, 64),
    "block_larger_than_n": (7, 9, 8, 8, 64, 128),
    "one_query_many_keys": (1, 37, 16, 16, 8, 8),
    "many_queries_one_key": (37, 1, 16, 16, 8, 8),
    "nq_ne_nk_br_ne_bc_dv_ne_d": (70, 50, 32, 12, 16, 32),
    "blocks_1x1": (9, 11, 4, 3, 1, 1),
    "blocks_1_and_5": (13, 8, 4, 4, 1, 5),
    "d1": (20, 17, 1, 1, 8, 4),
}
F64_TOL = 1e-12


def _qkv(shape, dtype=np.float64, seed=0, logit=None):
    n_q, n_k, d, d_v, _, _ = shape
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((n_q, d), (n_k, d), (n_k, d_v)))
    if logit is not None:  # large scores: the running maximum matters
        q *= logit / max(1e-300, np.max(np.abs(q @ k.T)) / math.sqrt(d))
    do = rng.standard_normal((n_q, d_v))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def _rel(a, b):
    return max_err(a, b) / max(1.0, float(np.max(np.abs(b), initial=0.0)))


def _low_tol(dtype, n):
    """float32: a few roundings per accumulated term (sums over n keys)."""
    return 64 * float(np.finfo(dtype).eps) * max(1.0, math.sqrt(n))


@pytest.mark.parametrize("fn", TEACHING, ids=lambda f: f.__name__)
def test_teaching_functions_are_short_and_unvalidated(fn):
    """At most ~30 lines of body; no raise (no validation), at most one assert."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source).body[0]
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # no docstring
    lines = body[-1].end_lineno - body[0].lineno + 1
    assert lines <= 30, f"{fn.__name__}: {lines} lines"
    nodes = list(ast.walk(tree))
    assert not any(isinstance(n, ast.Raise) for n in nodes), fn.__name__
    assert sum(isinstance(n, ast.Assert) for n in nodes) <= 1, fn.__name__
    assert fn.__doc__ and fn.__module__.startswith("flashlib.")


def test_algorithms_fit_in_76_columns():
    """The chapters show these functions: 76 columns, so that no line wraps at 1280 px and a
    phone scrolls inside the block (the rest of the repository: ruff's 99)."""
    path = Path(flashlib.algorithms.__file__)
    long = [(k, len(line)) for k, line in enumerate(path.read_text().splitlines(), 1)
            if len(line) > 76]
    assert not long, f"{path.name}: lines over 76 columns (line, length): {long}"


def test_teaching_functions_live_in_algorithms_not_in_the_public_api():
    """Every teaching function is in flashlib.algorithms (the one front door), in its __all__;
    flashlib's public API holds only the library twins."""
    names = {fn.__name__ for fn in TEACHING}
    for fn in TEACHING:
        assert inspect.getmodule(fn) is flashlib.algorithms, fn.__name__
        assert fn.__name__ in flashlib.algorithms.__all__, fn.__name__
        assert fn.__name__ not in flashlib.__all__ and not hasattr(flashlib, fn.__name__)
    assert names == set(flashlib.algorithms.__all__), "every teaching function is tested here"


# --- softmax and the online-softmax steps ---------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4])
def test_safe_softmax_equals_softmax(scale, rng):
    x = rng.standard_normal((5, 33)) * scale
    assert max_err(safe_softmax(x), flashlib.softmax(x)) <= 1e-15
    x32 = x.astype(np.float32)
    got = safe_softmax(x32)
    assert got.dtype == np.float32
    assert max_err(got, flashlib.softmax(x32)) <= 4 * np.finfo(np.float32).eps
    assert max_err(safe_softmax(x[0]), flashlib.softmax(x[0])) <= 1e-15  # one row


@pytest.mark.parametrize("scale", [1.0, 50.0, 1e3])
def test_online_update_equals_library_and_two_pass(scale, rng):
    x = rng.standard_normal((4, 40)) * scale  # 4 streams (rows) of 40 values
    m, l = np.full(4, -np.inf), np.zeros(4)
    for j in range(x.shape[1]):
        m, l = online_update(m, l, x[:, j])
    lib = online.online_softmax(x, block=1)
    two = online.two_pass_softmax_state(x)
    np.testing.assert_array_equal(m, lib.m)
    np.testing.assert_array_equal(m, two.m)
    assert np.all(np.abs(l - lib.l) <= 1e-14 * lib.l)
    assert np.all(np.abs(l - two.l) <= 1e-13 * two.l)
    # scalars: one stream, as the chapter's trace
    m0, l0 = -np.inf, 0.0
    for value in x[0]:
        m0, l0 = online_update(m0, l0, value)
    assert m0 == lib.m[0] and abs(l0 - lib.l[0]) <= 1e-14 * lib.l[0]


def _row_reference(s, v):
    """softmax(s) @ v in float64, masked (-inf) keys weighing 0; 0 for a row with no key."""
    s, v = np.asarray(s, np.float64), np.asarray(v, np.float64)
    if np.all(np.isneginf(s)):
        return np.zeros(v.shape[1])
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v


ROWS = {  # one query row's scores: the edge cases of the library's tests
    "n1": np.array([3.0]),
    "random": np.random.default_rng(1).standard_normal(37),
    "all_very_negative": -800.0 - np.arange(9.0) % 4,
    "huge": 1e4 + np.random.default_rng(2).standard_normal(20),
    "first_masked": np.array([-np.inf, 0.5, -1.0, 2.0]),
    "some_masked": np.where(np.arange(12) % 3 == 0, -np.inf, np.linspace(-2.0, 5.0, 12)),
    "last_masked": np.array([1.0, 4.0, -np.inf]),
    "all_masked": np.full(5, -np.inf),
    "rising": np.arange(15.0) * 3.0,  # the maximum grows at every key
}


@pytest.mark.parametrize("case", list(ROWS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_online_attention_row_equals_library_and_reference(case, dtype):
    """The bridge of the online-softmax chapter: one row, key by key, equals the library's
    partial state, finalised, and a float64 reference, without a warning, on n = 1, scores
    near -800, huge scores and -inf (masked) keys, the first, some or all of them."""
    s = ROWS[case].astype(dtype)
    v = np.random.default_rng(3).standard_normal((len(s), 6)).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning, no NaN
        got = online_attention_row(s, v)
    assert got.shape == (6,) and got.dtype == dtype
    ref = _row_reference(s, v)
    lib = online.finalize_partial(online.partial_attention(s[None], v))[0]
    tol = F64_TOL if dtype == np.float64 else _low_tol(np.float32, len(s))
    assert max_err(got, ref) <= tol, max_err(got, ref)
    assert max_err(got, lib) <= tol
    if case == "all_masked":
        np.testing.assert_array_equal(got, 0.0)


@pytest.mark.parametrize("case", ["ragged_last_blocks", "one_query_many_keys", "blocks_1x1"])
def test_online_attention_row_is_the_tiled_loop_per_row(case):
    """Each row of flash2_forward (and of the library) is online_attention_row over that row's
    scaled scores."""
    shape = SHAPES[case]
    q, k, v, _ = _qkv(shape, logit=30.0)
    o2, _ = flash2_forward(q, k, v, *shape[4:])
    s = q @ k.T / math.sqrt(q.shape[1])
    rows = np.stack([online_attention_row(s_r, v) for s_r in s])
    assert max_err(rows, o2) <= F64_TOL


@pytest.mark.parametrize("shift", [0.0, 4.0, 300.0])
def test_merge_states_equals_merge_partials(shift, rng):
    s = rng.standard_normal((6, 20))
    s[:, 7:] += shift * np.where(np.arange(6) % 2, 1.0, -1.0)[:, None]  # alternate the larger
    v = rng.standard_normal((20, 5))
    a, b = online.partial_attention(s[:, :7], v[:7]), online.partial_attention(s[:, 7:], v[7:])
    m, l, acc = merge_states(tuple(a), tuple(b))
    want = online.merge_partials(a, b)
    np.testing.assert_array_equal(m, want.m)
    assert max_err(l, want.l) <= 1e-15 * float(np.max(want.l))
    assert max_err(acc, want.acc) <= 1e-14 * max(1.0, float(np.max(np.abs(want.acc))))
    whole = online.finalize_partial(online.partial_attention(s, v))
    assert max_err(acc / l[:, None], whole) <= 1e-13


# --- attention ------------------------------------------------------------------------------

@pytest.mark.parametrize("logit", [None, 30.0])
@pytest.mark.parametrize("case", list(SHAPES))
def test_forward_teaching_float64(case, logit):
    shape = SHAPES[case]
    q, k, v, _ = _qkv(shape, logit=logit)
    b_r, b_c = shape[4:]
    ref, ref_lse = reference_attention(q, k, v, scale=1 / math.sqrt(q.shape[1]))
    lib, lib_lse = flashlib.flash_attention(q, k, v, block_q=b_r, block_k=b_c, return_lse=True)
    outputs = {
        "standard_attention": standard_attention(q, k, v),
        "flash1_forward": flash1_forward(q, k, v, b_r, b_c),
    }
    o2, lse2 = flash2_forward(q, k, v, b_r, b_c)
    outputs["flash2_forward"] = o2
    counterparts = {
        "standard_attention": flashlib.naive_attention(q, k, v),
        "flash1_forward": flashlib.flash_attention_v1(q, k, v, block_q=b_r, block_k=b_c),
        "flash2_forward": lib,
    }
    for name, o in outputs.items():
        assert o.shape == ref.shape and o.dtype == np.float64, name
        assert max_err(o, ref) <= F64_TOL, (name, max_err(o, ref))
        assert max_err(o, counterparts[name]) <= F64_TOL, name
    assert lse2.shape == (q.shape[0],)
    assert max_err(lse2, ref_lse) <= F64_TOL and max_err(lse2, lib_lse) <= F64_TOL


@pytest.mark.parametrize("case", list(SHAPES))
def test_forward_teaching_float32(case):
    shape = SHAPES[case]
    q, k, v, _ = _qkv(shape, dtype=np.float32)
    b_r, b_c = shape[4:]
    ref, _ = reference_attention(q, k, v, scale=1 / math.sqrt(q.shape[1]))
    tol = _low_tol(np.float32, shape[1])
    pairs = {
        "standard_attention": (standard_attention(q, k, v), flashlib.naive_attention(q, k, v)),
        "flash1_forward": (flash1_forward(q, k, v, b_r, b_c),
                           flashlib.flash_attention_v1(q, k, v, block_q=b_r, block_k=b_c)),
        "flash2_forward": (flash2_forward(q, k, v, b_r, b_c)[0],
                           flashlib.flash_attention(q, k, v, block_q=b_r, block_k=b_c)),
    }
    for name, (teach, lib) in pairs.items():
        assert teach.dtype == np.float32, f"{name} promoted float32 to {teach.dtype}"
        assert _rel(teach, lib) <= tol, (name, _rel(teach, lib), tol)
        assert _rel(teach, ref) <= tol, (name, _rel(teach, ref), tol)


@pytest.mark.parametrize("case", list(SHAPES))
def test_backward_teaching_float64(case):
    shape = SHAPES[case]
    q, k, v, do = _qkv(shape, seed=1)
    b_r, b_c = shape[4:]
    _, *ref = torch_grads(q, k, v, do, scale=1 / math.sqrt(q.shape[1]))
    o, lse = flash2_forward(q, k, v, b_r, b_c)
    teach = {
        "standard_attention_backward": standard_attention_backward(q, k, v, do),
        "flash2_backward": flash2_backward(q, k, v, o, lse, do, b_r, b_c),
        "two_pass_backward": two_pass_backward(q, k, v, o, lse, do, b_r, b_c),
    }
    lib = {
        "standard_attention_backward": flashlib.naive_attention_backward(q, k, v, do),
        "flash2_backward": flashlib.flash_attention_backward(q, k, v, o, lse, do, block_q=b_r,
                                                             block_k=b_c),
    }
    lib["two_pass_backward"] = lib["flash2_backward"]
    for name, grads in teach.items():
        for label, g, gl, r, x in zip("qkv", grads, lib[name], ref, (q, k, v), strict=True):
            assert g.shape == x.shape and g.dtype == np.float64, (name, label)
            assert _rel(g, r) <= F64_TOL, (name, label, _rel(g, r))
            assert _rel(g, gl) <= F64_TOL, (name, label, _rel(g, gl))


@pytest.mark.parametrize("case", ["ragged_last_blocks", "nq_ne_nk_br_ne_bc_dv_ne_d", "blocks_1x1"])
def test_backward_teaching_float32(case):
    shape = SHAPES[case]
    q, k, v, do = _qkv(shape, dtype=np.float32, seed=2)
    b_r, b_c = shape[4:]
    o, lse = flash2_forward(q, k, v, b_r, b_c)
    tol = 4 * _low_tol(np.float32, max(shape[:2]))
    pairs = {
        "standard_attention_backward": (standard_attention_backward(q, k, v, do),
                                        flashlib.naive_attention_backward(q, k, v, do)),
        "flash2_backward": (flash2_backward(q, k, v, o, lse, do, b_r, b_c),
                            flashlib.flash_attention_backward(q, k, v, o, lse, do, block_q=b_r,
                                                              block_k=b_c)),
        "two_pass_backward": (two_pass_backward(q, k, v, o, lse, do, b_r, b_c),
                              flashlib.flash_attention_backward(q, k, v, o, lse, do,
                                                                block_q=b_r, block_k=b_c)),
    }
    for name, (teach, lib) in pairs.items():
        for label, g, gl in zip("qkv", teach, lib, strict=True):
            assert g.dtype == np.float32, (name, label, g.dtype)
            assert _rel(g, gl) <= tol, (name, label, _rel(g, gl), tol)


@pytest.mark.parametrize("case", list(SHAPES))
def test_the_two_backward_schedules_agree(case):
    """Both schedules compute the same sums in a different grouping: equal to rounding in
    float64; dK and dV are accumulated in the same order by both, so bit for bit equal."""
    shape = SHAPES[case]
    q, k, v, do = _qkv(shape, seed=3, logit=8.0)
    b_r, b_c = shape[4:]
    o, lse = flash2_forward(q, k, v, b_r, b_c)
    one = flash2_backward(q, k, v, o, lse, do, b_r, b_c)
    two = two_pass_backward(q, k, v, o, lse, do, b_r, b_c)
    assert _rel(one[0], two[0]) <= F64_TOL
    np.testing.assert_array_equal(one[1], two[1])
    np.testing.assert_array_equal(one[2], two[2])


# --- masks: a row blind in one tile that sees keys in a later one -----------------------------

def _blind_then_far(score, dtype):
    """8 queries, 8 keys, d = 4, blocks 4 x 4: row 0 sees only keys 4-7 (so nothing in its
    first tile), with scores within about 1 of ``score``; every other row sees every key."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((8, 4), (8, 4), (8, 3)))
    q[0] = 10.0  # score_0j = sum(k_j) * 10 / sqrt(4) = 5 sum(k_j)
    k[4:] = score / 20 + 0.05 * rng.standard_normal((4, 4))
    mask = np.ones((8, 8), dtype=bool)
    mask[0, :4] = False
    s0 = q[0] @ k[4:].T / 2
    assert np.all(np.abs(s0 - score) < 1.5), s0
    return (*(x.astype(dtype) for x in (q, k, v)), mask)


@pytest.mark.parametrize(("score", "dtype"), [(-800.0, np.float64), (-1000.0, np.float64),
                                              (-100.0, np.float32), (-110.0, np.float32)])
def test_masked_forward_row_blind_in_one_tile_then_far_below_zero(score, dtype):
    """The running maximum stays -inf while a row has seen no key (0 is used only inside the
    exponent): storing the guard 0 into m_i made exp(S - 0) underflow in the next tile, O = 0
    and L = -inf for a row that does see keys (issue 23)."""
    q, k, v, mask = _blind_then_far(score, dtype)
    O, L = masked_flash_forward(q, k, v, lambda i, j, n_q, n_k: mask[i, j], 4, 4)
    assert O.dtype == dtype and L.dtype == dtype
    ref, ref_lse = reference_attention(q, k, v, mask=mask)
    assert np.isfinite(O[0]).all() and np.isfinite(L[0])
    tol = F64_TOL if dtype == np.float64 else _low_tol(np.float32, 8)
    assert max_err(O, ref) <= tol, (O[0], ref[0])
    assert max_err(L, ref_lse) <= tol * abs(score)
    lib = flashlib.naive_attention(q, k, v, mask=mask)
    assert max_err(O, lib) <= tol
    if torch is not None:
        t = torch_attention(*(torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)),
                            mask=mask).numpy()
        assert max_err(O, t) <= tol


def test_empty_states_merge_and_update_to_the_empty_state_without_a_warning():
    # what the book teaches: two empty states merge to the empty state (m = -inf, l = 0,
    # acc = 0), and folding a masked score (-inf) into the empty state leaves it empty
    import warnings

    from flashlib.algorithms import merge_states, online_update

    empty = (np.full(3, -np.inf), np.zeros(3), np.zeros((3, 2)))
    full = (np.array([1.0, -2.0, 5.0]), np.ones(3), np.ones((3, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m, l, acc = merge_states(empty, empty)
        assert np.isneginf(m).all() and (l == 0).all() and (acc == 0).all()
        for a, b in ((full, empty), (empty, full)):
            for got, want in zip(merge_states(a, b), full, strict=True):
                np.testing.assert_array_equal(got, want)
        m, l = online_update(-np.inf, 0.0, -np.inf)
        assert m == -np.inf and l == 0.0
        m, l = online_update(np.array([-np.inf, 0.0]), np.array([0.0, 1.0]),
                             np.array([2.0, -np.inf]))
        np.testing.assert_array_equal(m, [2.0, 0.0])
        np.testing.assert_array_equal(l, [1.0, 1.0])
