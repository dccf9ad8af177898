"""What the tests share: the independent references the numerics are checked against, random
problems, and the exercise-checker helpers.  Import it as ``from tests.helpers import ...``.

The reference attention below is deliberately tiny and written from the definition (explicit
boolean visibility mask, float64, one softmax per row); it shares no code with ``flashlib``.
``torch_attention`` is the same definition in torch, used for autograd.  ``plain_attention``
is the baseline of flash-attn's accuracy rule (flashlib.core.accuracy.assert_error_within):
standard attention in the inputs' own precision.
"""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises import Feedback
from flashlib.book.exercises.registry import learner_copy  # noqa: F401  (the tests use it)
from flashlib.core.accuracy import FLOOR, assert_error_within, error_floor  # noqa: F401

try:
    import torch
except ImportError:  # pragma: no cover - torch is pinned in requirements.txt
    torch = None

DTYPES = (np.float16, np.float32, np.float64)

# flash-attn's accuracy rule, "err <= max(2 err(plain attention in the same dtype), floor)",
# both against a float64 reference, is one helper: flashlib.core.accuracy.assert_error_within;
# its module docstring gives the floor conventions (FLOOR, error_floor), which the
# low-precision tests use unchanged (they import them from here).  ``plain_attention`` is the
# baseline.


def visible_mask(n_q: int, n_k: int, causal=False, mask=None) -> np.ndarray:
    """Explicit boolean (..., n_q, n_k) matrix: True where query row i may attend to key j."""
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if causal is False:
        vis = np.ones((n_q, n_k), dtype=bool)
    elif causal is True or causal == "top_left":
        vis = j <= i
    elif causal == "bottom_right":
        vis = j <= i + (n_k - n_q)
    else:
        raise AssertionError(f"test bug: causal={causal!r}")
    if mask is not None:
        vis = vis & np.asarray(mask, dtype=bool)
    return vis


