"""The HBM IO model: exact counts of the elements each algorithm reads from and writes to HBM,
the block sizes Algorithm 1 derives from the SRAM size M, and what the traffic costs on a GPU.

Every count here is a closed form of the teaching functions' schedule (the tests check each one
against a :class:`flashlib.core.hbm.CountingMemory` running them, element for element):

:func:`traffic`            reads and writes per array: Algorithm 0 ("standard"), Algorithm 1
                           ("v1"), FlashAttention-2's order ("v2"), its backward pass
                           ("backward": dQ accumulated across the key blocks), the two-pass
                           backward ("two_pass_backward": dK, dV, then dQ), causal variants
                           (tiles above the diagonal skipped),
                           the paper's Algorithm 3 ("standard_backward", a model only), and
                           split-KV decoding ("split_kv")
:func:`block_sizes`        B_r, B_c from M: the paper's rule, or the largest blocks of the
                           paper's shape whose step fits in M (``rule="fit"``)
:func:`sram_footprint`     what one step holds in SRAM, per array, in elements
:func:`io_count`           total elements moved for (N, d, M, order)
:func:`theorem2`, :func:`minimum_traffic`, :func:`crossover_M`   the asymptotics and bounds
:data:`GPUS`, :func:`ridge_point`, :func:`roofline`, :func:`attention_flops`   the roofline

Notation: n_q query rows, n_k key rows, head dimension d (d_v for V and O, d by default),
T_r = ceil(n_q / B_r) query blocks and T_c = ceil(n_k / B_c) key blocks.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from flashlib.core.checks import check_int
from flashlib.core.hbm import Traffic
from flashlib.core.masks import causal_offset, key_stop

__all__ = [
    "ORDERS",
    "BACKWARD_ORDERS",
    "Traffic",
    "traffic",
    "block_counts",
    "paper_block_sizes",
    "block_sizes",
    "sram_footprint",
    "io_count",
    "theorem2",
    "minimum_traffic",
    "crossover_M",
    "GPU",
    "GPUS",
    "A100_HBM_BYTES",
    "A100_SRAM_BANDWIDTH",
    "A100_SHARED_MEMORY",
    "A100_SHARED_PER_BLOCK",
    "H100_SHARED_MEMORY",
    "REGISTERS_PER_SM",
    "SRAM_BUDGET_NAME",
    "ridge_point",
    "attention_flops",
    "roofline",
]


#: The schedules :func:`traffic` counts.
ORDERS = ("standard", "v1", "v2", "backward", "two_pass_backward", "standard_backward",
          "split_kv")


#: The tiled orders (those that take block sizes and may skip causal tiles).
TILED = ("v1", "v2", "backward", "two_pass_backward")


#: The two backward schedules (:mod:`flashlib.fast.backward`).
BACKWARD_ORDERS = ("backward", "two_pass_backward")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _visible_key_rows(n_q: int, n_k: int, B_r: int, B_c: int, offset: int | None
                      ) -> list[tuple[int, int, int]]:
    """Per query block: (rows, key blocks visited, key rows loaded).  A key block is visited
    when some row of the query block may see one of its keys (:func:`flashlib.core.masks.key_stop`,
    the library's rule); every key block when ``offset`` is None."""
    out = []
    for i0 in range(0, n_q, B_r):
        rows = min(B_r, n_q - i0)
        stop = key_stop(i0, i0 + rows, n_k, offset)
        blocks = _ceil_div(stop, B_c)
        out.append((rows, blocks, min(blocks * B_c, n_k)))
    return out


def traffic(
    order: str,
    n_q: int,
    n_k: int,
    d: int,
    *,
    d_v: int | None = None,
    B_r: int | None = None,
    B_c: int | None = None,
    causal: bool | str = False,
    n_splits: int = 1,
) -> Traffic:
    """Elements of each array read from and written to HBM by ``order``.

    order: "standard" (Algorithm 0: S and P written and read back), "v1" (Algorithm 1: outer
    loop over K/V blocks; Q, O, l, m re-read and O, l, m re-written for every key block; O, l,
    m initialised in HBM), "v2" (FlashAttention-2: outer loop over Q blocks; K and V re-read
    for every query block; O and L written once), "backward" (:func:`flash2_backward`: D
    computed first, dQ initialised in HBM and read and written for every tile),
    "two_pass_backward" (:func:`two_pass_backward`: D first; pass 1 streams Q, dO, L, D past
    each K_j, V_j and writes dK, dV once; pass 2 streams K, V past each Q_i and writes dQ
    once: no read of dQ, K and V read 1 + T_r times), "standard_backward" (the paper's
    Algorithm 3, line by line: a model, not run here), or
    "split_kv" (decoding: ``n_splits`` programs each run "v2" on their share of the keys,
    ``B_r`` = n_q; then one pass reads their (O, L) and writes the merged O).
    B_r, B_c: the blocks of the tiled orders ("v1", "v2", "backward", "two_pass_backward";
    "split_kv" takes B_c).
    causal: False, True / "top_left" or "bottom_right" for the tiled orders: key blocks that
    no row of a query block may see are skipped, as flashlib's library functions do.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    d = check_int(d, "d", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    if order in ("standard", "standard_backward"):
        if causal is not False:
            raise ValueError(f"causal applies to the tiled orders {TILED}; Algorithm 0 and 3 "
                             "move the whole n_q x n_k matrices whatever the mask")
        return _standard(n_q, n_k, d, d_v) if order == "standard" else \
            _standard_backward(n_q, n_k, d, d_v)
    B_c = check_int(B_c, "B_c", minimum=1)
    if order == "split_kv":
        if causal is not False:
            raise ValueError("causal does not apply to split-KV decoding: the query row "
                             "sees its whole KV cache")
        return _split_kv(n_q, n_k, d, d_v, B_c, check_int(n_splits, "n_splits", minimum=1))
    B_r = check_int(B_r, "B_r", minimum=1)
    per_block = _visible_key_rows(n_q, n_k, B_r, B_c, causal_offset(causal, n_q, n_k))
    tiles_rows = sum(rows * blocks for rows, blocks, _ in per_block)  # sum of B_r over tiles
    key_rows = sum(k for _, _, k in per_block)  # key rows loaded, over query blocks
    if order == "v1":
        reads = {"K": n_k * d, "V": n_k * d_v, "Q": tiles_rows * d, "O": tiles_rows * d_v,
                 "l": tiles_rows, "m": tiles_rows}
        writes = {"O": (n_q + tiles_rows) * d_v, "l": n_q + tiles_rows, "m": n_q + tiles_rows}
    elif order == "v2":
        reads = {"Q": n_q * d, "K": key_rows * d, "V": key_rows * d_v}
        writes = {"O": n_q * d_v, "L": n_q}
    elif order == "backward":
        reads = {"O": n_q * d_v, "dO": (n_q + tiles_rows) * d_v, "K": n_k * d, "V": n_k * d_v,
                 "Q": tiles_rows * d, "dQ": tiles_rows * d, "L": tiles_rows, "D": tiles_rows}
        writes = {"D": n_q, "dQ": (n_q + tiles_rows) * d, "dK": n_k * d, "dV": n_k * d_v}
    else:  # two_pass_backward: D; pass 1 (per tile: Q_i, dO_i, L_i, D_i); pass 2 (K_j, V_j)
        reads = {"O": n_q * d_v, "dO": (2 * n_q + tiles_rows) * d_v,
                 "K": (n_k + key_rows) * d, "V": (n_k + key_rows) * d_v,
                 "Q": (n_q + tiles_rows) * d, "L": n_q + tiles_rows, "D": n_q + tiles_rows}
        writes = {"D": n_q, "dQ": n_q * d, "dK": n_k * d, "dV": n_k * d_v}
    return Traffic(_nonzero(reads), _nonzero(writes))


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {name: int(c) for name, c in counts.items() if c}


def _standard(n_q: int, n_k: int, d: int, d_v: int) -> Traffic:
    """Algorithm 0: 1. read Q, K, write S; 2. read S, write P; 3. read P, V, write O."""
    s = n_q * n_k
    return Traffic(_nonzero({"Q": n_q * d, "K": n_k * d, "S": s, "P": s, "V": n_k * d_v}),
                   _nonzero({"S": s, "P": s, "O": n_q * d_v}))


def _standard_backward(n_q: int, n_k: int, d: int, d_v: int) -> Traffic:
    """The paper's Algorithm 3: 1. read P, dO, write dV; 2. read dO, V, write dP; 3. read P,
    dP, write dS; 4. read dS, K, write dQ; 5. read dS, Q, write dK."""
    s = n_q * n_k
    return Traffic(
        _nonzero({"P": 2 * s, "dO": 2 * n_q * d_v, "V": n_k * d_v, "dP": s, "dS": 2 * s,
                  "K": n_k * d, "Q": n_q * d}),
        _nonzero({"dV": n_k * d_v, "dP": s, "dS": s, "dQ": n_q * d, "dK": n_k * d}))


def _split_kv(n_q: int, n_k: int, d: int, d_v: int, B_c: int, n_splits: int) -> Traffic:
    """:func:`flashlib.algorithms.split_kv_decode`: each split runs "v2" (B_r = n_q) on its keys,
    then the merge reads every split's (O, L) and writes O."""
    size = max(1, _ceil_div(n_k, n_splits))
    splits = _ceil_div(n_k, size)
    reads = {"Q": splits * n_q * d, "K": n_k * d, "V": n_k * d_v,
             "O": splits * n_q * d_v, "L": splits * n_q}
    writes = {"O": (splits + 1) * n_q * d_v, "L": splits * n_q}
    return Traffic(_nonzero(reads), _nonzero(writes))


def block_counts(order: str, n_q: int, n_k: int, B_r: int, B_c: int) -> dict[str, Any]:
    """How many times each array's blocks are loaded and stored by "v1" or "v2", and how many
    times a block of O is rescaled or normalised (T_r = ceil(n_q / B_r), T_c = ceil(n_k / B_c)).

    tiles: T_r T_c.  loads / stores: block transfers per array (a store is a write of rows
    i : i + B_r); inits: whole-array initialisations in HBM.  rescales: multiplications of a
    running O_i by diag(e^(m_i - m_new)) (one per tile, both orders; v1's also un-normalises
    by diag(l_i)); normalisations: divisions of O_i by diag(l_i), one before each write of
    O_i (every tile in v1, once per query block in v2).
    """
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    B_r, B_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    T_r, T_c = _ceil_div(n_q, B_r), _ceil_div(n_k, B_c)
    tiles = T_r * T_c
    if order == "v1":
        loads = {"K": T_c, "V": T_c, "Q": tiles, "O": tiles, "l": tiles, "m": tiles}
        stores = {"O": tiles, "l": tiles, "m": tiles}
        inits = {"O": 1, "l": 1, "m": 1}
        normalisations = tiles
    elif order == "v2":
        loads = {"Q": T_r, "K": tiles, "V": tiles}
        stores = {"O": T_r, "L": T_r}
        inits = {}
        normalisations = T_r
    else:
        raise ValueError(f"order must be 'v1' or 'v2', got {order!r}")
    return {"T_r": T_r, "T_c": T_c, "tiles": tiles, "loads": _nonzero(loads),
            "stores": _nonzero(stores), "inits": inits, "rescales": tiles,
            "normalisations": normalisations}


def paper_block_sizes(M: int, d: int) -> tuple[int, int]:
    """Algorithm 1's blocks (Dao et al. 2022): ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``.

    Returns (B_r, B_c).  B_c sizes each of K_j, V_j, Q_i, O_i to about M / 4 elements; the cap
    B_r <= d keeps the score tile S_ij (B_r x B_c) within d * M / 4d = M / 4 too.
    """
    M, d = check_int(M, "M", minimum=1), check_int(d, "d", minimum=1)
    B_c = _ceil_div(M, 4 * d)
    return min(B_c, d), B_c


def sram_footprint(order: str, B_r: int, B_c: int, d: int, *, d_v: int | None = None,
                   n_q: int | None = None, n_k: int | None = None) -> dict[str, int]:
    """Elements one step of ``order`` holds in SRAM, per array (its peak step).

    "v1" and "v2": K_j, V_j, Q_i, O_i, l_i, m_i and the score tile S_ij (P~_ij overwrites it):
    ``B_c (d + d_v) + B_r (d + d_v + 2) + B_r B_c``, the same for both orders (v2 keeps O_i,
    l_i, m_i on chip where v1 loads them).  "backward": K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i,
    L_i, D_i and two tiles (P_ij; dP_ij overwritten by dS_ij).  "two_pass_backward": the same
    blocks but one pass's accumulators at a time, dK_j and dV_j (pass 1) or dQ_i (pass 2),
    whichever is larger; the entries of the other are 0.  With n_q, n_k given, a block is at
    most the problem (min(B, n) rows), as in a run.  Sum the values for the total.
    """
    d = check_int(d, "d", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    b_r, b_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    if n_q is not None:
        b_r = min(b_r, check_int(n_q, "n_q", minimum=1))
    if n_k is not None:
        b_c = min(b_c, check_int(n_k, "n_k", minimum=1))
    if order in ("v1", "v2"):
        return {"K_j": b_c * d, "V_j": b_c * d_v, "Q_i": b_r * d, "O_i": b_r * d_v,
                "l_i": b_r, "m_i": b_r, "S_ij": b_r * b_c}
    if order == "backward":
        return {"K_j": b_c * d, "V_j": b_c * d_v, "dK_j": b_c * d, "dV_j": b_c * d_v,
                "Q_i": b_r * d, "dO_i": b_r * d_v, "dQ_i": b_r * d, "L_i": b_r, "D_i": b_r,
                "S_ij": 2 * b_r * b_c}
    if order == "two_pass_backward":
        pass1 = b_c * (d + d_v) >= b_r * d  # the peak step is pass 1's
        return {"K_j": b_c * d, "V_j": b_c * d_v, "dK_j": b_c * d if pass1 else 0,
                "dV_j": b_c * d_v if pass1 else 0, "Q_i": b_r * d, "dO_i": b_r * d_v,
                "dQ_i": 0 if pass1 else b_r * d, "L_i": b_r, "D_i": b_r,
                "S_ij": 2 * b_r * b_c}
    raise ValueError(f"order must be 'v1', 'v2', 'backward' or 'two_pass_backward', "
                     f"got {order!r}")


def block_sizes(M: int, d: int, order: str = "v1", *, rule: str = "paper",
                d_v: int | None = None) -> tuple[int, int]:
    """(B_r, B_c) for an SRAM of ``M`` elements.

    rule="paper": Algorithm 1's ``b = ceil(M / 4d)`` for the outer loop's block and
    ``min(b, d)`` for the inner one: (min(b, d), b) for "v1" and the backward orders (outer
    loop over keys), (b, min(b, d)) for "v2" (its outer loop runs over queries:
    FlashAttention-2 tunes its blocks instead of deriving them from M; this gives its outer
    block the role Algorithm 1 gives its own).  The paper's sizes are right up to a constant
    factor: a step's :func:`sram_footprint` exceeds M when M is small (one row of each of
    K_j, V_j, Q_i, O_i is already 4d elements, so at M = d about 4 times M) and from about
    8 d^2 on only by the rounding of the ceiling; Theorem 2's Theta absorbs the factor.
    rule="fit": the paper's blocks when their step fits in M, else the largest smaller ``b``
    of the same shape that does; ValueError when not even b = 1 fits.
    """
    M, d = check_int(M, "M", minimum=1), check_int(d, "d", minimum=1)
    if order not in TILED:
        raise ValueError(f"order must be one of {TILED}, got {order!r}")
    if rule not in ("paper", "fit"):
        raise ValueError(f"rule must be 'paper' or 'fit', got {rule!r}")

    def shape(b: int) -> tuple[int, int]:
        return (b, min(b, d)) if order == "v2" else (min(b, d), b)

    b = _ceil_div(M, 4 * d)
    if rule == "paper":
        return shape(b)
    while b >= 1:
        if sum(sram_footprint(order, *shape(b), d, d_v=d_v).values()) <= M:
            return shape(b)
        b -= 1
    need = sum(sram_footprint(order, 1, 1, d, d_v=d_v).values())
    raise ValueError(f"M = {M} elements cannot hold one step of {order!r} with d = {d}: "
                     f"even 1 x 1 blocks need {need}")


def io_count(N: int, d: int, M: int | None, order: str, *, rule: str = "paper",
             causal: bool | str = False) -> int:
    """Elements moved (read + written) for self-attention over N rows, head dimension d, with
    the blocks :func:`block_sizes` derives from M ("standard" ignores M)."""
    if order == "standard":
        return traffic("standard", N, N, d).total
    B_r, B_c = block_sizes(M, d, order, rule=rule)
    return traffic(order, N, N, d, B_r=B_r, B_c=B_c, causal=causal).total


def theorem2(N: int, d: int, M: int) -> dict[str, float]:
    """Theorem 2's orders of growth with their constants dropped: standard attention
    Theta(N d + N^2), FlashAttention Theta(N^2 d^2 / M) (for d <= M <= N d).  Proposition 3:
    no exact algorithm does asymptotically better than N^2 d^2 / M for all M in [d, N d]."""
    N, d, M = (check_int(x, name, minimum=1) for name, x in (("N", N), ("d", d), ("M", M)))
    return {"standard": float(N * d + N * N), "flash": N * N * d * d / M}


def minimum_traffic(n_q: int, n_k: int, d: int, d_v: int | None = None) -> int:
    """The floor of any exact algorithm: read Q, K, V and write O once each (4 N d when
    n_q = n_k = N and d_v = d).  Sizes: non-negative integers of any size (Python or numpy)."""
    n_q, n_k, d = (check_int(x, name, minimum=0) for x, name in ((n_q, "n_q"), (n_k, "n_k"),
                                                                (d, "d")))
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=0)
    return n_q * d + n_k * d + n_k * d_v + n_q * d_v


def crossover_M(N: int, d: int, order: str = "v1") -> int | None:
    """The smallest M in [d, N d] from which on (every M' >= M up to N d) ``order`` with the
    paper's blocks moves at most as many elements as standard attention; None if none does.
    Below it, tiling moves more than it saves."""
    N, d = check_int(N, "N", minimum=1), check_int(d, "d", minimum=1)
    standard = io_count(N, d, None, "standard")
    answer = None
    b_max = _ceil_div(N * d, 4 * d)
    for b in range(b_max, 0, -1):  # the blocks change only when ceil(M / 4d) does
        M_low = max(d, 4 * d * (b - 1) + 1)  # the smallest M with this b (within [d, N d])
        if io_count(N, d, M_low, order) > standard:
            break
        answer = M_low
    return answer


#: The book's one SRAM budget, bytes: the most shared memory one A100 SM can give kernels,
#: 164 KB (NVIDIA's Ampere tuning guide; NVIDIA's KB are 1,024 bytes).  The 192 KB per SM that
#: the FlashAttention paper calls SRAM is the L1 cache and the shared memory together, so a
#: kernel never gets all of it.  Every chapter, figure and exercise that asks whether a step
#: "fits in SRAM" asks it of this number (and says so with :data:`SRAM_BUDGET_NAME`).
A100_SHARED_MEMORY = 164 * 1024

#: How the book names that budget in prose, figures and captions.
SRAM_BUDGET_NAME = "164 KiB of shared memory per A100 SM"

#: The most shared memory one thread block can have on an A100, bytes: 163 KB (the CUDA
#: guide reserves 1 KB per block of the SM's 164).
A100_SHARED_PER_BLOCK = 163 * 1024

#: The same for the H100 (Hopper tuning guide): 228 KB per SM, 227 KB per thread block.
H100_SHARED_MEMORY = 228 * 1024

#: The register file of one SM on the A100 and the H100, bytes: 65,536 32-bit registers
#: (CUDA C++ Programming Guide, compute capability tables), at most 255 per thread.  In
#: FlashAttention-2 and Triton kernels S_ij, P_ij, the accumulator and m, l live here.
REGISTERS_PER_SM = 65536 * 4


class GPU(NamedTuple):
    """A GPU's figures, each from a cited public source (bibliography keys in ``sources``).

    matmul_flops: dense FP16/BF16 tensor-core FLOP/s (no sparsity); bandwidth: HBM bytes/s;
    sram_per_sm: bytes of shared memory one SM can give kernels (the book's SRAM budget: not
    the L1 cache and shared memory together); sms: number of SMs.
    """

    name: str
    matmul_flops: float
    bandwidth: float
    sram_per_sm: int
    sms: int
    sources: str


#: The GPUs the IO-model chapter uses.  A100: FlashAttention's Section 2.1 (1.5-2.0 TB/s,
#: 108 SMs), FlashAttention-2 (312 TFLOPs/s FP16/BF16 matmul) and the Ampere tuning guide
#: (164 KB of shared memory per SM, of the 192 KB of L1 and shared memory the paper calls
#: SRAM); the two bandwidths are the ends of the paper's range.  H100 SXM and H200 SXM:
#: NVIDIA's product specifications (3.35 TB/s; 4.8 TB/s), FlashAttention-3 (989 TFLOPS FP16
#: matmul), the Hopper tuning guide (228 KB of shared memory per SM); 132 SMs (NVIDIA).
GPUS: dict[str, GPU] = {
    "A100 (1.5 TB/s)": GPU("NVIDIA A100", 312e12, 1.5e12, A100_SHARED_MEMORY, 108,
                           "dao2022flashattention, dao2023flashattention2, "
                           "nvidia_ampere_tuning"),
    "A100 (2.0 TB/s)": GPU("NVIDIA A100", 312e12, 2.0e12, A100_SHARED_MEMORY, 108,
                           "dao2022flashattention, dao2023flashattention2, "
                           "nvidia_ampere_tuning"),
    "H100 SXM": GPU("NVIDIA H100 SXM", 989e12, 3.35e12, H100_SHARED_MEMORY, 132,
                    "nvidia_h100, shah2024flashattention3, nvidia_hopper_tuning"),
    "H200 SXM": GPU("NVIDIA H200 SXM", 989e12, 4.8e12, H100_SHARED_MEMORY, 132,
                    "nvidia_h200, shah2024flashattention3, nvidia_hopper_tuning"),
}


#: The A100's HBM capacity range, bytes (FlashAttention, Section 2.1: 40-80 GB).
A100_HBM_BYTES = (40e9, 80e9)


#: The A100's on-chip SRAM bandwidth, bytes/s (FlashAttention, Section 2.1: "estimated"
#: about 19 TB/s).
A100_SRAM_BANDWIDTH = 19e12


def ridge_point(gpu: GPU) -> float:
    """FLOPs per byte above which a kernel is compute-bound: peak FLOP/s / bandwidth."""
    return gpu.matmul_flops / gpu.bandwidth


def attention_flops(n_q: int, n_k: int, d: int, *, causal: bool = False) -> float:
    """Forward FLOPs as the benchmarks count them: 4 n_q n_k d (Q K^T and P V, a multiply
    and an add each), halved when causal."""
    flops = 4.0 * n_q * n_k * d
    return flops / 2 if causal else flops


def roofline(gpu: GPU, flops: float, bytes_moved: float) -> dict[str, Any]:
    """The roofline's verdict: the time the FLOPs alone and the traffic alone would take, the
    larger of the two (a lower bound on the kernel's time), and which one binds."""
    t_compute, t_memory = flops / gpu.matmul_flops, bytes_moved / gpu.bandwidth
    return {"compute_s": t_compute, "memory_s": t_memory, "time_s": max(t_compute, t_memory),
            "bound": "memory" if t_memory > t_compute else "compute",
            "intensity": flops / bytes_moved if bytes_moved else math.inf,
            "ridge": ridge_point(gpu)}
