"""The Triton kernels as a PyTorch function: checks, launch, and autograd.

    o = triton_attention(q, k, v, causal=True)          # q, k, v: (..., n, d) torch tensors
    o.sum().backward()                                  # dq, dk, dv by the Triton backward

On a CUDA GPU the tensors live on it and the kernels are compiled; without one they are CPU
tensors and the kernels run in Triton's interpreter (:mod:`flashlib.gpu.device`), where
bfloat16 is refused (:data:`flashlib.gpu.device.INTERPRETER_BF16_REASON`).
"""

from __future__ import annotations

import math

import torch

from flashlib.core.constants import LOG2E
from flashlib.gpu import kernels
from flashlib.gpu.device import Capabilities, require_kernels
from flashlib.gpu.grid import MAX_HEAD_DIM, MIN_HEAD_DIM, Config, cdiv, configs, head_dim_block

__all__ = ["DTYPES", "PRECISIONS", "triton_attention", "FlashAttention2", "forward", "backward"]

#: The input dtypes the kernels take.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: ``tl.dot``'s input precision for float32 inputs: "ieee" (exact float32 products, the default
#: here, for parity) or "tf32" (Triton's default on GPUs: 10-bit mantissas, faster).
PRECISIONS = ("ieee", "tf32")

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_working: dict[tuple, Config] = {}  # the first configuration that compiled, per problem kind


