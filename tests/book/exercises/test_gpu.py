"""The GPU chapter's checkers (flashlib.book.exercises.gpu), in Triton's interpreter: each accepts
the right answer (flashlib's helper for 10.1-10.3, the book's solution for 10.4-10.5).  Each
common mistake, found by running it, is the right answer with one change, declared as text in
flashlib/book/exercises/mistakes/gpu.py and run by test_declared_mistakes.py (which fails if
the right answer stops containing the text a mistake replaces)."""

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


# ---- 10.2 causal tile skipping ---------------------------------------------------------------

END = kernels.key_end


def test_key_end_accepts_the_library_key_end():
    fb = ex.check_key_end(END)
    assert fb.passed, text(fb)
    assert "15 key tiles visited of 25" in text(fb)
    if CAPS.mode == "interpreter":
        assert "B_r x B_c = 4 x 1" in text(fb) and "B_r x B_c = 1 x 16" in text(fb)


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


def test_visible_keys_accepts_the_library_mask():
    assert ex.check_visible_keys(VISIBLE).passed


# ---- 10.4 a softmax kernel -------------------------------------------------------------------

def test_softmax_accepts_the_books_solution(answer):
    fb = ex.check_softmax_kernel(answer("ex-gpu-softmax").softmax_kernel)
    assert fb.passed, text(fb)
    assert "3 rows of 1 (BLOCK=1)" in text(fb) and "3000" in text(fb)


def test_softmax_not_attempted(answer):
    todo = answer("ex-gpu-softmax", ("    r = tl.program_id(0)",
                                     "    raise NotImplementedError\n    r = tl.program_id(0)"))
    assert ex.check_softmax_kernel(todo.softmax_kernel).problems == [NOT_ATTEMPTED]


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


def test_checkers_say_plainly_when_the_kernels_cannot_run(monkeypatch):
    monkeypatch.setattr(ex, "_gpu_unavailable", lambda: "torch is not installed")
    for check, args in ((ex.check_online_softmax_step, (STEP,)), (ex.check_key_end, (END,)),
                        (ex.check_visible_keys, (VISIBLE,)),
                        (ex.check_softmax_kernel, (END,)),
                        (ex.check_attention_kernel, (END, None)),
                        (ex.check_delta_kernel, (END,)), (ex.check_dkdv_kernel, (END,)),
                        (ex.check_dq_kernel, (END,)), (ex.check_stage_bounds, (END,))):
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


# ---- 10.6-10.9 the backward's kernels, the two-stage causal kernel ---------------------------

@pytest.mark.parametrize(("label", "name", "first_line"), [
    ("ex-gpu-delta", "delta_kernel", "    rows = tl.program_id(0) * B_r"),
    ("ex-gpu-dkdv", "dkdv_kernel", "    cols = tl.program_id(0) * B_c"),
    ("ex-gpu-dq", "dq_kernel", "    rows = tl.program_id(0) * B_r")])
def test_backward_kernels_not_attempted(answer, label, name, first_line):
    todo = answer(label, (first_line, "    raise NotImplementedError\n" + first_line))
    check = {"delta_kernel": ex.check_delta_kernel, "dkdv_kernel": ex.check_dkdv_kernel,
             "dq_kernel": ex.check_dq_kernel}[name]
    assert check(getattr(todo, name)).problems == [NOT_ATTEMPTED]


def test_backward_models_equal_torch_autograd():
    """The checker's float64 model of the kernels (used to name a mistake) is, without a
    mistake, torch autograd's gradient."""
    q, k, v, do = ex._backward_inputs(45, 70, 16, 0)
    ref = ex._autograd(q, k, v, do)
    model = ex._backward_model(q, k, v, do, (16, 16), "right")
    for name in ("dQ", "dK", "dV"):
        assert np.allclose(model[name], ref[name], rtol=1e-10, atol=1e-12)
    one_block = ex._backward_model(q[:16], k[:16], v[:16], do[:16], (16, 16), "last_block")
    right = ex._backward_model(q[:16], k[:16], v[:16], do[:16], (16, 16), "right")
    assert all(np.array_equal(one_block[n], right[n]) for n in right)


@interpreter_only
def test_backward_kernels_run_where_the_learners_code_is(answer):
    sandbox = _Sandbox(answer("ex-gpu-dq").dq_kernel)
    fb = ex.check_dq_kernel(_remote(sandbox))
    assert fb.passed, text(fb)
    assert set(sandbox.helped) == {"_watched_launch"}
    sandbox = _Sandbox(answer("ex-gpu-delta").delta_kernel)
    assert ex.check_delta_kernel(_remote(sandbox)).passed
    assert set(sandbox.helped) == {"_watched_launch"}  # D's check in the backward: data
    from flashlib.gpu.staged_kernels import stage_bounds

    sandbox = _Sandbox(stage_bounds)
    assert ex.check_stage_bounds(_remote(sandbox)).passed
    assert set(sandbox.helped) == {"_probe", "_run_causal"}
