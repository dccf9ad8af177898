"""The forward kernel with its three steps as pluggable functions, for the chapter's exercises.

:func:`exercise_forward_kernel` is :func:`flashlib.gpu.kernels.flash2_forward_kernel` cut
into the pieces a reader writes, each a ``@triton.jit`` function passed in as a ``tl.constexpr``
argument (Triton inlines it):

- ``KEY_END(i, B_r, N_K, CAUSAL)``: where the loop over key blocks stops (causal tile
  skipping): :func:`key_end`;
- ``VISIBLE(rows, cols, N_K, CAUSAL)``: which scores of the tile are real keys the row may see
  (the boundary and causal masks): :func:`visible_keys`;
- ``STEP(S_ij, V_j, m_i, l_i, acc)``: the online softmax update of one tile (the inner loop's
  body): :func:`online_softmax_step`.

Each piece assigns and ends in a single ``return`` (the form the kernels' own ``hi`` uses, which
compiled Triton accepts whatever the constexpr branch).  The kernel also counts the key tiles
each program visits (``Visits``), so a checker can tell skipped tiles from wasted ones.
Tensors are contiguous (B*H, N, D) with D a power of two, and float32 products are exact
(``input_precision="ieee"``).  :func:`run_exercise_kernel` launches it from numpy arrays;
``flashlib.book.exercises.gpu`` checks a reader's pieces with it.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flashlib.core.constants import LOG2E
from flashlib.gpu.device import require_kernels
from flashlib.gpu.grid import cdiv

__all__ = ["key_end", "visible_keys", "online_softmax_step", "key_end_all_tiles",
           "visible_keys_with_bug", "exercise_forward_kernel", "run_exercise_kernel"]


@triton.jit
def key_end(i, B_r, N_K, CAUSAL: tl.constexpr):
    """Where the loop over keys stops for the query block starting at row i."""
    end = N_K
    if CAUSAL:  # rows i .. i + B_r - 1 see no key after i + B_r - 1
        end = tl.minimum(N_K, i + B_r)
    return end


@triton.jit
def visible_keys(rows, cols, N_K, CAUSAL: tl.constexpr):
    """(B_r, B_c): True where query row ``rows[r]`` may see key ``cols[c]``."""
    visible = cols[None, :] < N_K  # the last tile runs past the end of the keys
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None])
    return visible


@triton.jit
def online_softmax_step(S_ij, V_j, m_i, l_i, acc):
    """One tile of the online softmax: S_ij (B_r, B_c) base-2 scores (-inf where hidden),
    V_j (B_c, D); m_i, l_i (B_r,) and acc (B_r, D) in float32 -> their values after it."""
    m_new = tl.maximum(m_i, tl.max(S_ij, 1))
    P_ij = tl.exp2(S_ij - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = alpha * l_i + tl.sum(P_ij, 1)
    acc = alpha[:, None] * acc + tl.dot(P_ij.to(V_j.dtype), V_j, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def key_end_all_tiles(i, B_r, N_K, CAUSAL: tl.constexpr):
    """Exercise start: every program visits every key tile, causal or not."""
    return N_K


@triton.jit
def visible_keys_with_bug(rows, cols, N_K, CAUSAL: tl.constexpr):
    """Exercise start: a boundary mask with a bug."""
    visible = cols[None, :] >= 0
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None])
    return visible


@triton.jit
def exercise_forward_kernel(
    Q, K, V, O, Visits, N_Q, N_K, qk_scale,  # Q, O: (B*H, N_Q, D); K, V: (B*H, N_K, D)
    B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
    KEY_END: tl.constexpr, VISIBLE: tl.constexpr, STEP: tl.constexpr,
):
    i = tl.program_id(0) * B_r
    bh = tl.program_id(1)
    rows = i + tl.arange(0, B_r)
    dims = tl.arange(0, D)
    Q_i = tl.load(Q + (bh * N_Q + rows[:, None]) * D + dims[None, :],
                  mask=rows[:, None] < N_Q, other=0.0)
    m_i = tl.full([B_r], float("-inf"), tl.float32)
    l_i = tl.zeros([B_r], tl.float32)
    acc = tl.zeros([B_r, D], tl.float32)
    visits = 0
    for j in range(0, KEY_END(i, B_r, N_K, CAUSAL), B_c):
        cols = j + tl.arange(0, B_c)
        K_j = tl.load(K + (bh * N_K + cols[:, None]) * D + dims[None, :],
                      mask=cols[:, None] < N_K, other=0.0)
        V_j = tl.load(V + (bh * N_K + cols[:, None]) * D + dims[None, :],
                      mask=cols[:, None] < N_K, other=0.0)
        S_ij = tl.dot(Q_i, tl.trans(K_j), input_precision="ieee") * qk_scale
        S_ij = tl.where(VISIBLE(rows, cols, N_K, CAUSAL), S_ij, float("-inf"))
        m_i, l_i, acc = STEP(S_ij, V_j, m_i, l_i, acc)
        visits += 1
    tl.store(O + (bh * N_Q + rows[:, None]) * D + dims[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=rows[:, None] < N_Q)
    tl.store(Visits + bh * tl.num_programs(0) + tl.program_id(0), visits)


def run_exercise_kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                        blocks: tuple[int, int] = (16, 16), key_end_fn=None, visible_fn=None,
                        step_fn=None) -> tuple[np.ndarray, np.ndarray]:
    """Launch :func:`exercise_forward_kernel` with these pieces (the reference ones where None).

    q: (BH, n_q, D), k, v: (BH, n_k, D) float16 or float32 numpy arrays, D a power of two
    >= 16 -> o: (BH, n_q, D) in q's dtype, and visits: (BH, ceil(n_q / B_r)) int32, the key
    tiles each program visited.  Scale 1/sqrt(D).
    """
    caps = require_kernels()
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to(caps.device) for x in (q, k, v))
    BH, N_Q, D = tq.shape
    N_K = tk.shape[1]
    B_r, B_c = blocks
    o = torch.empty_like(tq)
    visits = torch.zeros((BH, cdiv(N_Q, B_r)), dtype=torch.int32, device=tq.device)
    exercise_forward_kernel[(cdiv(N_Q, B_r), BH)](
        tq, tk, tv, o, visits, N_Q, N_K, LOG2E / float(np.sqrt(D)),
        B_r=B_r, B_c=B_c, D=D, CAUSAL=bool(causal), KEY_END=key_end_fn or key_end,
        VISIBLE=visible_fn or visible_keys, STEP=step_fn or online_softmax_step)
    return o.cpu().numpy(), visits.cpu().numpy()
