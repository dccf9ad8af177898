"""The introduction's measurements: the (n, n) score matrix of naive attention, and how
much memory naive and flash attention really allocate.

numpy reports its array allocations to :mod:`tracemalloc`, so the peak traced memory while a
function runs (:func:`flashlib.core.measure.measure_peak`) is the memory its arrays needed.
The chapters use this to watch naive attention's (n, n) score matrix grow 4x per doubling of
``n`` (``S``, overwritten in place by the probabilities ``P``) and flash attention's workspace
grow only linearly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashlib.core.checks import check_block, check_float_dtype, check_int
from flashlib.core.measure import measure_peak

__all__ = [
    "score_matrix_bytes",
    "random_qkv",
    "naive_attention_memory",
    "flash_attention_memory",
]


def score_matrix_bytes(n_q: int, n_k: int | None = None, dtype: Any = np.float32, *,
                       batch: int = 1, heads: int = 1) -> int:
    """Bytes of one score matrix ``S`` (batch, heads, n_q, n_k) in ``dtype`` (``n_k = n_q``)."""
    n_k = n_q if n_k is None else n_k
    n_q, n_k, batch, heads = (check_int(value, name, minimum=0) for name, value in
                              (("n_q", n_q), ("n_k", n_k), ("batch", batch), ("heads", heads)))
    itemsize = check_float_dtype(dtype, "dtype").itemsize
    return batch * heads * n_q * n_k * itemsize


def random_qkv(n: int, d: int, dtype: Any = np.float32, *, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal q, k, v, each (n, d) in ``dtype``, from ``default_rng(seed)``."""
    n, d = check_int(n, "n", minimum=1), check_int(d, "d", minimum=1)
    dtype = check_float_dtype(dtype, "dtype")
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d)).astype(dtype) for _ in range(3))


def naive_attention_memory(n: int, d: int = 64, dtype: Any = np.float32, *,
                           seed: int = 0) -> int:
    """Peak bytes :func:`flashlib.naive_attention` allocates beyond its inputs and output.

    q, k, v are (n, d) in ``dtype``; the output (n, d) is subtracted, so what remains is the
    (n, n) scores, probabilities and the temporaries between them.
    """
    from flashlib.fast.naive import naive_attention  # lazy: keeps this module import-light

    q, k, v = random_qkv(n, d, dtype, seed=seed)
    out, peak = measure_peak(naive_attention, q, k, v)
    return max(peak - out.nbytes, 0)


def flash_attention_memory(n: int, d: int = 64, dtype: Any = np.float32, block: int = 64, *,
                           seed: int = 0) -> int:
    """Peak bytes :func:`flashlib.flash_attention` allocates beyond its inputs and output.

    q, k, v are (n, d) in ``dtype`` and ``block_q = block_k = block``; the output (n, d) is
    subtracted, so what remains is the O(n) workspace
    (:func:`flashlib.fast.forward.workspace_bytes`) plus the tiles, whose size depends on the block
    size only.
    """
    from flashlib.fast.forward import flash_attention  # lazy, as above

    block = check_block(block, "block")
    q, k, v = random_qkv(n, d, dtype, seed=seed)
    out, peak = measure_peak(flash_attention, q, k, v, block_q=block, block_k=block)
    return max(peak - out.nbytes, 0)
