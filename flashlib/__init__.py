"""flashlib: the numerics of "FlashAttention from Scratch".

numpy is the reference path (it runs anywhere, Pyodide included), and the only dependency of
the numeric modules below; an import-linter contract (pyproject.toml) keeps it so.  One concept
per module:

- :mod:`flashlib.stable_softmax`  the numerically stable softmax
- :mod:`flashlib.online`          the one-pass (m, l) update and the merge of partial states
- :mod:`flashlib.masks`           causal alignments, boolean masks and their tiles
- :mod:`flashlib.naive`           standard attention (materialises S and P) and its backward
- :mod:`flashlib.flash_v1`        FlashAttention, Algorithm 1 loop order
- :mod:`flashlib.flash`           FlashAttention-2 loop order (the default implementation)
- :mod:`flashlib.backward`        the recomputing backward pass (two schedules)
- :mod:`flashlib.gradients`       the backward chapter's numerics: identities, gradient checks,
                                  determinism, saved bytes and FLOPs, the base-2 trap
- :mod:`flashlib.decoding`        split-KV decoding: one query row against a long KV cache
- :mod:`flashlib.hbm`             the memory the teaching functions' HBM traffic goes through:
                                  plain numpy, or a counting memory with an SRAM of M elements
- :mod:`flashlib.schedule`        the tiled functions run on the counting memory: event log,
                                  counts, the tiling widget's data, the parallel outer loop
- :mod:`flashlib.io_model`        exact HBM traffic of each schedule, block sizes from M, the
                                  roofline
- :mod:`flashlib.ladder`          the optimisation ladder's rungs
- :mod:`flashlib.overflow`, :mod:`flashlib.memory`  the numerics of the chapters' experiments
- :mod:`flashlib.constants`       LOG2E, LN2, the default tile BLOCK_Q x BLOCK_K, compute_dtype
- :mod:`flashlib.measure`         measuring a call: peak memory, warnings, time
- :mod:`flashlib._validate`       every input check

Not numerics: :mod:`flashlib.book` (the chapters' helpers, ``pip install "flashlib[book]"``) and
:mod:`flashlib.bench` (the benchmark, ``pip install "flashlib[bench]"``).
"""

from flashlib import online as _online
from flashlib.backward import flash_attention_backward
from flashlib.flash import flash_attention
from flashlib.flash_v1 import flash_attention_v1
from flashlib.masks import causal_mask
from flashlib.naive import naive_attention, naive_attention_backward
from flashlib.online import *  # noqa: F403  (its __all__: the online-softmax API)
from flashlib.stable_softmax import softmax

__all__ = [
    "softmax",
    "naive_attention",
    "naive_attention_backward",
    "flash_attention_v1",
    "flash_attention",
    "flash_attention_backward",
    "causal_mask",
    *_online.__all__,
]

__version__ = "0.2.0"  # the one place the version is set (pyproject.toml reads it)
