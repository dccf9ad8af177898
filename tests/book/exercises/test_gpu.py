"""The GPU chapter's checkers (flashlib.book.exercises.gpu), in Triton's interpreter: each accepts
the right answer (flashlib's helper for 10.1-10.3, the book's solution for 10.4-10.5) and names
each common mistake, found by running it: every mistake below is the right answer with one
change (a test fails if the right answer stops containing the text a mistake replaces)."""

from __future__ import annotations

import importlib.util
import inspect
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the GPU exercises need torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("the GPU exercises need triton", allow_module_level=True)

import flashlib.gpu  # noqa: E402  (before triton: TRITON_INTERPRET=1 without a GPU)

CAPS = flashlib.gpu.capabilities()

from flashlib.book.exercises import NOT_ATTEMPTED  # noqa: E402
from flashlib.book.exercises import gpu as ex  # noqa: E402
from flashlib.gpu import exercise_kernels as ek  # noqa: E402
from flashlib.gpu import kernels  # noqa: E402
from flashlib.gpu.grid import key_block_end  # noqa: E402
from tests.helpers import assert_fails_with, import_code, solution_code, text  # noqa: E402

pytestmark = pytest.mark.skipif(not CAPS.triton, reason=" ".join(CAPS.notes[:1]))
interpreter_only = pytest.mark.skipif(CAPS.mode != "interpreter",
                                      reason="the memory watch and tiles under 16: interpreter")
HEAD = "import triton\nimport triton.language as tl\n\n"
_names = itertools.count()


def changed(source: str, *swaps: tuple[str, str]) -> str:
    for old, new in swaps:
        assert old in source, f"test bug: {old!r} is not in the right answer any more"
        source = source.replace(old, new)
    return source


@pytest.fixture
def piece(tmp_path):
    """piece(helper, *swaps): flashlib's helper (kernels.py) with each (old, new) swapped, as
    a reader's @triton.jit function of the same name, defined in a file (Triton reads it)."""
    def make(helper, *swaps):
        source = changed(inspect.getsource(helper.fn), *swaps)
        module = import_code(HEAD + source, tmp_path, f"piece{next(_names)}")
        return getattr(module, helper.fn.__name__)
    return make


@pytest.fixture
def answer(tmp_path):
    """answer(label, *swaps): the book's solution of exercise ``label`` with each swap, as a
    module."""
    def make(label, *swaps):
        source = changed(solution_code("gpu", label), *swaps)
        return import_code(HEAD + source, tmp_path, f"answer{next(_names)}")
    return make


# ---- the pieces in the library kernel, and the probes -----------------------------------------

def test_probes_run_the_library_helpers():
    assert ek.key_ends(70, 40, 32, True) == [key_block_end(p, 32, 40, True) for p in range(3)]
    assert ek.key_ends(70, 40, 32, True, ek.key_end_all_tiles) == [40, 40, 40]
    rows, cols = np.arange(32, 48)[:, None], np.arange(32, 48)[None, :]
    assert np.array_equal(ek.visible_block(32, 32, 16, 16, 45, True),
                          (cols < 45) & (cols <= rows))
    assert ek.visible_block(0, 32, 16, 16, 45, False, ek.visible_keys_with_bug).all()
    rng = np.random.default_rng(0)
    S = rng.standard_normal((16, 16)).astype(np.float32)
    V = rng.standard_normal((16, 16)).astype(np.float32)
    m, l, acc = ek.step_once(S, V, np.full(16, -np.inf, np.float32), np.zeros(16, np.float32),
                             np.zeros((16, 16), np.float32))
    P = np.exp2(S - S.max(1, keepdims=True))
    np.testing.assert_allclose(m, S.max(1), rtol=1e-6)
    np.testing.assert_allclose(l, P.sum(1), rtol=1e-5)
    np.testing.assert_allclose(acc, P @ V, rtol=1e-4, atol=1e-5)


def test_kernel_with_puts_a_helper_in_place_and_keeps_the_original():
    variant = kernels.kernel_with(kernels.flash2_forward_kernel,
                                  key_end=ek.key_end_all_tiles)
    assert variant is kernels.kernel_with(kernels.flash2_forward_kernel,
                                          key_end=ek.key_end_all_tiles)  # cached
    assert variant.fn.__globals__["key_end"] is ek.key_end_all_tiles
    assert kernels.flash2_forward_kernel.fn.__globals__["key_end"] is kernels.key_end
    with pytest.raises(ValueError, match="calls no helper named softmax"):
        kernels.kernel_with(kernels.flash2_forward_kernel, softmax=ek.key_end_all_tiles)


