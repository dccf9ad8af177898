"""torch autograd as one rung of the backward chapter's gradient-checking ladder, optional.

torch is not a dependency of flashlib or of its book extra: where it is missing (a fresh
environment, a reader who skipped it) these functions say so in one plain sentence instead of
raising an ImportError.

- :func:`torch_available`   whether ``import torch`` works here (cached)
- :data:`TORCH_MISSING`     the sentence shown when it does not
- :func:`attention_grads`   dq, dk, dv of ``sum(do * attention(q, k, v))`` by autograd, in float64,
                            with the library's causal and boolean masks (rows that see no key
                            give 0, as flashlib's functions do)
- :func:`score_grads`       dS = d loss / dS for given scores, V and dO (and a gradient dL
                            of the logsumexp), by autograd
- :func:`ladder`            :func:`flashlib.studies.backward.gradient_ladder` with the autograd
                            rung when torch is here, and the sentence in its note when it is not
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flashlib.core.masks import causal_mask
from flashlib.studies.backward import LADDER_CASES, LadderCase, gradient_ladder

__all__ = ["TORCH_MISSING", "torch_available", "attention_grads", "score_grads", "ladder"]

#: Shown instead of the autograd rung when torch cannot be imported.
TORCH_MISSING = ("torch is not installed here, so the autograd rung is skipped (pip install "
                 "torch to add it); the other rungs check the same gradients")


@functools.lru_cache(maxsize=1)
def torch_available() -> bool:
    """Whether torch can be imported (checked once)."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch  # noqa: F401
    except Exception:  # a broken install counts as missing
        return False
    return True


def _require_torch() -> Any:
    if not torch_available():
        raise ModuleNotFoundError(TORCH_MISSING)
    import torch

    return torch


def attention_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *,
                    causal: bool | str = False, mask: np.ndarray | None = None,
                    scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dq, dk, dv of ``sum(do * softmax(scale q k^T, masked) v)`` by torch autograd, float64.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v), do: (..., n_q, d_v); causal and
    mask as :func:`flashlib.naive_attention` (mask True = may attend, broadcastable to
    (..., n_q, n_k)).  Rows that see no key give output 0 and gradient 0.  Raises
    ModuleNotFoundError with :data:`TORCH_MISSING` when torch is missing.
    """
    torch = _require_torch()
    n_q, d = np.shape(q)[-2:]
    n_k = np.shape(k)[-2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    visible = causal_mask(n_q, n_k, causal)
    if mask is not None:
        visible = visible & np.asarray(mask, dtype=bool)
    tq, tk, tv = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    s = scale * (tq @ tk.transpose(-1, -2))
    vis = torch.from_numpy(np.array(np.broadcast_to(visible, s.shape)))  # a writable copy
    has_key = vis.any(dim=-1, keepdim=True)
    s = torch.where(has_key, s.masked_fill(~vis, float("-inf")), torch.zeros((), dtype=s.dtype))
    o = (torch.softmax(s, dim=-1) * has_key) @ tv
    o.backward(torch.tensor(np.asarray(do, np.float64)))
    return tuple(x.grad.numpy() for x in (tq, tk, tv))  # type: ignore[return-value]


def score_grads(S: np.ndarray, V: np.ndarray, dO: np.ndarray,
                dL: np.ndarray | None = None) -> np.ndarray:
    """dS = d loss / dS by torch autograd, in float64, for ``loss = sum(dO * softmax(S) V)``
    (plus ``sum(dL * logsumexp(S))`` when ``dL`` is given): S (n_q, n_k), V (n_k, d_v),
    dO (n_q, d_v), dL (n_q,) -> (n_q, n_k).  ModuleNotFoundError (:data:`TORCH_MISSING`)
    without torch."""
    torch = _require_torch()
    tS = torch.tensor(np.asarray(S, np.float64), requires_grad=True)
    loss = (torch.softmax(tS, dim=-1) @ torch.tensor(np.asarray(V, np.float64))
            * torch.tensor(np.asarray(dO, np.float64))).sum()
    if dL is not None:
        loss = loss + (torch.logsumexp(tS, dim=-1)
                       * torch.tensor(np.asarray(dL, np.float64))).sum()
    loss.backward()
    return tS.grad.numpy()


def ladder(cases: Sequence[LadderCase] = LADDER_CASES, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`flashlib.studies.backward.gradient_ladder` with torch autograd as its second rung,
    or, without torch, that rung empty and :data:`TORCH_MISSING` as its note."""
    if torch_available():
        return gradient_ladder(cases, autograd=attention_grads, seed=seed)
    rows = gradient_ladder(cases, autograd=None, seed=seed)
    for row in rows:
        if row["step"].startswith("torch autograd"):
            row["note"] = TORCH_MISSING
    return rows
