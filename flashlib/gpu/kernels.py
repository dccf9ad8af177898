"""The Triton kernels: FlashAttention-2 forward and backward, written to be read.

Each kernel is the numpy teaching function of the same name with its outer loop replaced by a
launch grid: where :func:`flashlib.algorithms.flash2_forward` says ``for i in range(0, N_q, B_r)``,
the GPU starts one *program* per query block (and per batch x head), all at once, and each
program runs the inner loop over key blocks on its own.  A program works on whole *blocks*
(tiles) of values: ``tl.load`` of a (B_r, d) block of pointers brings Q_i on chip, ``tl.dot``
multiplies two blocks on the tensor cores, and ``m_i``, ``l_i`` and ``acc`` live in registers
for the whole loop.  Comments give the numpy line each kernel line implements.

The forward kernel calls three small ``@triton.jit`` helpers, the pieces the GPU chapter's
exercises ask for: :func:`key_end` (where the loop over key tiles stops: causal tile skipping),
:func:`visible_keys` (the boundary and causal mask of a tile) and :func:`online_softmax_step`
(the loop's body).  Triton inlines them.  :func:`kernel_with` makes the same kernel with other
helpers in their place: the chapter's checkers run a reader's piece inside the library kernel,
so the kernel is written once.

Layout: every tensor is a stack of heads, (B*H, N, d), addressed through a head stride and a
row stride (the last axis is contiguous); :mod:`flashlib.gpu.triton_attention` launches them.
Scores are kept in base 2: the scale is multiplied by log2(e) once (``qk_scale``), so that
``exp2`` replaces ``exp``; the logsumexp L is stored in natural-log units, like
:func:`flashlib.flash_attention`'s, and converted back to base 2 where the backward reads it.

The package sets ``TRITON_INTERPRET=1`` before this module is imported when no CUDA GPU is
present (:func:`flashlib.gpu.device.configure_triton`).  Triton reads it when ``@triton.jit``
decorates a function, that is when this module is imported: the kernels below then become
Python functions that run on CPU tensors, one program after another, in numpy.
"""

from __future__ import annotations

import types
from typing import Any

import triton
import triton.language as tl

from flashlib.core.constants import LN2, LOG2E

# Globals a kernel reads must be constexpr (compiled Triton refuses plain Python globals).
_LN2 = tl.constexpr(LN2)
_LOG2E = tl.constexpr(LOG2E)

__all__ = ["key_end", "visible_keys", "online_softmax_step", "flash2_forward_kernel",
           "flash2_backward_dkdv_kernel", "flash2_backward_dq_kernel", "kernel_with",
           "interpreted"]


