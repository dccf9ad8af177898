"""The ground floor: what every other layer of flashlib stands on, numpy only.

- :mod:`flashlib.core.hbm`        the memory the teaching functions' HBM traffic goes through:
                                  plain numpy, or a counting memory with an SRAM of M elements
- :mod:`flashlib.core.loops`      running a function with its loops observed (an AST pass)
- :mod:`flashlib.core.masks`      which keys each query may see: the one owner of every mask
                                  rule (causal alignments, windows, key padding, tile classes)
- :mod:`flashlib.core.checks`     input checks of single arguments (dtypes, integers, arrays)
- :mod:`flashlib.core.problem`    the validated attention problem (``check_problem``)
- :mod:`flashlib.core.sysmem`     how much memory a new allocation may use
- :mod:`flashlib.core.constants`  LOG2E, LN2, the default tile BLOCK_Q x BLOCK_K, compute_dtype
- :mod:`flashlib.core.threads`    the worker pool of the fast paths (threadpoolctl optional)
- :mod:`flashlib.core.accuracy`   flash-attn's accuracy rule (at most 2x plain attention's error)
- :mod:`flashlib.core.measure`    measuring a call: peak memory, warnings, time
"""
