"""The Triton tutorial's schedule, as kernels to read: a preprocessing kernel for D, and the
causal forward in two stages.

:mod:`flashlib.gpu.kernels` has the backward's two main kernels: a dK/dV kernel (one program
per key block, looping over the query blocks: ``flash2_backward_dkdv_kernel``) and a dQ kernel
(one program per query block, looping over the key blocks: ``flash2_backward_dq_kernel``), so
that no two programs add into the same rows.  They read ``D_i = rowsum(dO_i * O_i)``; here it
is computed by a kernel of its own, one program per (query block, head), as the Triton
tutorial's ``_attn_bwd_preprocess`` does, and :func:`backward` runs the three.

The causal forward :func:`flash2_causal_forward_kernel` splits each query block's keys in two
stages (the tutorial's ``STAGE`` 1 and 2): the key blocks wholly below the diagonal, where every
entry is visible and no mask is computed at all, then the few blocks on the diagonal, masked
entry by entry; the blocks above it are never visited.  With B_r a multiple of B_c and i a
multiple of B_r, the keys [0, i) are visible to every row i .. i + B_r - 1 (the unmasked stage);
the keys [i, i + B_r) are the diagonal blocks (the masked stage).  A last key block cut by n_k
goes to the masked stage too, so the unmasked stage needs no boundary mask either.

Imported after :mod:`flashlib.gpu` (which sets ``TRITON_INTERPRET=1`` without a CUDA GPU):
without one these run in Triton's interpreter on CPU tensors, one program after another.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlib.core.constants import LN2, LOG2E
from flashlib.gpu import kernels
from flashlib.gpu.device import require_kernels
from flashlib.gpu.grid import cdiv, head_dim_block
from flashlib.gpu.kernels import online_softmax_step, visible_keys

__all__ = ["flash2_backward_preprocess_kernel", "stage_bounds", "flash2_causal_forward_kernel",
           "delta", "causal_forward", "backward", "causal_stages"]

_LN2 = tl.constexpr(LN2)


@triton.jit
def flash2_backward_preprocess_kernel(
    O, dO, Delta,  # O, dO: (B*H, N_Q, d); Delta: (B*H, N_Q), float32
    stride_oh, stride_on, stride_doh, stride_don, N_Q, d,
    B_r: tl.constexpr, D: tl.constexpr,
):
    i = tl.program_id(0) * B_r  # one program per query block ...
    bh = tl.program_id(1)  # ... and (batch, head)
    rows = i + tl.arange(0, B_r)
    dims = tl.arange(0, D)
    mask = (rows[:, None] < N_Q) & (dims[None, :] < d)
    O_i = tl.load(O + bh * stride_oh + rows[:, None] * stride_on + dims[None, :], mask=mask,
                  other=0.0).to(tl.float32)
    dO_i = tl.load(dO + bh * stride_doh + rows[:, None] * stride_don + dims[None, :],
                   mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + bh * N_Q + rows, tl.sum(dO_i * O_i, 1),  # np.sum(dO_i * O_i, axis=1)
             mask=rows < N_Q)


@triton.jit
def stage_bounds(i, B_r, B_c, N_K):
    """Where the two stages of the query block of rows i .. i + B_r - 1 split its keys:
    stage 1 (no mask) runs over the key blocks [0, split), stage 2 (masked) over
    [split, end)."""
    split = tl.minimum(i, (N_K // B_c) * B_c)  # whole blocks below the diagonal
    end = tl.minimum(i + B_r, N_K)  # the diagonal's last key, + 1
    return split, end


@triton.jit
def _attend_keys(Q_i, K, V, bh, rows, dims, dim_ok, stride_kh, stride_kn, stride_vh,
                 stride_vn, lo, hi, N_K, qk_scale, m_i, l_i, acc,
                 B_c: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """The key blocks lo, lo + B_c, ... < hi of one query block: one stage.  MASKED False:
    every entry visible (no mask computed, no boundary check on the keys); True: the diagonal
    blocks, the causal mask and the keys' end applied entry by entry."""
    for j in range(lo, hi, B_c):
        cols = j + tl.arange(0, B_c)
        if MASKED:
            kv_mask = (cols[:, None] < N_K) & dim_ok[None, :]
        else:
            kv_mask = (cols[:, None] >= 0) & dim_ok[None, :]  # only d is ragged here
        K_j = tl.load(K + bh * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=kv_mask, other=0.0)
        V_j = tl.load(V + bh * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                      mask=kv_mask, other=0.0)
        S_ij = tl.dot(Q_i, tl.trans(K_j), input_precision=PRECISION) * qk_scale
        if MASKED:  # on the diagonal: row r sees keys j <= r (and none past N_K)
            S_ij = tl.where(visible_keys(rows, cols, N_K, True), S_ij, float("-inf"))
        m_i, l_i, acc = online_softmax_step(S_ij, V_j, m_i, l_i, acc, PRECISION)
    return m_i, l_i, acc


