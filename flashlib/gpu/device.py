"""What this machine can run, decided in one place, and Triton's set-up that follows from it.

Three cases (:func:`capabilities`):

- a CUDA GPU of compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell): everything,
  the Triton kernels compiled for it, flash-attn (when installed) and every SDPA backend;
- an older CUDA GPU: the Triton kernels (from compute capability 7.0, Volta) and SDPA;
  flash-attn refuses these GPUs (its README lists Ampere, Ada and Hopper), and so does
  bfloat16 below 8.0;
- no CUDA GPU: the Triton kernels run in Triton's *interpreter* (``TRITON_INTERPRET=1``) on CPU
  tensors, at small sizes: every program of the launch grid runs one after another, in numpy.

The interpreter must be chosen before ``@triton.jit`` wraps a kernel (Triton reads
``TRITON_INTERPRET`` then, and ``import triton`` already wraps the functions of
``triton.language`` written in Triton, such as ``tl.zeros``), so :func:`configure_triton` runs
when ``flashlib.gpu`` is imported, before triton and any kernel module: it sets
``TRITON_INTERPRET=1`` when the kernels cannot be compiled here, and leaves a value the user
set alone.  Set it yourself (before importing triton or flashlib.gpu) to run the interpreter
on a GPU machine.

Nothing here imports triton or flash_attn (their versions come from the installed packages'
metadata); torch is imported only when installed.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import sys
import textwrap
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

__all__ = [
    "INTERPRET_ENV",
    "MIN_TRITON_CC",
    "MIN_FLASH_ATTN_CC",
    "MIN_BF16_CC",
    "INSTALL_HINT",
    "FLASH_ATTN_INSTALL_HINT",
    "INTERPRETER_BF16_REASON",
    "GPUUnavailable",
    "Capabilities",
    "decide",
    "capabilities",
    "configure_triton",
    "require_kernels",
]

#: The environment variable that makes ``@triton.jit`` build interpreted kernels.
INTERPRET_ENV = "TRITON_INTERPRET"
#: Oldest compute capability Triton compiles ``tl.dot`` for (Volta).
MIN_TRITON_CC = (7, 0)
#: Oldest compute capability flash-attn 2 runs on (Ampere; flash-attn's README).
MIN_FLASH_ATTN_CC = (8, 0)
#: Oldest compute capability with bfloat16 tensor-core matmuls (Ampere).
MIN_BF16_CC = (8, 0)
INSTALL_HINT = 'pip install "flashlib[gpu]" (torch and triton)'
FLASH_ATTN_INSTALL_HINT = ("pip install flash-attn --no-build-isolation (it compiles against "
                           "the installed torch and CUDA; MAX_JOBS=4 limits the compiler's "
                           "memory)")
#: Why bfloat16 is refused in the interpreter (measured by
#: :func:`flashlib.gpu.traps.interpreter_bf16_dot`).
INTERPRETER_BF16_REASON = (
    "bfloat16 is refused in Triton's interpreter: numpy has no bfloat16, so the interpreter "
    "keeps bfloat16 values as their raw 16 bits (uint16) and tl.dot multiplies those bit "
    "patterns as integers, a silently wrong result (triton-lang/triton#11584); use float16 "
    "or float32 here, and bfloat16 on a CUDA GPU of compute capability 8.0 or newer")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class GPUUnavailable(RuntimeError):
    """What was asked for cannot run on this machine; the message says why in plain words
    (never a traceback on a book page)."""


def _env_flag(value: str | None) -> bool | None:
    """TRITON_INTERPRET's value as True/False, None when unset (or unreadable)."""
    if value is None:
        return None
    value = value.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


