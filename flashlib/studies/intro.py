"""The introduction's measurements: the (n, n) score matrix of naive attention, how much
memory naive attention really allocates, and what attention's traffic and FLOPs cost on a GPU.

numpy reports its array allocations to :mod:`tracemalloc`, so the peak traced memory while a
function runs (:func:`flashlib.core.measure.measure_peak`) is the memory its arrays needed.
The chapters use this to watch naive attention's (n, n) score matrix grow 4x per doubling of
``n`` (``S``, overwritten in place by the probabilities ``P``).  (The library's own linear
workspace is measured by its tests, tests/fast/test_memory.py.)

:func:`attention_times` is the introduction's model of why FlashAttention is faster: the
seconds a forward pass spends on its HBM traffic (the IO model's exact counts,
:func:`flashlib.studies.io_model.traffic`) and on its matrix products, on a cited GPU
(:data:`flashlib.studies.io_model.GPUS`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashlib.core.checks import check_float_dtype, check_int
from flashlib.core.measure import measure_peak
from flashlib.studies.io_model import (  # noqa: F401  (the book's one SRAM budget)
    A100_SHARED_MEMORY,
    GPU,
    attention_flops,
    traffic,
)

__all__ = [
    "A100_SHARED_MEMORY",
    "attention_times",
    "score_matrix_bytes",
    "random_qkv",
    "naive_attention_memory",
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




def attention_times(n: int, d: int, gpu: GPU, *, B: int, itemsize: int = 2
                    ) -> dict[str, dict[str, float]]:
    """Seconds one head's forward pass spends on each of its two terms on ``gpu``: n queries
    and keys of head dimension d, ``itemsize`` bytes per number (2: float16, the format of
    the GPU's matmul peak).

    "standard" is Algorithm 0, "flash" FlashAttention-2's loop order with B_r = B_c = B.
    "memory": bytes moved to and from HBM over the HBM bandwidth; "compute": the matmul
    FLOPs over the peak. A kernel needs at least the larger of its two terms.
    """
    n, d = check_int(n, "n", minimum=1), check_int(d, "d", minimum=1)
    B, itemsize = check_int(B, "B", minimum=1), check_int(itemsize, "itemsize", minimum=1)
    flops = attention_flops(n, n, d)  # 4 n^2 d: Q K^T and P V
    moved = {"standard": traffic("standard", n, n, d),  # elements
             "flash": traffic("v2", n, n, d, B_r=B, B_c=B)}
    return {name: {"memory": t.total * itemsize / gpu.bandwidth,
                   "compute": flops / gpu.matmul_flops}
            for name, t in moved.items()}