# ---- 10.1 the inner loop -----------------------------------------------------------------------

STEP = kernels.online_softmax_step


def test_step_accepts_the_library_step():
    fb = ex.check_online_softmax_step(STEP)
    assert fb.passed, text(fb)
    assert "float16" in text(fb) and "causal" in text(fb)


def test_step_not_attempted(piece):
    todo = piece(STEP, ("    m_new = tl.maximum", "    raise NotImplementedError\n    m_new = "
                        "tl.maximum"))
    assert ex.check_online_softmax_step(todo).problems == [NOT_ATTEMPTED]


@pytest.mark.parametrize(("swaps", "phrases"), [
    ([("tl.exp2(S_ij", "tl.exp(S_ij"), ("tl.exp2(m_i", "tl.exp(m_i")],
     ["use tl.exp2, not tl.exp"]),
    ([("tl.exp2(S_ij", "tl.exp(S_ij")], ["P_ij uses tl.exp"]),
    ([("tl.exp2(m_i", "tl.exp(m_i")], ["alpha uses tl.exp"]),
    ([("return m_new, l_i, acc", "return m_i, l_i, acc")],
     ["m_i wrong: you returned the old m_i: return m_new"]),
    ([("alpha[:, None] * acc +", "acc +")], ["acc was not rescaled"]),
    ([("alpha * l_i +", "l_i +")], ["l_i was not rescaled"]),
    ([("tl.exp2(m_i - m_new)", "tl.exp2(m_new - m_i)")], ["alpha is tl.exp2(m_i - m_new)"]),
    ([("S_ij - m_new[:, None]", "S_ij - m_i[:, None]")], ["P_ij must subtract the new maximum"]),
    ([("tl.sum(P_ij, 1)", "tl.sum(P_ij, 0)")], ["a row's sum is tl.sum(P_ij, 1)"]),
    ([("tl.max(S_ij, 1)", "tl.max(S_ij, 0)")], ["a row's maximum is tl.max(S_ij, 1)"]),
    ([("tl.maximum(m_i, tl.max(S_ij, 1))", "tl.max(S_ij, 1)")],
     ["m_new forgot the earlier tiles"]),
    ([("    return m_new, l_i, acc", "    acc = acc / l_i[:, None]\n    return m_new, l_i, acc")],
     ["keep acc unnormalised"]),
    ([("P_ij.to(V_j.dtype)", "P_ij")],
     ["float16", "Both operands must be same dtype", "P_ij.to(V_j.dtype)"]),
], ids=["exp", "exp-in-P", "exp-in-alpha", "old-m", "no-acc-rescale", "no-l-rescale",
        "alpha-inverted", "P-old-max", "sum-axis-0", "max-axis-0", "tile-max-only",
        "normalised-acc", "no-cast"])
def test_step_names_each_mistake(piece, swaps, phrases):
    assert_fails_with(ex.check_online_softmax_step(piece(STEP, *swaps)), *phrases)


# ---- 10.2 causal tile skipping ---------------------------------------------------------------

END = kernels.key_end


def test_key_end_accepts_the_library_key_end():
    fb = ex.check_key_end(END)
    assert fb.passed, text(fb)
    assert "15 key tiles visited of 25" in text(fb)
    if CAPS.mode == "interpreter":
        assert "B_r x B_c = 4 x 1" in text(fb) and "B_r x B_c = 1 x 16" in text(fb)


def test_key_end_refuses_visiting_every_tile():
    assert_fails_with(ex.check_key_end(ek.key_end_all_tiles),
                      "returned 70, expected 16: correct, but the tiles after the block's last "
                      "row", "the same mistake")


@pytest.mark.parametrize(("swaps", "phrases"), [
    ([("tl.minimum(N_K, i + B_r)", "tl.minimum(N_K, i + B_r - 1)")],
     ["returned 15, expected 16: one key short", "range(0, end, B_c) stops before end"]),
    ([("tl.minimum(N_K, i + B_r)", "tl.minimum(N_K, i)")],
     ["stop at i + B_r (not before)", "the output holds NaN"]),
    ([("tl.minimum(N_K, i + B_r)", "i + B_r")], ["returned 80, expected 70: never past N_K"]),
    ([("    end = N_K\n", "    end = tl.minimum(N_K, i + B_r)\n")],
     ["without a mask every row sees every key, return N_K"]),
], ids=["off-by-one", "too-early", "past-N_K", "ignores-CAUSAL"])
def test_key_end_names_each_mistake(piece, swaps, phrases):
    assert_fails_with(ex.check_key_end(piece(END, *swaps)), *phrases)