@dataclass(frozen=True)
class Capabilities:
    """What this machine can run (from :func:`capabilities`, or :func:`decide` for a
    hypothetical machine).  ``mode`` is how the Triton kernels run: ``"cuda"`` (compiled),
    ``"interpreter"`` (CPU tensors) or ``"unavailable"``; ``notes`` are plain sentences saying
    why something is not available."""

    torch_version: str | None
    triton_version: str | None
    flash_attn_version: str | None
    cuda_version: str | None
    device_name: str | None
    compute_capability: tuple[int, int] | None
    interpret_env: str | None
    mode: str
    flash_attn: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def cuda(self) -> bool:
        """Whether torch sees a CUDA GPU."""
        return self.compute_capability is not None

    @property
    def triton(self) -> bool:
        """Whether the Triton kernels run here (compiled or interpreted)."""
        return self.mode in ("cuda", "interpreter")

    @property
    def sdpa(self) -> bool:
        """Whether torch's scaled_dot_product_attention is there (any device)."""
        return self.torch_version is not None

    @property
    def device(self) -> str:
        """Where the kernels' tensors live: ``"cuda"`` or ``"cpu"``."""
        return "cuda" if self.mode == "cuda" else "cpu"

    def dtype_refusal(self, dtype_name: str) -> str | None:
        """Why the Triton kernels refuse ``dtype_name`` ("float16", "bfloat16", "float32")
        here, or None."""
        if dtype_name != "bfloat16":
            return None
        if self.mode == "interpreter":
            return INTERPRETER_BF16_REASON
        if self.mode == "cuda" and self.compute_capability < MIN_BF16_CC:
            return (f"bfloat16 needs compute capability {MIN_BF16_CC[0]}.{MIN_BF16_CC[1]} "
                    f"(Ampere) or newer; this {self.device_name} has "
                    f"{self.compute_capability[0]}.{self.compute_capability[1]}")
        return None

    def summary(self) -> str:
        """A few plain lines for a page or a terminal, none over 76 columns (a page's code
        column)."""
        where = {
            "cuda": f"compiled for {self.device_name} (compute capability "
                    f"{'.'.join(map(str, self.compute_capability or ()))})",
            "interpreter": "in Triton's interpreter on the CPU (TRITON_INTERPRET=1), at small "
                           "sizes",
            "unavailable": "not here",
        }[self.mode]
        lines = [f"Triton kernels: {where}.",
                 f"flash-attn: {'yes' if self.flash_attn else 'no'}; "
                 f"PyTorch SDPA: {'yes' if self.sdpa else 'no'}."]
        lines += list(self.notes)
        return "\n".join(textwrap.fill(line, 76, subsequent_indent="  ",
                                           break_on_hyphens=False) for line in lines)


def _version(text: str | None) -> tuple[int, ...]:
    """"3.7.1" -> (3, 7, 1); "2.13.0+cpu" -> (2, 13, 0); unreadable parts end the tuple."""
    parts = []
    for part in (text or "").split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def decide(*, torch_version: str | None, triton_version: str | None,
           flash_attn_version: str | None = None, cuda_version: str | None = None,
           device_name: str | None = None, compute_capability: tuple[int, int] | None = None,
           interpret_env: str | None = None, numpy_version: str | None = None) -> Capabilities:
    """The capabilities of a machine with these packages and this GPU (None: no CUDA GPU):
    the one place the rules live; :func:`capabilities` feeds it this machine's facts."""
    notes: list[str] = []
    interpret = _env_flag(interpret_env)
    cc = tuple(compute_capability) if compute_capability is not None else None
    if torch_version is None or triton_version is None:
        missing = " and ".join(name for name, v in (("torch", torch_version),
                                                     ("triton", triton_version)) if v is None)
        mode = "unavailable"
        notes.append(f"The Triton kernels need torch and triton; {missing} "
                     f"{'is' if ' and ' not in missing else 'are'} not installed: "
                     f"{INSTALL_HINT}.")
    elif interpret:
        mode = "interpreter"
        if cc is not None:
            notes.append(f"{INTERPRET_ENV}={interpret_env} is set: the Triton kernels run in "
                         "the interpreter on the CPU although a CUDA GPU is present.")
    elif cc is not None and cc >= MIN_TRITON_CC:
        mode = "cuda"
    elif cc is not None:
        mode = "interpreter"
        notes.append(f"This GPU ({device_name}, compute capability {cc[0]}.{cc[1]}) is older "
                     f"than Triton supports ({MIN_TRITON_CC[0]}.{MIN_TRITON_CC[1]}, Volta): "
                     "the Triton kernels run in the interpreter on the CPU.")
    elif interpret is False:
        mode = "unavailable"
        notes.append(f"{INTERPRET_ENV}={interpret_env} asks for compiled Triton kernels, but "
                     f"there is no CUDA GPU here; unset {INTERPRET_ENV} (or set it to 1) to "
                     "run them in the interpreter.")
    else:
        mode = "interpreter"
    if (mode == "interpreter" and _version(triton_version) < (3, 7)
            and _version(numpy_version) >= (2, 4)):
        mode = "unavailable"
        notes.insert(0, f"Triton {triton_version}'s interpreter turns loop bounds into Python "
                        f"ints with int(array), which numpy {numpy_version} refuses for "
                        "one-element arrays (fixed in Triton 3.7): install triton>=3.7 (or "
                        "numpy<2.4) to run the kernels on the CPU.")

    if flash_attn_version is None:
        flash_attn = False
        notes.append(f"flash-attn is not installed ({FLASH_ATTN_INSTALL_HINT}; it needs a "
                     "CUDA GPU).")
    elif cc is None:
        flash_attn = False
        notes.append("flash-attn is installed but there is no CUDA GPU: it runs only on one.")
    elif cc < MIN_FLASH_ATTN_CC:
        flash_attn = False
        notes.append(f"flash-attn refuses this GPU ({device_name}, compute capability "
                     f"{cc[0]}.{cc[1]}): FlashAttention-2 needs Ampere (8.0) or newer, e.g. "
                     "A100, RTX 3090/4090, H100. Triton and SDPA still run.")
    else:
        flash_attn = torch_version is not None
    if torch_version is None:
        notes.append("torch is not installed, so PyTorch's SDPA is unavailable too.")
    return Capabilities(torch_version, triton_version, flash_attn_version, cuda_version,
                        device_name, cc, interpret_env, mode, flash_attn, tuple(notes))


