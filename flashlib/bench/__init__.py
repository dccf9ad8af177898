"""CPU benchmark: naive attention, FlashAttention (v1 and v2 loop orders), PyTorch SDPA.

    pip install "flashlib[bench]"                       # threadpoolctl, tqdm, tabulate
    python -m flashlib.bench targets                    # the tracked figures (n = 4096)
    python -m flashlib.bench cpu                        # n = 1024 4096, 8 heads, d = 64
    python -m flashlib.bench cpu --n 4096 16384 --causal --repeats 5
    python -m flashlib.bench cpu --n 64 --heads 1 --repeats 1 --blocks 16x16   # tiny (CI)
    python -m flashlib.bench ladder --n 4096            # the rungs of flashlib.studies.ladder

Every implementation runs on the same inputs, one thread (BLAS via threadpoolctl, torch via
``torch.set_num_threads``), round-robin (one call of each per repeat, so drift hits all alike);
the table shows medians and ratios from one run, and each implementation's fraction of its own
matrix library's single-thread sgemm peak (numpy's BLAS for flashlib and the numpy baselines,
torch's for the PyTorch baselines), both peaks measured once per run, round-robin.  The default
clock is the process CPU time, which on a shared machine leaves out the time other processes
hold the core; ``--clock wall``
uses ``time.perf_counter``.  With ``--threads`` above 1 the wall clock is forced (the process
CPU time adds up the time of every thread).  PyTorch's SDPA is pinned to its FlashAttention
backend (``torch.nn.attention.sdpa_kernel``) when that backend runs here, else left to choose,
and the JSON says which; without torch the PyTorch baselines are skipped, and the report says
so.  A JSON file records the machine (CPU model, family, flags, caches, BLAS and its kernel,
threads, library versions, flashlib's git commit), the sgemm peaks, every time, the fractions
and the ratios.

- :mod:`flashlib.bench.machine`  the machine: CPU, BLAS, threads, versions, the sgemm peak
- :mod:`flashlib.bench.suites`   what is timed (``cpu``, ``ladder``) and the summary rows
- :mod:`flashlib.bench.targets`  the tracked figures against their targets (``targets``)
- :mod:`flashlib.bench.report`   the printed tables
- :mod:`flashlib.bench.__main__` the command line

The widgets' live redraw time is book tooling: ``python -m tools.widget_redraw``.
"""

from flashlib.bench.machine import (
    CPU_FLAGS,
    LIBRARIES,
    SGEMM_SIZES,
    cpu_details,
    flashlib_source,
    machine_info,
    own_library,
    set_threads,
    sgemm_peak,
    sgemm_peaks,
    torch_available,
)
from flashlib.bench.report import report
from flashlib.bench.suites import (
    DEFAULT_BLOCKS,
    DEFAULT_NS,
    attention_flops,
    cpu_calls,
    ladder_calls,
    run,
    summarise,
    threads_rung_times,
    tile_breakdown,
    torch_calls,
)
from flashlib.bench.targets import exp2_state, format_targets, run_targets

__all__ = [
    "CPU_FLAGS",
    "SGEMM_SIZES",
    "LIBRARIES",
    "DEFAULT_BLOCKS",
    "DEFAULT_NS",
    "cpu_details",
    "flashlib_source",
    "machine_info",
    "set_threads",
    "sgemm_peak",
    "sgemm_peaks",
    "own_library",
    "torch_available",
    "attention_flops",
    "cpu_calls",
    "ladder_calls",
    "torch_calls",
    "tile_breakdown",
    "threads_rung_times",
    "exp2_state",
    "run_targets",
    "format_targets",
    "summarise",
    "run",
    "report",
]