@triton.jit
def flash2_causal_forward_kernel(
    Q, K, V, O, L,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    N_Q, N_K, d, qk_scale,
    B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr,
):
    i = tl.program_id(0) * B_r
    bh = tl.program_id(1)
    rows = i + tl.arange(0, B_r)
    dims = tl.arange(0, D)
    row_ok, dim_ok = rows < N_Q, dims < d
    Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                  mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    m_i = tl.full([B_r], float("-inf"), tl.float32)
    l_i = tl.zeros([B_r], tl.float32)
    acc = tl.zeros([B_r, D], tl.float32)
    split, end = stage_bounds(i, B_r, B_c, N_K)
    m_i, l_i, acc = _attend_keys(Q_i, K, V, bh, rows, dims, dim_ok, stride_kh, stride_kn,
                                 stride_vh, stride_vn, 0, split, N_K, qk_scale, m_i, l_i,
                                 acc, B_c, False, PRECISION)  # stage 1: no mask
    m_i, l_i, acc = _attend_keys(Q_i, K, V, bh, rows, dims, dim_ok, stride_kh, stride_kn,
                                 stride_vh, stride_vn, split, end, N_K, qk_scale, m_i, l_i,
                                 acc, B_c, True, PRECISION)  # stage 2: the diagonal, masked
    tl.store(O + bh * stride_oh + rows[:, None] * stride_on + dims[None, :],
             (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(L + bh * N_Q + rows, (m_i + tl.log2(l_i)) * _LN2, mask=row_ok)


def causal_stages(i: int, n_k: int, B_r: int, B_c: int) -> tuple[range, range]:
    """The key blocks (their starts) of the query block starting at row i in each stage of
    :func:`flash2_causal_forward_kernel`, computed as the kernel computes them: stage 1 (no
    mask) [0, split), stage 2 (masked) [split, min(i + B_r, n_k)), split = min(i, n_k rounded
    down to whole key blocks)."""
    split = min(i, n_k // B_c * B_c)
    return range(0, split, B_c), range(split, min(i + B_r, n_k), B_c)


def _blocks(blocks: tuple[int, int]) -> tuple[int, int]:
    b_r, b_c = blocks
    if not (b_r >= 16 and b_c >= 16 and not b_r & (b_r - 1) and not b_c & (b_c - 1)
            and b_r % b_c == 0):
        raise ValueError(f"blocks must be (B_r, B_c), powers of two >= 16 with B_r a multiple "
                         f"of B_c (the diagonal is whole key blocks), got {blocks!r}")
    return b_r, b_c


def _heads(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"{name} must be a (B*H, n, d) torch tensor")
    return x if x.stride(-1) == 1 else x.contiguous()


def delta(o: torch.Tensor, do: torch.Tensor, block: int = 16) -> torch.Tensor:
    """D = rowsum(dO * O), (B*H, n_q) float32, by :func:`flash2_backward_preprocess_kernel`.
    o, do: (B*H, n_q, d) tensors of one shape."""
    require_kernels()
    o, do = _heads(o, "o"), _heads(do, "do")
    if o.shape != do.shape:
        raise ValueError(f"o and do must have one shape, got {tuple(o.shape)} and "
                         f"{tuple(do.shape)}")
    BH, N_Q, d = o.shape
    out = torch.empty((BH, N_Q), device=o.device, dtype=torch.float32)
    flash2_backward_preprocess_kernel[(cdiv(N_Q, block), BH)](
        o, do, out, o.stride(0), o.stride(1), do.stride(0), do.stride(1), N_Q, d,
        B_r=block, D=head_dim_block(d))
    return out


def causal_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   blocks: tuple[int, int] = (32, 16), precision: str = "ieee",
                   stage_bounds_fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal (top-left) attention of (B*H, n, d) tensors by the two-stage kernel -> o and the
    natural logsumexp L (B*H, n_q), float32.  ``stage_bounds_fn``: a ``@triton.jit`` function
    in place of :func:`stage_bounds` (the GPU chapter's checker runs a reader's in it)."""
    require_kernels()
    kernel = flash2_causal_forward_kernel
    if stage_bounds_fn is not None:
        kernel = kernels.kernel_with(kernel, stage_bounds=stage_bounds_fn)
    b_r, b_c = _blocks(blocks)
    q, k, v = _heads(q, "q"), _heads(k, "k"), _heads(v, "v")
    BH, N_Q, d = q.shape
    o = torch.empty_like(q)
    L = torch.empty((BH, N_Q), device=q.device, dtype=torch.float32)
    kernel[(cdiv(N_Q, b_r), BH)](
        q, k, v, o, L, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), o.stride(0), o.stride(1), N_Q, k.shape[1], d, scale * LOG2E,
        B_r=b_r, B_c=b_c, D=head_dim_block(d),
        PRECISION=precision if q.dtype == torch.float32 else "tf32")
    return o, L


def backward(q, k, v, o, L, do, causal: bool, scale: float, blocks: tuple[int, int] = (16, 16),
             precision: str = "ieee", D_rows: torch.Tensor | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of ``sum(do * o)`` on (B*H, n, d) tensors by three kernels: the
    preprocessing kernel (D), the dK/dV kernel (a program per key block, looping over query
    blocks) and the dQ kernel (a program per query block, looping over key blocks).
    ``D_rows``: D (B*H, n_q) float32 computed elsewhere, in place of the preprocessing
    kernel's (the GPU chapter's checker passes a reader's)."""
    require_kernels()
    b_r, b_c = blocks
    q, k, v, o, do = (_heads(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"),
                                                (do, "do")))
    BH, N_Q, d = q.shape
    N_K = k.shape[1]
    if D_rows is None:
        D_rows = delta(o, do, b_r)
    elif (tuple(D_rows.shape) != (BH, N_Q) or D_rows.dtype != torch.float32
          or D_rows.device != q.device):
        raise ValueError(f"D_rows must be a ({BH}, {N_Q}) float32 tensor on {q.device}, got "
                         f"{tuple(D_rows.shape)} {D_rows.dtype} on {D_rows.device}")
    else:
        D_rows = D_rows.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    prec = precision if q.dtype == torch.float32 else "tf32"
    opts = dict(B_r=b_r, B_c=b_c, D=head_dim_block(d), CAUSAL=causal, PRECISION=prec)
    common = (N_Q, N_K, d, scale, scale * LOG2E)
    kernels.flash2_backward_dkdv_kernel[(cdiv(N_K, b_c), BH)](
        q, k, v, do, L, D_rows, dk, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), do.stride(0), do.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), *common, **opts)
    kernels.flash2_backward_dq_kernel[(cdiv(N_Q, b_r), BH)](
        q, k, v, do, L, D_rows, dq, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
        *common, **opts)
    return dq, dk, dv