def _dist_version(*names: str) -> str | None:
    """The installed version of the first of these distributions found, without importing."""
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _probe() -> dict:
    """This machine's facts (cached: the GPU does not change while Python runs)."""
    import numpy

    facts: dict = {"torch_version": None, "cuda_version": None, "device_name": None,
                   "compute_capability": None, "numpy_version": numpy.__version__}
    if importlib.util.find_spec("torch") is not None:
        import torch

        facts["torch_version"] = torch.__version__
        facts["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            facts["device_name"] = torch.cuda.get_device_name(0)
            facts["compute_capability"] = tuple(torch.cuda.get_device_capability(0))
    facts["triton_version"] = (_dist_version("triton")
                               if importlib.util.find_spec("triton") is not None else None)
    facts["flash_attn_version"] = (_dist_version("flash-attn", "flash_attn")
                                   if importlib.util.find_spec("flash_attn") is not None
                                   else None)
    return facts


def capabilities() -> Capabilities:
    """What this machine can run (see the module docstring); never raises."""
    return decide(**_probe(), interpret_env=os.environ.get(INTERPRET_ENV))


def configure_triton() -> Capabilities:
    """Set ``TRITON_INTERPRET=1`` when the Triton kernels must run in the interpreter and the
    user has not set it: called by ``import flashlib.gpu`` before any kernel is defined.
    A kernel defined (``@triton.jit``) before this ran stays compiled; see
    :func:`require_kernels`."""
    caps = capabilities()
    if caps.mode == "interpreter" and _env_flag(caps.interpret_env) is not True:
        os.environ[INTERPRET_ENV] = "1"
        caps = capabilities()
    return caps


def require_kernels() -> Capabilities:
    """The capabilities, or :class:`GPUUnavailable` saying plainly why the Triton kernels cannot
    run here: missing packages, compiled kernels without a GPU, or triton imported before
    ``TRITON_INTERPRET`` was set (Triton reads it when ``@triton.jit`` decorates a function,
    and ``triton.language`` decorates its own functions written in Triton, ``tl.zeros``,
    ``tl.max``..., when it is first imported)."""
    caps = capabilities()
    if not caps.triton:
        raise GPUUnavailable(" ".join(caps.notes[:1]) or "the Triton kernels cannot run here")
    language = sys.modules.get("triton.language")
    if language is not None:
        interpreted = type(language.zeros).__name__ == "InterpretedFunction"
        if interpreted != (caps.mode == "interpreter"):
            raise GPUUnavailable(
                f"triton was imported {'with' if interpreted else 'without'} {INTERPRET_ENV}=1"
                f" but the kernels must run {'compiled' if interpreted else 'in the interpreter'}"
                f" here: import flashlib.gpu before triton (it sets {INTERPRET_ENV} when there "
                f"is no CUDA GPU), or set {INTERPRET_ENV}"
                f"{'=0' if interpreted else '=1'} before starting Python, then restart Python "
                "(or the notebook's kernel).")
    return caps
