"""The GPU chapter's checkers (flashlib.book.exercises.gpu) accept the right pieces of the Triton
kernel and recognise the typical wrong ones, in Triton's interpreter; and the exercise kernel
with the reference pieces is the library kernel (flashlib.gpu.kernels), tested equal."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the GPU exercises need torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("the GPU exercises need triton", allow_module_level=True)

import flashlib.gpu  # noqa: E402  (before triton: TRITON_INTERPRET=1 without a GPU)

CAPS = flashlib.gpu.capabilities()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashlib.book.exercises import NOT_ATTEMPTED, Feedback  # noqa: E402
from flashlib.book.exercises import gpu as ex  # noqa: E402
from flashlib.gpu import exercise_kernels as ek  # noqa: E402
from flashlib.gpu.grid import tiles_per_program  # noqa: E402
from flashlib.gpu.triton_attention import triton_attention  # noqa: E402

pytestmark = pytest.mark.skipif(not CAPS.triton, reason=" ".join(CAPS.notes[:1]))


def assert_fails_with(fb: Feedback, *phrases: str) -> None:
    assert not fb.passed, str(fb)
    for phrase in phrases:
        assert phrase in str(fb), (phrase, str(fb))


def test_exercise_kernel_with_the_reference_pieces_is_the_library_kernel():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 32)).astype(np.float32) for n in (45, 70, 70))
    for causal in (False, True):
        o, visits = ek.run_exercise_kernel(q, k, v, causal=causal, blocks=(16, 32))
        lib = triton_attention(*(torch.from_numpy(x).to(CAPS.device) for x in (q, k, v)),
                               causal=causal, blocks=(16, 32))
        np.testing.assert_allclose(o, lib.cpu().numpy(), rtol=0, atol=1e-6)
        assert visits.tolist() == [tiles_per_program(45, 70, 16, 32, causal)] * 2


# ---- the inner loop ---------------------------------------------------------------------------

def test_step_accepts_the_reference():
    fb = ex.check_online_softmax_step(ek.online_softmax_step)
    assert fb.passed, str(fb)
    assert "float16" in str(fb) and "causal" in str(fb)


@triton.jit
def _step_todo(S_ij, V_j, m_i, l_i, acc):
    raise NotImplementedError


@triton.jit
def _step_without_acc_rescale(S_ij, V_j, m_i, l_i, acc):
    m_new = tl.maximum(m_i, tl.max(S_ij, 1))
    P_ij = tl.exp2(S_ij - m_new[:, None])
    l_i = tl.exp2(m_i - m_new) * l_i + tl.sum(P_ij, 1)
    return m_new, l_i, acc + tl.dot(P_ij.to(V_j.dtype), V_j)


@triton.jit
def _step_with_exp_and_no_cast(S_ij, V_j, m_i, l_i, acc):
    m_new = tl.maximum(m_i, tl.max(S_ij, 1))
    P_ij = tl.exp(S_ij - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    return m_new, alpha * l_i + tl.sum(P_ij, 1), alpha[:, None] * acc + tl.dot(P_ij, V_j)


@triton.jit
def _step_without_max(S_ij, V_j, m_i, l_i, acc):
    P_ij = tl.exp2(S_ij)
    return m_i, l_i + tl.sum(P_ij, 1), acc + tl.dot(P_ij.to(V_j.dtype), V_j)


def test_step_recognises_typical_mistakes():
    fb = ex.check_online_softmax_step(_step_todo)
    assert fb.problems == [NOT_ATTEMPTED], str(fb)
    assert_fails_with(ex.check_online_softmax_step(_step_without_acc_rescale),
                      "acc was not rescaled")
    fb = ex.check_online_softmax_step(_step_with_exp_and_no_cast)
    assert_fails_with(fb, "use tl.exp2, not tl.exp", "Both operands must be same dtype",
                      "P_ij.to(V_j.dtype)")
    assert_fails_with(ex.check_online_softmax_step(_step_without_max),
                      "holds NaN or inf: subtract the running maximum")


# ---- causal tile skipping ---------------------------------------------------------------------

@triton.jit
def _end_too_early(i, B_r, N_K, CAUSAL: tl.constexpr):
    end = N_K
    if CAUSAL:
        end = tl.minimum(N_K, i)
    return end


@triton.jit
def _end_without_min(i, B_r, N_K, CAUSAL: tl.constexpr):
    end = N_K
    if CAUSAL:
        end = i + B_r
    return end


@triton.jit
def _end_ignoring_causal(i, B_r, N_K, CAUSAL: tl.constexpr):
    return tl.minimum(N_K, i + B_r)


def test_key_end_accepts_the_reference_and_refuses_visiting_every_tile():
    fb = ex.check_key_end(ek.key_end)
    assert fb.passed, str(fb)
    assert "15 key tiles visited of 25" in str(fb)
    assert_fails_with(ex.check_key_end(ek.key_end_all_tiles),
                      "correct, but program 0 visits 5 key tiles where 1 suffice")


def test_key_end_recognises_typical_mistakes():
    assert_fails_with(ex.check_key_end(_end_too_early), "wrong output",
                      "stop at i + B_r (not before)")
    assert_fails_with(ex.check_key_end(_end_without_min), "stop at min(N_K, i + B_r)")
    assert_fails_with(ex.check_key_end(_end_ignoring_causal),
                      "without a mask every row sees every key, return N_K")


# ---- the boundary mask ------------------------------------------------------------------------

@triton.jit
def _visible_strict(rows, cols, N_K, CAUSAL: tl.constexpr):
    visible = cols[None, :] < N_K
    if CAUSAL:
        visible = visible & (cols[None, :] < rows[:, None])
    return visible


@triton.jit
def _visible_not_causal(rows, cols, N_K, CAUSAL: tl.constexpr):
    return cols[None, :] < N_K


def test_visible_keys_accepts_the_reference_and_finds_the_bug():
    assert ex.check_visible_keys(ek.visible_keys).passed
    fb = ex.check_visible_keys(ek.visible_keys_with_bug)
    assert_fails_with(fb, "were counted as keys with score 0: require cols < N_K",
                      "right when n_k is a multiple of B_c, wrong otherwise")
    # the bug hides where the causal mask covers the padding: square causal attention
    assert "ok n_q=45, n_k=45, d=16, causal" in str(fb)


def test_visible_keys_recognises_typical_mistakes():
    assert_fails_with(ex.check_visible_keys(_visible_strict), "j <= i, not j < i")
    assert_fails_with(ex.check_visible_keys(_visible_not_causal), "the causal mask is missing")


def test_checkers_say_plainly_when_the_kernels_cannot_run(monkeypatch):
    monkeypatch.setattr(ex, "_gpu_unavailable", lambda: "torch is not installed")
    for check in (ex.check_online_softmax_step, ex.check_key_end, ex.check_visible_keys):
        fb = check(ek.key_end)
        assert not fb.passed
        assert fb.problems == ["this exercise runs a Triton kernel, which cannot run here: "
                               "torch is not installed"]