def compute_dtype(dtype) -> np.dtype:
    """What flashlib computes in: float32 for float16 inputs, else the input dtype."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def default_scale(d: int, dtype) -> float:
    """The spec's default scale: 1/sqrt(d) in the compute dtype (float32 for float16 inputs:
    rounding the scale itself to float16 would cost up to 2.4e-4 of relative error)."""
    return float(np.asarray(1.0 / np.sqrt(d) if d else 1.0).astype(compute_dtype(dtype)))


def reference_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """float64 reference: returns (o, lse); empty rows give o = 0 and lse = -inf."""
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    if scale is None:
        scale = default_scale(d, dtype)
    s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
    vis = np.broadcast_to(visible_mask(n_q, n_k, causal, mask), s.shape)
    row_has_key = vis.any(axis=-1, keepdims=True)
    m = np.max(np.where(vis, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(row_has_key, m, 0.0)
    e = np.where(vis, np.exp(np.where(vis, s, m) - m), 0.0)
    l = e.sum(axis=-1, keepdims=True)  # noqa: E741
    l_safe = np.where(row_has_key, l, 1.0)
    o = np.matmul(e / l_safe, v)
    lse = np.where(row_has_key, m + np.log(l_safe), -np.inf)[..., 0]
    return o, lse


def plain_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """The baseline of flash-attn's accuracy rule: standard attention in the inputs' own
    precision, as PyTorch runs it on a GPU (flash-attn's ``attention_ref(upcast=False,
    reorder_ops=True)``): q scaled first, every operation accumulated in float32 and its result
    rounded to the input dtype (S, P, O), the softmax computed in float32.  For float32 inputs
    this is plain float32 attention; for float16 it is what "float16 attention" means on a GPU.
    Rows that see no key give 0."""
    dtype = np.asarray(q).dtype
    c = np.float32 if dtype in (np.float16, np.float32) else np.float64

    def rnd(x):
        return np.asarray(x, c).astype(dtype).astype(c)

    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    q_s = rnd(np.asarray(q, c) * c(scale))
    s = rnd(q_s @ np.swapaxes(np.asarray(k, c), -1, -2))
    vis = np.broadcast_to(visible_mask(n_q, n_k, causal, mask), s.shape)
    has_key = vis.any(axis=-1, keepdims=True)
    s = np.where(vis, s, -np.inf)
    m = np.where(has_key, s.max(axis=-1, keepdims=True, initial=-np.inf), 0)
    e = np.exp(s - m)
    p = rnd(e / np.where(has_key, e.sum(axis=-1, keepdims=True), 1))
    return (p @ np.asarray(v, c)).astype(dtype)


def plain_attention_backward(q, k, v, do, *, causal=False, mask=None, scale=None):
    """The backward of :func:`plain_attention` as autograd runs it in the inputs' precision:
    each of P, dV, dP, dS, dQ, dK accumulated in float32 and rounded to the input dtype."""
    dtype = np.asarray(q).dtype
    c = np.float32 if dtype in (np.float16, np.float32) else np.float64

    def rnd(x):
        return np.asarray(x, c).astype(dtype).astype(c)

    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    q_s = rnd(np.asarray(q, c) * c(scale))
    k_c, v_c, do_c = (np.asarray(x, c) for x in (k, v, do))
    s = rnd(q_s @ np.swapaxes(k_c, -1, -2))
    vis = np.broadcast_to(visible_mask(n_q, n_k, causal, mask), s.shape)
    has_key = vis.any(axis=-1, keepdims=True)
    s = np.where(vis, s, -np.inf)
    m = np.where(has_key, s.max(axis=-1, keepdims=True, initial=-np.inf), 0)
    e = np.exp(s - m)
    p = rnd(e / np.where(has_key, e.sum(axis=-1, keepdims=True), 1))
    dv = rnd(np.swapaxes(p, -1, -2) @ do_c)
    dp = rnd(do_c @ np.swapaxes(v_c, -1, -2))
    ds = rnd(p * (dp - np.sum(dp * p, axis=-1, keepdims=True)))  # softmax backward, float32
    dq = rnd(rnd(ds @ k_c) * c(scale))
    dk = rnd(np.swapaxes(ds, -1, -2) @ q_s)
    return tuple(x.astype(dtype) for x in (dq, dk, dv))


def logits(q, k, scale=None) -> np.ndarray:
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if scale is None:
        scale = 1.0 / np.sqrt(q64.shape[-1])
    return scale * np.matmul(q64, np.swapaxes(k64, -1, -2))


def torch_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """The same definition in torch (float64, autograd-friendly, zero rows for empty rows)."""
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    vis = torch.from_numpy(np.ascontiguousarray(visible_mask(n_q, n_k, causal, mask)))
    s = scale * (q @ k.transpose(-1, -2))
    vis = vis.expand(s.shape)
    has_key = vis.any(dim=-1, keepdim=True)
    s = s.masked_fill(~vis, float("-inf"))
    s = torch.where(has_key, s, torch.zeros((), dtype=s.dtype))
    p = torch.softmax(s, dim=-1) * has_key
    return p @ v


def torch_grads(q, k, v, do, *, causal=False, mask=None, scale=None):
    """(o, dq, dk, dv) by torch autograd in float64."""
    if scale is None:
        scale = default_scale(q.shape[-1], q.dtype)
    tq, tk, tv = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    o = torch_attention(tq, tk, tv, causal=causal, mask=mask, scale=scale)
    o.backward(torch.tensor(np.asarray(do, np.float64)))
    return (o.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())


def make_qkv(rng, lead, n_q, n_k, d, d_v=None, dtype=np.float64, logit_scale=None):
    """Random q, k, v in ``dtype``; with ``logit_scale`` q is rescaled so max|q k^T / sqrt d|
    equals it (the inputs are cast first, so the reference sees exactly the same numbers)."""
    d_v = d if d_v is None else d_v
    q = rng.standard_normal((*lead, n_q, d))
    k = rng.standard_normal((*lead, n_k, d))
    v = rng.standard_normal((*lead, n_k, d_v))
    if logit_scale is not None:
        s_max = np.max(np.abs(logits(q, k)))
        if s_max > 0:
            q = q * (logit_scale / s_max)
    return tuple(np.asarray(x, dtype=dtype) for x in (q, k, v))


def make_mask(rng, kind, lead, n_q, n_k):
    """None, a random mask with some fully masked rows, a key-padding mask, or all False."""
    if kind is None:
        return None
    if kind == "random":
        mask = rng.random((*lead, n_q, n_k)) < 0.6
        if n_q > 1:
            mask[..., 0, :] = False  # a fully masked row
        return mask
    if kind == "rows":  # broadcast over leading dims, every other row empty
        mask = rng.random((n_q, n_k)) < 0.5
        mask[::2, :] = False
        return mask
    if kind == "key_padding":
        mask = np.ones((*lead, 1, n_k), dtype=bool)
        mask[..., 0, n_k - max(1, n_k // 3):] = False
        return mask
    if kind == "batch_padding":  # one padding per batch entry, broadcast over the heads axis
        mask = np.ones((*lead[:-1], 1, 1, n_k), dtype=bool)
        mask[..., n_k // 2:] = False
        mask.reshape(-1, n_k)[0] = True  # first batch entry unpadded
        return mask
    if kind == "none_visible":
        return np.zeros((n_q, n_k), dtype=bool)
    raise AssertionError(f"test bug: mask kind {kind!r}")


def max_err(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)))




# --- the exercise checkers' tests -------------------------------------------------------------


def text(fb: Feedback) -> str:
    return repr(fb)


def assert_fails_with(fb: Feedback, *phrases: str) -> None:
    assert not fb.passed, text(fb)
    for phrase in phrases:
        assert phrase in text(fb), (phrase, text(fb))


def not_attempted(*args):
    raise NotImplementedError


def crashing(*args):
    raise ValueError("oops")


def student_notebook(chapter, answers: dict[str, str]):
    """The student edition's notebook of ``chapter`` (book/NAME.md) with the code of the
    exercise cells ``answers`` names (``{"3.2": code}``) replaced: a student's hand-in."""
    import copy

    import nbformat

    from grading import chapters
    from tools import notebooks

    nb = copy.deepcopy(nbformat.read(notebooks.target(chapter, student=True), as_version=4))
    cells = chapters.exercise_cells(nb)
    for number, source in answers.items():
        (index,) = cells[number]
        nb.cells[index].source = source.strip("\n")
    return nb