@interpreter_only
def test_the_off_by_one_key_end_changes_the_output_only_with_narrow_tiles(piece):
    """i + B_r - 1 as the end visits the same tiles as i + B_r when B_c >= 2 (no tile starts
    at an odd key): the kernel's output shows it only with tiles of one key."""
    fb = ex.check_key_end(piece(END, ("tl.minimum(N_K, i + B_r)",
                                      "tl.minimum(N_K, i + B_r - 1)")))
    assert "ok in the kernel, n_q=70, n_k=70, d=16, causal, float32, B_r x B_c = 16 x 16" in (
        text(fb))
    assert "B_r x B_c = 4 x 1: wrong output" in text(fb)


# ---- 10.3 the boundary mask ------------------------------------------------------------------

VISIBLE = kernels.visible_keys


def test_visible_keys_accepts_the_library_mask_and_finds_the_seeded_bug():
    assert ex.check_visible_keys(VISIBLE).passed
    fb = ex.check_visible_keys(ek.visible_keys_with_bug)
    assert_fails_with(fb, "count as keys with score 0: require cols < N_K",
                      "right when n_k is a multiple of B_c, wrong otherwise")
    # the bug hides where the causal mask covers the padding: square causal attention
    assert "ok in the kernel, n_q=45, n_k=45, d=16, causal" in text(fb)


@pytest.mark.parametrize(("swaps", "phrases"), [
    ([("cols[None, :] < N_K", "cols[None, :] <= N_K")],
     ["key N_K = 45 is counted: cols <= N_K lets in one key past the end"]),
    ([("cols[None, :] <= rows[:, None]", "cols[None, :] < rows[:, None]")],
     ["j <= i, not j < i", "the output holds NaN"]),
    ([("cols[None, :] <= rows[:, None]", "cols[None, :] >= rows[:, None]")],
     ["the causal mask is reversed"]),
    ([("    if CAUSAL:\n        visible = visible & (cols[None, :] <= rows[:, None])\n", "")],
     ["the causal mask is missing"]),
    ([("    if CAUSAL:\n        visible = visible & (", "    visible = visible & (")],
     ["without CAUSAL every row sees every key"]),
], ids=["le-N_K", "strict", "reversed", "no-causal", "always-causal"])
def test_visible_keys_names_each_mistake(piece, swaps, phrases):
    fb = ex.check_visible_keys(piece(VISIBLE, *swaps))
    assert_fails_with(fb, *phrases)
    if swaps[0][1] != "cols[None, :] <= N_K":  # only a mask wrong at n_k says so
        assert "right when n_k is a multiple of B_c" not in text(fb)


# ---- 10.4 a softmax kernel -------------------------------------------------------------------

def test_softmax_accepts_the_books_solution(answer):
    fb = ex.check_softmax_kernel(answer("ex-gpu-softmax").softmax_kernel)
    assert fb.passed, text(fb)
    assert "3 rows of 1 (BLOCK=1)" in text(fb) and "3000" in text(fb)


def test_softmax_not_attempted_and_not_a_kernel(answer):
    todo = answer("ex-gpu-softmax", ("    r = tl.program_id(0)",
                                     "    raise NotImplementedError\n    r = tl.program_id(0)"))
    assert ex.check_softmax_kernel(todo.softmax_kernel).problems == [NOT_ATTEMPTED]
    plain = answer("ex-gpu-softmax", ("@triton.jit\n", ""))
    assert_fails_with(ex.check_softmax_kernel(plain.softmax_kernel),
                      "not a Triton kernel: put @triton.jit")


@pytest.mark.parametrize(("swaps", "phrases"), [
    ([('other=float("-inf")', "other=0.0")],
     ["the 6 padding entries of a row counted", "other=-float('inf')"]),
    ([(', other=float("-inf")', "")], ["padding entries of a row counted"]),
    ([("e / tl.sum(e, 0)", "e")], ["not 1: divide the exponentials by their sum"]),
    ([("tl.exp(x - tl.max(x, 0))", "tl.exp(x)")],
     ["values up to about 3000", "subtract the row's maximum"]),
], ids=["padding-0", "padding-default", "not-normalised", "no-max"])
def test_softmax_names_each_mistake(answer, swaps, phrases):
    fb = ex.check_softmax_kernel(answer("ex-gpu-softmax", *swaps).softmax_kernel)
    assert_fails_with(fb, *phrases)


