"""The chapters' experiments, one module per chapter, numpy only.

What a chapter measures or tabulates (thresholds, counted traffic, error tables, gradient
checks, the optimisation ladder's rungs) lives here, so that a chapter's code cells stay short
and the tests can check every number a page prints.  Nothing here draws: figures and widget
data are :mod:`flashlib.book`'s.

- :mod:`flashlib.studies.intro`     memory of the score matrix, measured
- :mod:`flashlib.studies.overflow`  where ``exp`` overflows, the passes of the safe softmax,
                                    numpy 2's float64 promotion
- :mod:`flashlib.studies.tiling`    the teaching functions run on a counting memory: counts,
                                    logs, the parallel outer loop, exactness
- :mod:`flashlib.studies.ladder`    the optimisation ladder's rungs
- :mod:`flashlib.studies.backward`  identities, gradient checks, determinism, saved bytes,
                                    FLOPs, the base-2 trap, FA-1's backward traffic vs FA-2's
- :mod:`flashlib.studies.dq_race`   the dQ race of a single-kernel backward, simulated
- :mod:`flashlib.studies.precision` bfloat16 and float8 emulated, the error budget, FP8 as
                                    FlashAttention-3 does it (needs ``ml_dtypes``)
- :mod:`flashlib.studies.io_model`  exact HBM traffic, block sizes from M, the roofline
- :mod:`flashlib.studies.beyond`    split-KV decoding's tree, KV-cache bytes
"""