def solution_code(chapter: str, label: str) -> str:
    """The Python code blocks (```python) of exercise ``label``'s solution in book/<chapter>.md,
    joined: the book's own answer, for the checker tests to run (never a pasted copy)."""
    from pathlib import Path

    text_ = (Path(__file__).resolve().parents[1] / "book" / f"{chapter}.md").read_text()
    start = text_.index(f"```{{solution-start}} {label}\n")
    body = text_[start: text_.index("```{solution-end}", start)]
    blocks = body.split("```python\n")[1:]
    if not blocks:
        raise AssertionError(f"test bug: no ```python block in the solution of {label}")
    return "\n\n".join(block.split("\n```", 1)[0] for block in blocks)


def import_code(source: str, folder, name: str):
    """``source`` written to folder/name.py and imported as a module (Triton reads a kernel's
    source from its file: code run by exec has none)."""
    import importlib.util

    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def book_solution(chapter: str, label: str) -> dict:
    """The namespace of the book's solution of the exercise ``label`` in book/<chapter>.md
    (its ```python blocks, `solution_code`), run with numpy imported as np, as a reader would
    paste them."""
    namespace: dict = {"np": np}
    code = solution_code(chapter, label)
    exec(compile(code, f"<solution {label}>", "exec"), namespace)  # noqa: S102
    return namespace
