"""Online softmax: any order, any block size and any tree of merges equals a single pass."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from flashlib.fast.online import (
    PartialAttention,
    SoftmaxState,
    TraceStep,
    finalize_partial,
    merge_partials,
    online_softmax,
    online_softmax_update,
    partial_attention,
    partial_blocks,
    softmax_state_init,
    two_pass_softmax_state,
)
from tests.helpers import max_err

REL = 1e-14


def _direct(x):
    """(m, l) from the definition, in float64."""
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1)
    return m, np.exp(x - m[..., None]).sum(axis=-1)


def _assert_state_close(state, m, l, rel=REL):  # noqa: E741
    assert np.array_equal(np.asarray(state.m), np.asarray(m)), "the maximum is exact"
    l = np.asarray(l)  # noqa: E741
    assert np.all(np.abs(np.asarray(state.l) - l) <= rel * np.abs(l))


@pytest.mark.parametrize("scale", [1.0, 1e2, 1e4])
@pytest.mark.parametrize("block", [1, 2, 3, 7, 16, 64, 1000])
def test_blocks_equal_single_pass(block, scale, rng):
    x = rng.standard_normal((3, 50)) * scale
    state = online_softmax(x, block=block)
    assert isinstance(state, SoftmaxState)
    m, l = _direct(x)  # noqa: E741
    _assert_state_close(state, m, l)
    _assert_state_close(two_pass_softmax_state(x), m, l)


def test_any_order_equals_single_pass(rng):
    x = rng.standard_normal(64) * 30
    m, l = _direct(x)  # noqa: E741
    for _ in range(20):
        perm = rng.permutation(x.size)
        for block in (1, 5):
            _assert_state_close(online_softmax(x[perm], block=block), m, l)


def test_update_by_single_values(rng):
    x = rng.standard_normal(40) * 5
    state = softmax_state_init()
    assert float(state.m) == -np.inf and float(state.l) == 0.0
    for value in x:
        state = online_softmax_update(state, value)
    _assert_state_close(state, *_direct(x))


def test_update_by_single_values_batched(rng):
    x = rng.standard_normal((4, 3, 25))
    state = softmax_state_init((4, 3))
    for i in range(x.shape[-1]):
        state = online_softmax_update(state, x[..., i])
    _assert_state_close(state, *_direct(x))


def test_update_by_uneven_blocks(rng):
    x = rng.standard_normal((2, 57)) * 10
    cuts = np.sort(rng.choice(np.arange(1, 57), size=8, replace=False))
    state = softmax_state_init((2,))
    for chunk in np.split(x, cuts, axis=-1):
        state = online_softmax_update(state, chunk)
    _assert_state_close(state, *_direct(x))


def test_empty_block_leaves_state_unchanged(rng):
    state = online_softmax(rng.standard_normal(5))
    same = online_softmax_update(state, np.empty(0))
    assert float(same.m) == float(state.m) and float(same.l) == float(state.l)


def test_float32_stays_float32(rng):
    x = rng.standard_normal((2, 30)).astype(np.float32)
    state = online_softmax(x, block=4)
    assert state.m.dtype == np.float32 and state.l.dtype == np.float32
    m, l = _direct(x)  # noqa: E741
    assert np.all(np.abs(state.l - l) <= 1e-5 * l)


def test_large_values_do_not_overflow():
    x = np.array([1e4, 1e4 - 1.0, -1e4, 5e3, 1e4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = online_softmax(x, block=2)
    assert float(state.m) == 1e4
    assert abs(float(state.l) - (2 + math.exp(-1.0))) <= REL * 3


def test_minus_inf_values():
    x = np.array([-np.inf, -np.inf, 1.0, -np.inf, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = online_softmax(x, block=1)
    assert float(state.m) == 2.0
    assert abs(float(state.l) - (1 + math.exp(-1.0))) <= REL * 2


# --- trace --------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [1, 3, 4, 10])
def test_trace_content(block, rng):
    x = rng.standard_normal(10) * 3
    state, steps = online_softmax(x, block=block, trace=True)
    assert len(steps) == math.ceil(x.size / block)
    prev_m = -np.inf
    for step_no, step in enumerate(steps):
        assert isinstance(step, TraceStep)
        stop = min((step_no + 1) * block, x.size)
        assert step.k == stop
        assert np.array_equal(step.x_k, x[step_no * block: stop])
        m_k, l_k = _direct(x[:stop])
        assert float(step.m_k) == m_k
        assert abs(float(step.l_k) - l_k) <= REL * l_k
        assert abs(float(step.rescale) - math.exp(prev_m - m_k)) <= REL
        if prev_m == m_k:
            assert float(step.rescale) == 1.0
        prev_m = m_k
    assert float(steps[-1].m_k) == float(state.m) and float(steps[-1].l_k) == float(state.l)


def test_trace_rescale_when_max_grows():
    x = np.array([1.0, 3.0, 2.0, 5.0])
    _, steps = online_softmax(x, block=1, trace=True)
    assert [float(s.m_k) for s in steps] == [1.0, 3.0, 3.0, 5.0]
    assert float(steps[0].rescale) == 0.0  # exp(-inf - 1): the empty sum is scaled by 0
    assert abs(float(steps[1].rescale) - math.exp(-2.0)) <= REL
    assert float(steps[2].rescale) == 1.0
    assert abs(float(steps[3].rescale) - math.exp(-2.0)) <= REL


def test_trace_is_a_snapshot(rng):
    """Trace entries are copies: later steps do not change earlier ones."""
    x = rng.standard_normal(6)
    _, steps = online_softmax(x, block=2, trace=True)
    first = [(float(s.m_k), float(s.l_k)) for s in steps]
    x[:] = 0
    assert [(float(s.m_k), float(s.l_k)) for s in steps] == first


# --- partial attention states and their merges -------------------------------------------

def _attention(s, v):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _random_tree_merge(parts, rng):
    """Merge a list of partial states by a random binary tree (random split points)."""
    if len(parts) == 1:
        return parts[0]
    cut = int(rng.integers(1, len(parts)))
    left = _random_tree_merge(parts[:cut], rng)
    right = _random_tree_merge(parts[cut:], rng)
    return merge_partials(left, right) if rng.random() < 0.5 else merge_partials(right, left)


@pytest.mark.parametrize("logit_scale", [1.0, 1e2, 1e4])
def test_any_tree_of_merges_equals_single_pass(logit_scale, rng):
    n_q, n_k, d_v = 5, 48, 7
    s = rng.standard_normal((2, n_q, n_k)) * logit_scale
    v = rng.standard_normal((2, n_k, d_v))
    ref = _attention(s, v)
    full = partial_attention(s, v)
    for _ in range(25):
        perm = rng.permutation(n_k)
        cuts = np.sort(rng.choice(np.arange(1, n_k), size=int(rng.integers(1, 10)),
                                  replace=False))
        parts = [partial_attention(s[..., idx], v[:, idx]) for idx in np.split(perm, cuts)]
        merged = _random_tree_merge(parts, rng)
        assert isinstance(merged, PartialAttention)
        assert np.array_equal(merged.m, full.m)
        assert np.all(np.abs(merged.l - full.l) <= REL * full.l)
        out = finalize_partial(merged)
        assert max_err(out, ref) <= REL * max(1.0, float(np.max(np.abs(ref))))


def test_merge_is_commutative_and_associative(rng):
    s = rng.standard_normal((4, 12)) * 3
    v = rng.standard_normal((12, 3))
    a, b, c = (partial_attention(s[:, sl], v[sl]) for sl in
               (slice(0, 4), slice(4, 9), slice(9, 12)))
    ab, ba = merge_partials(a, b), merge_partials(b, a)
    for x, y in zip(ab, ba, strict=True):
        assert np.array_equal(x, y)
    left = merge_partials(merge_partials(a, b), c)
    right = merge_partials(a, merge_partials(b, c))
    assert np.array_equal(left.m, right.m)
    assert np.all(np.abs(left.l - right.l) <= REL * left.l)
    assert max_err(left.acc, right.acc) <= REL * float(np.max(np.abs(left.acc)))


def test_masked_and_empty_partials_merge_without_nan(rng):
    """A block whose scores are all -inf (fully masked) has m = -inf, l = 0, acc = 0 and is the
    identity of merge; a row that never sees a key finalises to 0."""
    s = rng.standard_normal((3, 8))
    s[1, :] = -np.inf  # row 1 sees no key at all
    s[0, 4:] = -np.inf  # row 0: second half masked
    v = rng.standard_normal((8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = partial_attention(s[:, :4], v[:4])
        b = partial_attention(s[:, 4:], v[4:])
        assert np.isneginf(b.m[0]) and b.l[0] == 0 and not b.acc[0].any()
        merged = merge_partials(a, b)
        out = finalize_partial(merged)
    assert np.all(np.isfinite(out))
    assert not out[1].any()
    vis = np.isfinite(s)
    for i in (0, 2):
        ref = _attention(s[i, vis[i]][None], v[vis[i]])[0]
        assert max_err(out[i], ref) <= REL * 10


def test_empty_state_is_merge_identity(rng):
    s = rng.standard_normal((2, 5))
    v = rng.standard_normal((5, 3))
    a = partial_attention(s, v)
    empty = PartialAttention(np.full(2, -np.inf), np.zeros(2), np.zeros((2, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for merged in (merge_partials(a, empty), merge_partials(empty, a)):
            for x, y in zip(merged, a, strict=True):
                assert np.array_equal(x, y)
        both = merge_partials(empty, empty)
    assert np.all(np.isneginf(both.m)) and not both.l.any() and not both.acc.any()
    assert not finalize_partial(both).any()


# merge_in_order / merge_random_tree (the Online softmax chapter's merge experiment)

def _blocks(n_q=5, n_k=40, d=4, d_v=3, block=7, seed=0):
    from flashlib import naive_attention

    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d))
    v = rng.standard_normal((n_k, d_v))
    s = (q @ k.T) / np.sqrt(d)
    parts = partial_blocks(s, v, block)
    return parts, naive_attention(q, k, v)


def test_merge_in_order_any_permutation_matches_naive():
    from flashlib.fast.online import merge_in_order

    parts, ref = _blocks()
    rng = np.random.default_rng(0)
    for order in [range(len(parts)), range(len(parts) - 1, -1, -1),
                  *(rng.permutation(len(parts)) for _ in range(5))]:
        assert max_err(finalize_partial(merge_in_order(parts, order)), ref) < 1e-13
    single = merge_in_order(parts[:1], [0])
    assert single is parts[0]


def test_merge_in_order_rejects_bad_order():
    from flashlib.fast.online import merge_in_order

    parts, _ = _blocks()
    with pytest.raises(ValueError, match="order"):
        merge_in_order(parts, [0, 0, 1])
    with pytest.raises(ValueError, match="parts"):
        merge_in_order([], [])


def test_merge_random_tree_matches_naive_and_is_seeded():
    from flashlib.fast.online import merge_random_tree

    parts, ref = _blocks(block=3)
    outs = [finalize_partial(merge_random_tree(parts, np.random.default_rng(seed)))
            for seed in range(6)]
    assert all(max_err(o, ref) < 1e-13 for o in outs)
    again = finalize_partial(merge_random_tree(parts, np.random.default_rng(0)))
    assert np.array_equal(again, outs[0])
    assert merge_random_tree(parts[:1], np.random.default_rng(0)) is parts[0]
    with pytest.raises(TypeError, match="rng"):
        merge_random_tree(parts, 0)
    with pytest.raises(ValueError, match="parts"):
        merge_random_tree([], np.random.default_rng(0))


@pytest.mark.parametrize("block", [1, 3, 7, 40, 100])
def test_partial_blocks_are_consecutive_partial_attentions(block):
    rng = np.random.default_rng(0)
    # a leading head axis, n_q = 5, n_k = 40 (7 does not divide 40: a short last block)
    s = rng.standard_normal((2, 5, 40))
    v = rng.standard_normal((2, 40, 3))
    parts = partial_blocks(s, v, block)
    assert len(parts) == -(-40 // block)
    for p, j in zip(parts, range(0, 40, block), strict=True):
        want = partial_attention(s[..., j:j + block], v[..., j:j + block, :])
        for got_field, want_field in zip(p, want, strict=True):
            np.testing.assert_array_equal(got_field, want_field)
    merged = parts[0]
    for p in parts[1:]:
        merged = merge_partials(merged, p)
    whole = partial_attention(s, v)
    np.testing.assert_allclose(finalize_partial(merged), finalize_partial(whole), rtol=1e-13)


def test_partial_blocks_refuses_bad_input():
    s, v = np.zeros((2, 6)), np.zeros((6, 3))
    for bad in (0, -2):
        with pytest.raises(ValueError, match="block must be"):
            partial_blocks(s, v, bad)
    for bad in (2.0, True, "2", None):
        with pytest.raises(TypeError, match="block must be"):
            partial_blocks(s, v, bad)
    with pytest.raises(ValueError, match="disagree"):
        partial_blocks(s, np.zeros((5, 3)), 2)
