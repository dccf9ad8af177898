"""FlashAttention on a GPU: the book's Triton kernels, flash-attn and PyTorch SDPA side by side.

    pip install "flashlib[gpu]"          # torch and triton; flash-attn separately (CUDA only)

flashlib's numerics (numpy) never import this subpackage; it needs torch and triton, and runs
everywhere they install:

- on a CUDA GPU (compute capability 7.0 or newer) the Triton kernels are compiled for it;
- without one they run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set
  here on import when needed, before any kernel is defined), slowly, at small sizes.

Importing ``flashlib.gpu`` never fails for want of torch or triton:
:func:`capabilities` says what runs here, in plain words.

- :mod:`flashlib.gpu.device`            capability detection, in one place; Triton's set-up
- :mod:`flashlib.gpu.kernels`           the Triton kernels (forward, backward), to be read
- :mod:`flashlib.gpu.staged_kernels`    the Triton tutorial's schedule: D's preprocessing
  kernel, the causal forward in two stages, the three-kernel backward
- :mod:`flashlib.gpu.triton_attention`  launching them from PyTorch, with autograd
- :mod:`flashlib.gpu.implementations`   the same attention through flash-attn, every SDPA
  backend and naive PyTorch; the (batch, seqlen, heads, dim) layout handled in one place
- :mod:`flashlib.gpu.grid`              launch grid and tile counts (pure Python)
- :mod:`flashlib.gpu.results`           TFLOP/s accounting, the benchmark's data file
  (pure Python)
- :mod:`flashlib.gpu.traps`             the known traps, measured: interpreter bfloat16, TF32,
  base-2 logsumexp
- :mod:`flashlib.gpu.exercise_kernels`  the forward kernel cut into the pieces the chapter's
  exercises ask for (checked by ``flashlib.book.exercises.gpu``)
"""

from flashlib.gpu.device import (
    Capabilities,
    GPUUnavailable,
    capabilities,
    configure_triton,
    require_kernels,
)

configure_triton()  # before any kernel module is imported: TRITON_INTERPRET when needed

__all__ = ["Capabilities", "GPUUnavailable", "capabilities", "configure_triton",
           "require_kernels"]
