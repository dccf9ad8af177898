"""A first Triton kernel, to learn the words before FlashAttention's: program, launch grid,
stride, mask, constexpr.

:func:`normalize_rows_kernel` divides each row of a matrix by the row's sum, one program per
row; :func:`normalize_rows` launches it from PyTorch.  The GPU chapter shows both before the
attention kernel, and its softmax exercise starts from them.

    y = normalize_rows(torch.rand(5, 10))           # each row of y sums to 1
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlib.gpu.device import require_kernels

__all__ = ["normalize_rows_kernel", "normalize_rows"]


@triton.jit
def normalize_rows_kernel(X, Y, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    r = tl.program_id(0)  # which program: this one handles row r
    cols = tl.arange(0, BLOCK)  # (BLOCK,): 0 .. BLOCK - 1, BLOCK >= n_cols
    ok = cols < n_cols  # the mask: which of them are columns of X
    x = tl.load(X + r * stride_x + cols, mask=ok, other=0.0)  # X[r, :]
    y = x / tl.sum(x, 0)  # the padding loaded as 0 adds nothing to the sum
    tl.store(Y + r * stride_y + cols, y, mask=ok)  # Y[r, :] = y


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """x: (n_rows, n_cols) float32 (any row stride, contiguous columns) -> x / x.sum(1)."""
    require_kernels()
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"x: expected a float32 torch.Tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x: expected a 2-D tensor with contiguous columns, got shape "
                         f"{tuple(x.shape)}, strides {x.stride()}")
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    grid = (n_rows,)  # the launch grid: one program per row
    normalize_rows_kernel[grid](x, y, x.stride(0), y.stride(0), n_cols,
                                BLOCK=triton.next_power_of_2(n_cols))
    return y