@interpreter_only
@pytest.mark.parametrize(("swaps", "phrases"), [
    ([(', mask=ok, other=float("-inf")', "")],
     ["read X[0, 10], past the end of its row of 10: mask the load (mask=cols < n_cols)"]),
    ([(", mask=ok)", ")")], ["wrote Y[0, 10], past the end of its row of 10: mask the store"]),
    ([("X + r * stride_x", "X + r * n_cols")],
     ["program_id 1 read X[0, 10]: the rows of X are stride_x elements apart",
      "X + r * stride_x"]),
    ([("tl.program_id(0)", "tl.program_id(1)")],
     ["program_id 1 read row 0 of X, not row 1: r = tl.program_id(0)"]),
], ids=["no-load-mask", "no-store-mask", "stride", "program-id-axis"])
def test_softmax_names_each_memory_mistake(answer, swaps, phrases):
    fb = ex.check_softmax_kernel(answer("ex-gpu-softmax", *swaps).softmax_kernel)
    assert_fails_with(fb, *phrases)


# ---- 10.5 a FlashAttention kernel from its signature -------------------------------------------

def test_attention_kernel_accepts_the_books_solution(answer):
    solution = answer("ex-gpu-kernel")
    fb = ex.check_attention_kernel(solution.attention_kernel, solution.grid)
    assert fb.passed, text(fb)
    assert "N_Q=1, N_K=20" in text(fb) and "large scores" in text(fb)


def test_attention_kernel_not_attempted(answer):
    todo = answer("ex-gpu-kernel", ("    return (triton.cdiv(N_Q, B_r),)",
                                    "    raise NotImplementedError"))
    assert ex.check_attention_kernel(todo.attention_kernel, todo.grid).problems == [
        NOT_ATTEMPTED]


@pytest.mark.parametrize(("swaps", "phrases"), [
    ([("triton.cdiv(N_Q, B_r)", "N_Q // B_r")],
     ["= (2,): N_Q // B_r = 2 programs cover rows 0..31 only", "triton.cdiv(N_Q, B_r) = 3",
      "cover no row"]),
    ([("triton.cdiv(N_Q, B_r)", "N_Q")], ["one program per row, but each program takes a block"]),
    ([('S_ij = tl.where(cols[None, :] < N_K, S_ij * qk_scale,\n                        '
       'float("-inf"))', "S_ij = S_ij * qk_scale")],
     ["the keys past N_K (the rest of the last tile, loaded as zeros) counted"]),
    ([("tl.exp2(S_ij", "tl.exp(S_ij"), ("tl.exp2(m_i", "tl.exp(m_i")],
     ["the scores are in base 2, use tl.exp2"]),
    ([("alpha[:, None] * acc +", "acc +")], ["acc was not rescaled"]),
    ([("alpha * l_i +", "l_i +")], ["l_i was not rescaled"]),
    ([("acc / l_i[:, None], mask", "acc, mask")], ["divide acc by l_i once, after the loop"]),
    ([("S_ij * qk_scale", "S_ij")], ["multiply the scores by qk_scale"]),
    ([("tl.trans(K_j)", "K_j")],
     ["K_j is (B_c, D), its transpose (D, B_c)", "is a tl.trans missing"]),
], ids=["grid-floor", "grid-per-row", "phantom-keys", "exp", "no-acc-rescale",
        "no-l-rescale", "no-division", "no-scale", "no-trans"])
def test_attention_kernel_names_each_mistake(answer, swaps, phrases):
    module = answer("ex-gpu-kernel", *swaps)
    assert_fails_with(ex.check_attention_kernel(module.attention_kernel, module.grid), *phrases)


@interpreter_only
@pytest.mark.parametrize(("swaps", "phrases"), [
    ([("mask=rows[:, None] < N_Q, other=0.0)", ")")],
     ["program_id 2 read Q[45, 0], but Q has rows 0 .. 44: mask the load (rows < N_Q)"]),
    ([("mask=cols[:, None] < N_K, other=0.0)  # (B_c, D)\n        V_j",
       ")  # (B_c, D)\n        V_j")],
     ["read K[70, 0], but K has rows 0 .. 69: mask the load (cols < N_K)"]),
    ([("acc / l_i[:, None], mask=rows[:, None] < N_Q)", "acc / l_i[:, None])")],
     ["program_id 2 wrote O[45, 0], but O has rows 0 .. 44: mask the store (rows < N_Q)"]),
    ([("tl.program_id(0) * B_r +", "tl.program_id(0) +")],
     ["program_id 1 read rows 1..16 of Q, expected 16..31: a program's first row is "
      "program_id * B_r"]),
    ([("rows[:, None] * stride_q", "rows[:, None] * D")],
     ["read Q[0, 16]: the rows of Q are stride_q elements apart, not 16",
      "Q + r * stride_q"]),
], ids=["no-Q-mask", "no-K-mask", "no-store-mask", "program-offset", "stride"])
def test_attention_kernel_names_each_memory_mistake(answer, swaps, phrases):
    module = answer("ex-gpu-kernel", *swaps)
    assert_fails_with(ex.check_attention_kernel(module.attention_kernel, module.grid), *phrases)


