"""One attention, several implementations: the book's Triton kernels, flash-attn, each backend
of PyTorch's SDPA, and naive PyTorch, behind one call.

Layouts, handled here and only here: SDPA and the Triton kernels take (batch, heads, seqlen,
dim), "bhnd"; flash-attn's ``flash_attn_func`` takes (batch, seqlen, heads, dim), "bnhd".
:func:`attention` takes and returns "bhnd" and converts on the way in and out
(:func:`to_layout`, a transpose view, no copy); the benchmark prepares each implementation's
own layout once, outside the timed calls (:func:`Implementation.call`).

Causal masks: SDPA's ``is_causal`` and the Triton kernels align the mask to the top-left
corner (row i sees keys j <= i); flash-attn (since 2.1) to the bottom-right when n_q != n_k.
The two agree when n_q == n_k; :func:`attention` refuses flash-attn causal with n_q != n_k
rather than return a different attention.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashlib.gpu.device import Capabilities, GPUUnavailable, capabilities

__all__ = ["LAYOUTS", "SDPA_BACKENDS", "IMPLEMENTATIONS", "Implementation", "to_layout",
           "unavailable_reason", "attention", "naive_torch_attention", "sdpa_attention"]

#: Axis order of each layout: (batch, heads, seqlen, dim) and (batch, seqlen, heads, dim).
LAYOUTS = ("bhnd", "bnhd")
#: SDPA's backends by the names used here (those this torch knows; CUDNN from torch 2.5).
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}


def to_layout(x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """x (4-D) from layout ``src`` to ``dst`` ("bhnd" or "bnhd"): a transposed view."""
    for name, value in (("src", src), ("dst", dst)):
        if value not in LAYOUTS:
            raise ValueError(f"{name} must be one of {LAYOUTS}, got {value!r}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D ({src}), got shape {tuple(x.shape)}")
    return x if src == dst else x.transpose(1, 2)


def naive_torch_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Standard attention in PyTorch, every step in the inputs' dtype (the (n_q, n_k) score
    matrix materialised): the plain implementation flash-attn's tests compare errors against.
    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> (..., n_q, d_v)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q * scale) @ k.transpose(-1, -2)  # (..., n_q, n_k)
    if causal:
        n_q, n_k = s.shape[-2:]
        hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sdpa_attention(q, k, v, causal: bool = False, scale: float | None = None,
                   backend: str | None = None):
    """``F.scaled_dot_product_attention`` (bhnd), inside ``sdpa_kernel(backend)`` when a backend
    ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math") is named.  A backend that cannot
    run these inputs raises GPUUnavailable with PyTorch's reasons (its warnings), in words."""
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[backend], None)
    if member is None:
        raise GPUUnavailable(f"{backend}: this PyTorch ({torch.__version__}) has no "
                             f"{SDPA_BACKENDS[backend]} backend")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(member):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        except RuntimeError as err:
            why = "; ".join(dict.fromkeys(str(w.message).strip() for w in caught))
            raise GPUUnavailable(f"{backend} cannot run these inputs here: "
                                 f"{why or str(err).splitlines()[0]}") from None


def _flash_attn(q, k, v, causal: bool = False, scale: float | None = None):
    """flash-attn's ``flash_attn_func`` on bnhd tensors."""
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=scale, causal=causal)


def _triton(q, k, v, causal: bool = False, scale: float | None = None):
    from flashlib.gpu.triton_attention import triton_attention

    return triton_attention(q, k, v, causal=causal, scale=scale)


@dataclass(frozen=True)
class Implementation:
    """One way to compute attention: ``fn(q, k, v, causal, scale)`` on tensors in ``layout``."""

    name: str
    label: str
    layout: str
    fn: Callable[..., torch.Tensor]

    def call(self, q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
        """Run on tensors already in this implementation's layout."""
        return self.fn(q, k, v, causal=causal, scale=scale)


def _sdpa(backend: str) -> Callable[..., torch.Tensor]:
    def fn(q, k, v, causal=False, scale=None):
        return sdpa_attention(q, k, v, causal=causal, scale=scale, backend=backend)

    return fn


#: Every implementation, in the benchmark's order.
IMPLEMENTATIONS = {impl.name: impl for impl in [
    Implementation("triton", "Triton (this book)", "bhnd", _triton),
    Implementation("flash_attn", "flash-attn", "bnhd", _flash_attn),
    Implementation("sdpa_flash", "SDPA flash", "bhnd", _sdpa("sdpa_flash")),
    Implementation("sdpa_efficient", "SDPA mem-efficient", "bhnd", _sdpa("sdpa_efficient")),
    Implementation("sdpa_cudnn", "SDPA cuDNN", "bhnd", _sdpa("sdpa_cudnn")),
    Implementation("sdpa_math", "SDPA math", "bhnd", _sdpa("sdpa_math")),
    Implementation("naive_torch", "naive PyTorch", "bhnd", naive_torch_attention),
]}


def unavailable_reason(name: str, dtype: torch.dtype, caps: Capabilities | None = None, *,
                       n_q: int | None = None, n_k: int | None = None,
                       causal: bool = False) -> str | None:
    """Why implementation ``name`` cannot run ``dtype`` inputs here, in plain words, or None.
    (An SDPA backend's own limits show up only when it is called: :func:`sdpa_attention`.)"""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"name must be one of {sorted(IMPLEMENTATIONS)}, got {name!r}")
    caps = caps or capabilities()
    if name == "triton":
        if not caps.triton:
            return " ".join(caps.notes[:1])
        return caps.dtype_refusal(str(dtype).removeprefix("torch."))
    if name == "flash_attn":
        if not caps.flash_attn:
            return next((n for n in caps.notes if "flash-attn" in n), "flash-attn cannot run")
        if dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn takes float16 and bfloat16 only, not {dtype}"
        if causal and n_q is not None and n_k is not None and n_q != n_k:
            return ("flash-attn aligns a causal mask to the bottom-right corner when n_q != n_k"
                    "; SDPA and the Triton kernels to the top-left: not the same attention")
        return None
    return None if caps.sdpa else "PyTorch is not installed"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "triton", *,
              causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention by implementation ``impl`` (a key of :data:`IMPLEMENTATIONS`) on bhnd tensors.

    q: (batch, heads, n_q, d), k and v: (batch, heads, n_k, d) -> (batch, heads, n_q, d).
    Raises GPUUnavailable (with the reason) when ``impl`` cannot run them here.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D (batch, heads, n, d) torch.Tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    reason = unavailable_reason(impl, q.dtype, n_q=q.shape[2], n_k=k.shape[2], causal=causal)
    if reason:
        raise GPUUnavailable(f"{impl}: {reason}")
    implementation = IMPLEMENTATIONS[impl]
    inputs = (to_layout(x, "bhnd", implementation.layout) for x in (q, k, v))
    o = implementation.call(*inputs, causal=causal, scale=scale)
    return to_layout(o, implementation.layout, "bhnd")