def _check_inputs(q, k, v, causal, scale, precision, blocks) -> tuple[Capabilities, float]:
    """Every check of :func:`triton_attention`, in one place: TypeError/ValueError naming the
    argument, GPUUnavailable when the kernels cannot run here.  Returns the scale."""
    caps = require_kernels()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{name} must be (..., n, d), got shape {tuple(x.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    refusal = caps.dtype_refusal(_DTYPE_NAMES[q.dtype])
    if refusal:
        raise TypeError(f"q: {refusal}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type != caps.device:
        raise ValueError(
            f"q is on {q.device} but the Triton kernels run on {caps.device} here ("
            + ("compiled for the GPU: move the tensors with .cuda()" if caps.mode == "cuda"
               else "in the interpreter: use CPU tensors") + ")")
    d = q.shape[-1]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim d must be between {MIN_HEAD_DIM} and {MAX_HEAD_DIM}, "
                         f"got {d}")
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"k and v must have q's head dim {d} (these kernels take d_v = d), "
                         f"got k: {tuple(k.shape)}, v: {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must have the same leading (batch, heads) dims, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.numel() == 0:
        raise ValueError(f"q and k need at least one row, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False (top-left aligned, as SDPA's is_causal), "
                        f"got {causal!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if blocks is not None:
        ok = (isinstance(blocks, tuple) and len(blocks) == 2
              and all(isinstance(b, int) and not isinstance(b, bool) for b in blocks))
        if not ok or any(b < 16 or b & (b - 1) for b in blocks):
            raise ValueError(f"blocks must be (B_r, B_c), powers of two >= 16, got {blocks!r}")
    if scale is None:
        return caps, 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    if not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be finite and non-zero, got {scale!r}")
    return caps, float(scale)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (B*H, n, d) with a contiguous last axis (a view when the strides allow)."""
    x = x.reshape(-1, *x.shape[-2:])
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(kernel, grid, args, key: tuple, caps: Capabilities, d: int, dtype_name: str,
            blocks: tuple[int, int] | None, causal: bool, precision: str) -> None:
    """Launch with the first configuration that compiles on this GPU (remembered per key)."""
    from triton.runtime.errors import OutOfResources

    tries = ([Config(*blocks)] if blocks else
             ([_working[key]] if key in _working else configs(d, dtype_name, caps.mode)))
    for n, cfg in enumerate(tries):
        try:
            kernel[grid(cfg)](*args, B_r=cfg.B_r, B_c=cfg.B_c, D=head_dim_block(d),
                              CAUSAL=causal, PRECISION=precision,
                              **({} if caps.mode == "interpreter" else
                                 {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
        except OutOfResources:
            if n == len(tries) - 1:
                raise
            continue
        if not blocks:  # blocks asked for are not the default's: remember only a default
            _working.setdefault(key, cfg)
        return


def _precision(dtype: torch.dtype, precision: str) -> str:
    """tl.dot's input_precision: the one asked for with float32, Triton's default ("tf32",
    which 16-bit inputs ignore) otherwise."""
    return precision if dtype == torch.float32 else "tf32"


def forward(q, k, v, causal: bool, scale: float, precision: str = "ieee",
            blocks: tuple[int, int] | None = None, caps: Capabilities | None = None,
            helpers: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel on checked (B*H, n, d) tensors -> o (B*H, n_q, d) and the natural
    logsumexp L (B*H, n_q), float32.  ``helpers``: ``@triton.jit`` functions to put in place
    of the kernel's own, by name (:func:`flashlib.gpu.kernels.kernel_with`; the GPU chapter's
    checkers run a reader's piece so)."""
    caps = caps or require_kernels()
    BH, N_Q, d = q.shape
    N_K = k.shape[1]
    o = torch.empty_like(q)
    L = torch.empty((BH, N_Q), device=q.device, dtype=torch.float32)
    name = _DTYPE_NAMES[q.dtype]
    args = (q, k, v, o, L, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), o.stride(0), o.stride(1), N_Q, N_K, d, scale * LOG2E)
    kernel = kernels.flash2_forward_kernel
    if helpers:
        kernel = kernels.kernel_with(kernel, **helpers)
    _launch(kernel, lambda cfg: (cdiv(N_Q, cfg.B_r), BH), args,
            ("fwd", d, name, causal), caps, d, name, blocks, causal,
            _precision(q.dtype, precision))
    return o, L


def backward(q, k, v, o, L, do, causal: bool, scale: float, precision: str = "ieee",
             blocks: tuple[int, int] | None = None,
             caps: Capabilities | None = None) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of ``sum(do * o)`` from the logsumexp L, on (B*H, n, d) tensors: D = rowsum(dO
    * O) here, then one kernel for dK, dV (a program per key block) and one for dQ (a program
    per query block), so that no two programs add into the same rows."""
    caps = caps or require_kernels()
    BH, N_Q, d = q.shape
    N_K = k.shape[1]
    do = _rows(do)
    delta = (do.float() * o.float()).sum(-1).contiguous()  # D_i = rowsum(dO_i * O_i)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    name, prec = _DTYPE_NAMES[q.dtype], _precision(q.dtype, precision)
    common = (N_Q, N_K, d, scale, scale * LOG2E)
    _launch(kernels.flash2_backward_dkdv_kernel, lambda cfg: (cdiv(N_K, cfg.B_c), BH),
            (q, k, v, do, L, delta, dk, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
             v.stride(0), v.stride(1), do.stride(0), do.stride(1), dk.stride(0), dk.stride(1),
             dv.stride(0), dv.stride(1), *common),
            ("dkdv", d, name, causal), caps, d, name, blocks, causal, prec)
    _launch(kernels.flash2_backward_dq_kernel, lambda cfg: (cdiv(N_Q, cfg.B_r), BH),
            (q, k, v, do, L, delta, dq, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
             v.stride(0), v.stride(1), do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
             *common),
            ("dq", d, name, causal), caps, d, name, blocks, causal, prec)
    return dq, dk, dv


class FlashAttention2(torch.autograd.Function):
    """Autograd for the Triton kernels: forward saves q, k, v, o and the logsumexp L (O(n d)
    memory, never the (n, n) matrix P), backward recomputes P from L."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, precision, blocks):
        o, L = forward(q, k, v, causal, scale, precision, blocks)
        ctx.save_for_backward(q, k, v, o, L)
        ctx.options = (causal, scale, precision, blocks)
        ctx.mark_non_differentiable(L)
        return o, L

    @staticmethod
    def backward(ctx, do, _dL):
        q, k, v, o, L = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, L, do, *ctx.options)
        return dq, dk, dv, None, None, None, None


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    precision: str = "ieee",
    blocks: tuple[int, int] | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention by the book's Triton FlashAttention-2 kernels, differentiable.

    q: (..., n_q, d), k and v: (..., n_k, d) torch tensors of one dtype (float16, bfloat16,
    float32), 16 <= d <= 128, any n -> o: (..., n_q, d), q's dtype; with ``return_lse`` also
    the logsumexp (..., n_q) in float32, natural log (like :func:`flashlib.flash_attention`'s).
    causal: row i sees keys j <= i (top-left, as SDPA's ``is_causal``).  scale: 1/sqrt(d) by
    default.  precision: "ieee" (exact float32 products; float32 inputs only) or "tf32".
    blocks: (B_r, B_c), powers of two >= 16 (default: :func:`flashlib.gpu.grid.configs`).
    ``loss.backward()`` runs the Triton backward.  Memory beyond inputs and outputs: the
    logsumexp, O(n) (never the (n_q, n_k) matrix); the backward adds D = rowsum(dO * O), O(n),
    computed in float32 through a temporary the size of O.
    """
    _, scale = _check_inputs(q, k, v, causal, scale, precision, blocks)
    lead = q.shape[:-2]
    o, L = FlashAttention2.apply(_rows(q), _rows(k), _rows(v), causal, scale, precision,
                                 blocks)
    o = o.reshape(*lead, *o.shape[-2:])
    return (o, L.reshape(*lead, L.shape[-1])) if return_lse else o