def test_checkers_say_plainly_when_the_kernels_cannot_run(monkeypatch):
    monkeypatch.setattr(ex, "_gpu_unavailable", lambda: "torch is not installed")
    for check, args in ((ex.check_online_softmax_step, (STEP,)), (ex.check_key_end, (END,)),
                        (ex.check_visible_keys, (VISIBLE,)),
                        (ex.check_softmax_kernel, (END,)),
                        (ex.check_attention_kernel, (END, None))):
        fb = check(*args)
        assert not fb.passed
        assert fb.problems == ["this exercise runs a Triton kernel, which cannot run here: "
                               "torch is not installed"]


def test_attention_kernel_without_a_grid_is_checked_on_the_right_one(answer):
    solution = answer("ex-gpu-kernel")
    fb = ex.check_attention_kernel(solution.attention_kernel)
    assert_fails_with(fb, "grid: pass your launch grid too")
    assert "N_Q=45, N_K=70, D=16, B_r x B_c = 16 x 32: correct" in text(fb)


def test_a_plain_function_is_called_once_and_named(answer):
    def crashes(*args):
        raise IndexError("boom")

    assert_fails_with(ex.check_softmax_kernel(crashes), "your function raised IndexError: boom",
                      "not a Triton kernel")
    assert ex.check_softmax_kernel(lambda *args: None).problems[0].endswith(
        "this is not a Triton kernel: put @triton.jit on the line before its def")


# ---- in the grader: the learner's code runs on its own side ------------------------------------

class _Sandbox:
    """The grader's sandbox in one process: a checker's learner-side helper
    (flashlib.book.exercises.learner_side) gets its arguments through the judge's pickling,
    runs with the learner's own object, and its result and errors come back through the
    wire's plain-data encoding (grading.rpc), as grading/worker.py does."""

    def __init__(self, learner):
        self.objects = {0: learner}
        self.helped: list[str] = []

    def helper(self, module, qualname, args, kwargs):
        from grading import rpc

        self.helped.append(qualname)
        args, kwargs = rpc.loads(rpc.dumps((tuple(args), dict(kwargs)), []), self.objects,
                                 lambda ident: None)
        fn = importlib.import_module(module)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        try:
            result = getattr(fn, "__wrapped__", fn)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - back to the judge as the worker sends it
            raise rpc.exception_from_tree(rpc.exception_tree(err)) from None
        return rpc.decode(*rpc.encode(result))


def _remote(sandbox):
    from grading import rpc

    return rpc.RemoteCallable(0, sandbox, {"type": "JITFunction"})


@interpreter_only
def test_kernels_run_where_the_learners_code_is(answer):
    """In the grader the judge holds a handle on the learner's function: every launch of it
    (the probes, the library kernel with the learner's piece, a whole kernel under the memory
    watch) runs on the learner's side, and what the checker needs comes back as plain data."""
    sandbox = _Sandbox(END)
    assert ex.check_key_end(_remote(sandbox)).passed
    assert {"_probe", "_run_forward"} <= set(sandbox.helped)
    sandbox = _Sandbox(answer("ex-gpu-softmax").softmax_kernel)
    fb = ex.check_softmax_kernel(_remote(sandbox))
    assert fb.passed, text(fb)
    assert set(sandbox.helped) == {"_watched_launch"}
    wrong = answer("ex-gpu-softmax", ("X + r * stride_x", "X + r * n_cols")).softmax_kernel
    assert_fails_with(ex.check_softmax_kernel(_remote(_Sandbox(wrong))),
                      "program_id 1 read X[0, 10]: the rows of X are stride_x elements apart")
    todo = answer("ex-gpu-softmax", ("    r = tl.program_id(0)",
                                     "    raise NotImplementedError\n    r = tl.program_id(0)"))
    assert ex.check_softmax_kernel(_remote(_Sandbox(todo.softmax_kernel))).problems == [
        NOT_ATTEMPTED]
