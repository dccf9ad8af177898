"""The starting points of the GPU chapter's exercises, and a probe for one of them.

The exercises ask for the three helpers that :func:`flashlib.gpu.kernels.flash2_forward_kernel`
calls (:func:`~flashlib.gpu.kernels.key_end`, :func:`~flashlib.gpu.kernels.visible_keys`,
:func:`~flashlib.gpu.kernels.online_softmax_step`); the checkers
(``flashlib.book.exercises.gpu``) run a reader's piece inside that same kernel
(:func:`flashlib.gpu.kernels.kernel_with`), so the kernel is written once, in
:mod:`flashlib.gpu.kernels`.  What stays here:

- the starting points the chapter shows: :func:`key_end_all_tiles` (correct, but visits every
  key tile) and :func:`visible_keys_with_bug` (a boundary mask with a bug);
- probes: four-line kernels that run one helper on given inputs and store what it returns,
  so that a checker can look at a reader's piece on its own: :func:`key_ends` (where each
  program's loop would stop), :func:`visible_block` (one tile's mask) and :func:`step_once`
  (one step of the online softmax from a given state), and :func:`stage_bounds_of` (where
  the two-stage causal kernel's stages split each program's keys,
  :func:`flashlib.gpu.staged_kernels.stage_bounds`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flashlib.gpu.device import require_kernels
from flashlib.gpu.grid import cdiv
from flashlib.gpu.kernels import kernel_with, key_end, online_softmax_step, visible_keys
from flashlib.gpu.staged_kernels import stage_bounds

__all__ = ["key_end_all_tiles", "visible_keys_with_bug", "key_end_probe", "key_ends",
           "visible_probe", "visible_block", "step_probe", "step_once", "stage_bounds_probe",
           "stage_bounds_of"]


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
def key_end_probe(Ends, N_K, B_r: tl.constexpr, CAUSAL: tl.constexpr):
    """Program p stores key_end(p * B_r, B_r, N_K, CAUSAL): where its loop would stop (the
    library's key_end, or the one :func:`key_ends` puts in its place)."""
    p = tl.program_id(0)
    tl.store(Ends + p, key_end(p * B_r, B_r, N_K, CAUSAL))


def key_ends(n_q: int, n_k: int, B_r: int, causal: bool, key_end_fn=None) -> list[int]:
    """Where each of the ceil(n_q / B_r) programs' loops over keys stops with ``key_end_fn``
    (a ``@triton.jit`` function ``key_end(i, B_r, N_K, CAUSAL)``; the library's when None)."""
    caps = require_kernels()
    ends = torch.full((cdiv(n_q, B_r),), -1, dtype=torch.int32, device=caps.device)
    probe = kernel_with(key_end_probe, key_end=key_end_fn) if key_end_fn else key_end_probe
    probe[(len(ends),)](
        ends, n_k, B_r=B_r, CAUSAL=bool(causal))
    return ends.cpu().tolist()


@triton.jit
def visible_probe(Out, Ndim, i, j, N_K, B_r: tl.constexpr, B_c: tl.constexpr,
                  CAUSAL: tl.constexpr):
    """Store visible_keys(rows, cols, N_K, CAUSAL) for rows i .. i + B_r - 1 and keys
    j .. j + B_c - 1, as int8, row-major (B_r, B_c) (broadcast), and its number of axes in
    Ndim (a mask of the keys alone broadcasts in the kernel, and is still not a tile's)."""
    rows = i + tl.arange(0, B_r)
    cols = j + tl.arange(0, B_c)
    seen = visible_keys(rows, cols, N_K, CAUSAL)
    tl.store(Ndim, len(seen.shape))
    tl.store(Out + tl.arange(0, B_r)[:, None] * B_c + tl.arange(0, B_c)[None, :],
             seen.to(tl.int8))


def visible_block(i: int, j: int, B_r: int, B_c: int, n_k: int, causal: bool,
                  visible_fn=None) -> np.ndarray:
    """(B_r, B_c) bool: ``visible_fn`` (or the library's visible_keys) on the tile of rows
    i .. i + B_r - 1 and keys j .. j + B_c - 1; a mask of fewer axes comes back with the
    shape it had (a (B_c,) mask of the keys alone: its first row)."""
    caps = require_kernels()
    out = torch.full((B_r, B_c), -1, dtype=torch.int8, device=caps.device)
    ndim = torch.full((1,), -1, dtype=torch.int32, device=caps.device)
    probe = kernel_with(visible_probe, visible_keys=visible_fn) if visible_fn else visible_probe
    probe[(1,)](out, ndim, i, j, n_k, B_r=B_r, B_c=B_c, CAUSAL=bool(causal))
    mask = out.cpu().numpy().astype(bool)
    return mask[0] if int(ndim.item()) == 1 else mask


@triton.jit
def step_probe(S, V, M, L, ACC, M_out, L_out, ACC_out,
               B_r: tl.constexpr, B_c: tl.constexpr, D: tl.constexpr):
    """Load a tile S (B_r, B_c), V (B_c, D) and a state m (B_r,), l (B_r,), acc (B_r, D); run
    online_softmax_step once (exact float32 products) and store the new state."""
    r, c, e = tl.arange(0, B_r), tl.arange(0, B_c), tl.arange(0, D)
    S_ij = tl.load(S + r[:, None] * B_c + c[None, :])
    V_j = tl.load(V + c[:, None] * D + e[None, :])
    m_i, l_i = tl.load(M + r), tl.load(L + r)
    acc = tl.load(ACC + r[:, None] * D + e[None, :])
    m_i, l_i, acc = online_softmax_step(S_ij, V_j, m_i, l_i, acc, "ieee")
    tl.store(M_out + r, m_i)
    tl.store(L_out + r, l_i)
    tl.store(ACC_out + r[:, None] * D + e[None, :], acc)


def step_once(S: np.ndarray, V: np.ndarray, m: np.ndarray, l: np.ndarray, acc: np.ndarray,
              step_fn=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``step_fn`` (or the library's online_softmax_step) once, on float32 numpy inputs: S
    (B_r, B_c) base-2 scores, V (B_c, D), m, l (B_r,), acc (B_r, D) -> (m, l, acc)."""
    caps = require_kernels()
    B_r, B_c = S.shape
    D = V.shape[1]
    ins = [torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(caps.device)
           for x in (S, V, m, l, acc)]
    outs = [torch.full_like(x, float("nan")) for x in ins[2:]]
    probe = kernel_with(step_probe, online_softmax_step=step_fn) if step_fn else step_probe
    probe[(1,)](*ins, *outs, B_r=B_r, B_c=B_c, D=D)
    return tuple(x.cpu().numpy() for x in outs)


@triton.jit
def stage_bounds_probe(Out, N_K, B_r: tl.constexpr, B_c: tl.constexpr):
    """Program p stores stage_bounds(p * B_r, B_r, B_c, N_K), (split, end), at Out[2p], Out[2p+1]
    (the library's stage_bounds, or the one :func:`stage_bounds_of` puts in its place)."""
    p = tl.program_id(0)
    split, end = stage_bounds(p * B_r, B_r, B_c, N_K)
    tl.store(Out + 2 * p, split)
    tl.store(Out + 2 * p + 1, end)


def stage_bounds_of(n_q: int, n_k: int, B_r: int, B_c: int,
                    stage_bounds_fn=None) -> list[tuple[int, int]]:
    """(split, end) of each of the ceil(n_q / B_r) programs of the two-stage causal kernel, by
    ``stage_bounds_fn`` (a ``@triton.jit`` function ``stage_bounds(i, B_r, B_c, N_K)``; the
    library's when None)."""
    caps = require_kernels()
    out = torch.full((2 * cdiv(n_q, B_r),), -1, dtype=torch.int32, device=caps.device)
    probe = (kernel_with(stage_bounds_probe, stage_bounds=stage_bounds_fn) if stage_bounds_fn
             else stage_bounds_probe)
    probe[(cdiv(n_q, B_r),)](out, n_k, B_r=B_r, B_c=B_c)
    got = out.cpu().tolist()
    return list(zip(got[0::2], got[1::2], strict=True))