@triton.jit
def key_end(i, B_r, N_K, CAUSAL: tl.constexpr):
    """Where the loop over key tiles stops (exclusive) for the query block of rows
    i .. i + B_r - 1: N_K, or with a causal mask the first key no row of the block sees."""
    end = N_K
    if CAUSAL:  # row r sees keys 0 .. r; the block's last row is i + B_r - 1
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
def online_softmax_step(S_ij, V_j, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One key tile of the online softmax.  S_ij (B_r, B_c): scores in base 2, -inf where
    hidden; V_j (B_c, D); m_i, l_i (B_r,), acc (B_r, D), float32 -> their values after it."""
    m_new = tl.maximum(m_i, tl.max(S_ij, 1))  # np.maximum(m_i, S_ij.max(axis=1))
    P_ij = tl.exp2(S_ij - m_new[:, None])  # np.exp(S_ij - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)  # np.exp(m_i - m_new)
    l_i = alpha * l_i + tl.sum(P_ij, 1)  # alpha * l_i + P_ij.sum(axis=1)
    acc = alpha[:, None] * acc + tl.dot(P_ij.to(V_j.dtype), V_j,
                                        input_precision=PRECISION)  # ... + P_ij @ V_j
    return m_new, l_i, acc


@triton.jit
def flash2_forward_kernel(
    Q, K, V, O, L,  # Q, O: (B*H, N_Q, d); K, V: (B*H, N_K, d); L: (B*H, N_Q), float32
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    N_Q, N_K, d, qk_scale,  # qk_scale = scale * log2(e): scores in base 2
    B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr,  # D: d rounded up to a power of 2
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,  # PRECISION: "ieee" (exact fp32) or "tf32"
):
    i = tl.program_id(0) * B_r  # `for i in range(0, N_q, B_r)`: this program's query block
    bh = tl.program_id(1)  # ... and its (batch, head)
    rows = i + tl.arange(0, B_r)  # (B_r,): the query rows i .. i + B_r - 1
    dims = tl.arange(0, D)  # (D,)
    row_ok, dim_ok = rows < N_Q, dims < d  # boundary masks: any N_Q, any d
    Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                  mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # Q[i : i + B_r]
    m_i = tl.full([B_r], float("-inf"), tl.float32)  # m_i = np.full(B_r, -np.inf)
    l_i = tl.zeros([B_r], tl.float32)  # l_i = np.zeros(B_r)
    acc = tl.zeros([B_r, D], tl.float32)  # O_i = np.zeros((B_r, d)), unnormalised
    for j in range(0, key_end(i, B_r, N_K, CAUSAL), B_c):  # causal: skip tiles above diagonal
        cols = j + tl.arange(0, B_c)  # (B_c,): the keys j .. j + B_c - 1
        kv_mask = (cols[:, None] < N_K) & dim_ok[None, :]
        K_j = tl.load(K + bh * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=kv_mask, other=0.0)  # K[j : j + B_c]
        V_j = tl.load(V + bh * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                      mask=kv_mask, other=0.0)  # V[j : j + B_c]
        S_ij = tl.dot(Q_i, tl.trans(K_j), input_precision=PRECISION) * qk_scale  # (B_r, B_c)
        S_ij = tl.where(visible_keys(rows, cols, N_K, CAUSAL), S_ij, float("-inf"))
        m_i, l_i, acc = online_softmax_step(S_ij, V_j, m_i, l_i, acc, PRECISION)
    O_i = acc / l_i[:, None]  # O_i / l_i[:, None]: the one division, at the end
    tl.store(O + bh * stride_oh + rows[:, None] * stride_on + dims[None, :],
             O_i.to(O.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    L_i = (m_i + tl.log2(l_i)) * _LN2  # m_i + np.log(l_i), from base 2 back to natural log
    tl.store(L + bh * N_Q + rows, L_i, mask=row_ok)


@triton.jit
def flash2_backward_dkdv_kernel(
    Q, K, V, dO, L, Delta, dK, dV,  # Q, dO: (B*H, N_Q, d); K, V, dK, dV: (B*H, N_K, d)
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
    stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
    N_Q, N_K, d, scale, qk_scale,  # L, Delta: (B*H, N_Q) float32, contiguous
    B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    j = tl.program_id(0) * B_c  # `for j in range(0, N_k, B_c)`: this program's key block
    bh = tl.program_id(1)
    cols = j + tl.arange(0, B_c)
    dims = tl.arange(0, D)
    col_ok, dim_ok = cols < N_K, dims < d
    kv_mask = col_ok[:, None] & dim_ok[None, :]
    K_j = tl.load(K + bh * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=kv_mask, other=0.0)  # K[j : j + B_c]
    V_j = tl.load(V + bh * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                  mask=kv_mask, other=0.0)  # V[j : j + B_c]
    dK_j = tl.zeros([B_c, D], tl.float32)  # accumulate on chip, written once
    dV_j = tl.zeros([B_c, D], tl.float32)
    lo = 0  # `for i in range(0, N_q, B_r)` ...
    if CAUSAL:  # ... but no query block that ends before key j: rows < j see none of K_j
        lo = (j // B_r) * B_r
    for i in range(lo, N_Q, B_r):
        rows = i + tl.arange(0, B_r)
        row_ok = rows < N_Q
        q_mask = row_ok[:, None] & dim_ok[None, :]
        Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                      mask=q_mask, other=0.0)
        dO_i = tl.load(dO + bh * stride_doh + rows[:, None] * stride_don + dims[None, :],
                       mask=q_mask, other=0.0)
        L_i = tl.load(L + bh * N_Q + rows, mask=row_ok, other=0.0) * _LOG2E  # to base 2
        D_i = tl.load(Delta + bh * N_Q + rows, mask=row_ok, other=0.0)
        S_ij = tl.dot(Q_i, tl.trans(K_j), input_precision=PRECISION) * qk_scale  # base 2
        visible = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        S_ij = tl.where(visible, S_ij, float("-inf"))  # hidden scores: P = exp2(-inf) = 0
        P_ij = tl.exp2(S_ij - L_i[:, None])  # np.exp(S_ij - L_i[:, None]): recomputed from L_i
        dV_j += tl.dot(tl.trans(P_ij).to(dO_i.dtype), dO_i,
                       input_precision=PRECISION)  # dV_j += P_ij.T @ dO_i
        dP_ij = tl.dot(dO_i, tl.trans(V_j), input_precision=PRECISION)  # dO_i @ V_j.T
        dS_ij = P_ij * (dP_ij - D_i[:, None])  # P_ij * (dP_ij - D_i[:, None])
        dK_j += tl.dot(tl.trans(dS_ij).to(Q_i.dtype), Q_i,
                       input_precision=PRECISION)  # dK_j += dS_ij.T @ Q_i (times scale below)
    tl.store(dK + bh * stride_dkh + cols[:, None] * stride_dkn + dims[None, :],
             (dK_j * scale).to(dK.dtype.element_ty), mask=kv_mask)
    tl.store(dV + bh * stride_dvh + cols[:, None] * stride_dvn + dims[None, :],
             dV_j.to(dV.dtype.element_ty), mask=kv_mask)


@triton.jit
def flash2_backward_dq_kernel(
    Q, K, V, dO, L, Delta, dQ,  # numpy's `dQ[i : i + B_r] += ...`, one program per query block
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
    stride_doh, stride_don, stride_dqh, stride_dqn,
    N_Q, N_K, d, scale, qk_scale,
    B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    i = tl.program_id(0) * B_r
    bh = tl.program_id(1)
    rows = i + tl.arange(0, B_r)
    dims = tl.arange(0, D)
    row_ok, dim_ok = rows < N_Q, dims < d
    q_mask = row_ok[:, None] & dim_ok[None, :]
    Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                  mask=q_mask, other=0.0)
    dO_i = tl.load(dO + bh * stride_doh + rows[:, None] * stride_don + dims[None, :],
                   mask=q_mask, other=0.0)
    L_i = tl.load(L + bh * N_Q + rows, mask=row_ok, other=0.0) * _LOG2E
    D_i = tl.load(Delta + bh * N_Q + rows, mask=row_ok, other=0.0)
    dQ_i = tl.zeros([B_r, D], tl.float32)
    for j in range(0, key_end(i, B_r, N_K, CAUSAL), B_c):  # the forward's key tiles
        cols = j + tl.arange(0, B_c)
        col_ok = cols < N_K
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        K_j = tl.load(K + bh * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=kv_mask, other=0.0)
        V_j = tl.load(V + bh * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                      mask=kv_mask, other=0.0)
        S_ij = tl.dot(Q_i, tl.trans(K_j), input_precision=PRECISION) * qk_scale
        visible = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        P_ij = tl.exp2(tl.where(visible, S_ij, float("-inf")) - L_i[:, None])
        dP_ij = tl.dot(dO_i, tl.trans(V_j), input_precision=PRECISION)
        dS_ij = P_ij * (dP_ij - D_i[:, None])
        dQ_i += tl.dot(dS_ij.to(K_j.dtype), K_j, input_precision=PRECISION)  # dS_ij @ K_j
    tl.store(dQ + bh * stride_dqh + rows[:, None] * stride_dqn + dims[None, :],
             (dQ_i * scale).to(dQ.dtype.element_ty), mask=q_mask)


def interpreted() -> bool:
    """Whether these kernels run in Triton's interpreter (TRITON_INTERPRET=1 when they were
    defined) rather than compiled for a GPU."""
    return type(flash2_forward_kernel).__name__ == "InterpretedFunction"


_variants: dict[tuple, Any] = {}


def kernel_with(kernel: Any, **helpers: Any) -> Any:
    """``kernel`` (a ``@triton.jit`` function of this module) with the ``@triton.jit`` helpers it
    calls by these names replaced, e.g. ``kernel_with(flash2_forward_kernel,
    online_softmax_step=mine)``: the same code, compiled (or interpreted) with other globals.
    Cached per kernel and helpers, so a compiled variant is compiled once."""
    fn = kernel.fn
    unknown = sorted(set(helpers) - set(fn.__code__.co_names))
    if unknown:
        raise ValueError(f"{fn.__name__} calls no helper named {', '.join(unknown)}")
    key = (fn, *sorted((name, id(h)) for name, h in helpers.items()))
    if key not in _variants:
        variant = types.FunctionType(fn.__code__, {**fn.__globals__, **helpers}, fn.__name__,
                                     fn.__defaults__, fn.__closure__)
        variant.__qualname__, variant.__module__ = fn.__qualname__, fn.__module__
        variant.__doc__ = fn.__doc__
        _variants[key] = (triton.jit(variant), helpers)  # the helpers kept alive with their id
    return _variants[key][0]
