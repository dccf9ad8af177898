"""Why a single-kernel backward needs atomic adds for dQ, simulated in numpy.

In FlashAttention-2's backward (:func:`flashlib.algorithms.flash2_backward`) one program per
key block j runs the inner loop over the query blocks, and each adds its share
``scale * dS_ij @ K_j`` into the same rows ``dQ_i``: ``dQ[i : i + B_r] += ...``.  On a GPU
that line is three steps, a *load* of dQ_i from HBM, an add in registers, a *store* back, and
the programs run at the same time.  If program B loads dQ_i after program A loaded it but
before A stored, B's store overwrites A's: A's share is lost.  An atomic add
(``tl.atomic_add``) makes the three steps one indivisible step of the memory system, so the
shares add up whatever the order (up to the order of the float additions).

:func:`run_schedule` plays programs' read-modify-writes in a given interleaving,
:func:`interleavings` lists every interleaving of their steps, and :func:`race_table` counts
the ones that lose an update.  Triton's interpreter (``TRITON_INTERPRET=1``) runs the programs
of a launch one after another, each to its end (:func:`interpreter_schedule`): no two
read-modify-writes ever overlap there, so a kernel that forgets the atomic add passes every
test in the interpreter and is wrong on the GPU.  That is one reason the book's kernels
(:mod:`flashlib.gpu.kernels`) compute dQ in a kernel of its own, one program per query block,
which writes dQ_i once (the Triton tutorial's schedule; :func:`flashlib.algorithms.
two_pass_backward`).  Needs numpy only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations

import numpy as np

from flashlib.core.checks import check_int

__all__ = ["Step", "run_schedule", "interleavings", "interpreter_schedule", "race_table"]

#: One step of a program: (program, "load" | "store") for a plain ``+=``, or
#: (program, "atomic") for an atomic add (load, add and store as one step).
Step = tuple[int, str]


def run_schedule(shares: np.ndarray, schedule: Sequence[Step],
                 start: np.ndarray | None = None) -> np.ndarray:
    """dQ_i after the programs' steps in ``schedule`` order.

    shares: (P, ...) program p's share of dQ_i (e.g. (P, B_r, d)); start: dQ_i before (zeros
    by default).  A "load" copies dQ_i into the program's registers, a "store" writes back its
    registers plus its share, an "atomic" adds its share to dQ_i in one step.  Each program
    must load before it stores."""
    shares = np.asarray(shares)
    dq = np.zeros(shares.shape[1:], shares.dtype) if start is None else np.array(start)
    registers: dict[int, np.ndarray] = {}
    for program, op in schedule:
        if op == "load":
            registers[program] = dq.copy()  # the load: a copy in registers
        elif op == "store":
            if program not in registers:
                raise ValueError(f"program {program} stores before it loads")
            dq = registers.pop(program) + shares[program]  # add in registers, store
        elif op == "atomic":
            dq = dq + shares[program]  # one indivisible read-modify-write
        else:
            raise ValueError(f"a step is 'load', 'store' or 'atomic', got {op!r}")
    return dq


def interleavings(programs: int) -> Iterator[list[Step]]:
    """Every order of ``programs`` programs' load/store pairs that keeps each program's load
    before its store: (2P)! / 2^P orders (6 for two programs, 90 for three)."""
    programs = check_int(programs, "programs", minimum=1)

    def place(slots: list[int | None], p: int) -> Iterator[list[int | None]]:
        if p == programs:
            yield slots
            return
        free = [k for k, s in enumerate(slots) if s is None]
        for a, b in combinations(free, 2):  # program p's load at a, store at b
            filled = list(slots)
            filled[a], filled[b] = p, p
            yield from place(filled, p + 1)

    for slots in place([None] * (2 * programs), 0):
        seen: set[int] = set()
        order = []
        for p in slots:
            order.append((p, "store" if p in seen else "load"))
            seen.add(p)
        yield order


def interpreter_schedule(programs: int, atomic: bool = False) -> list[Step]:
    """The order Triton's interpreter runs a launch in: program 0 to its end, then program 1,
    ...; every read-modify-write completes before the next begins."""
    programs = check_int(programs, "programs", minimum=1)
    if atomic:
        return [(p, "atomic") for p in range(programs)]
    return [(p, op) for p in range(programs) for op in ("load", "store")]


def race_table(programs: int = 2, B_r: int = 4, d: int = 8, seed: int = 0) -> dict[str, object]:
    """The race counted: over every interleaving of ``programs`` programs adding random
    (B_r, d) shares into one block of dQ, how many end with the right sum (to rounding), how
    many lose at least one update, and the same with atomic adds (always right) and in the
    interpreter's order (right, which is how the interpreter hides the race)."""
    rng = np.random.default_rng(seed)
    shares = rng.standard_normal((programs, B_r, d))
    want = shares.sum(axis=0)

    def right(dq: np.ndarray) -> bool:
        return bool(np.allclose(dq, want, rtol=1e-12, atol=1e-12))

    plain = [right(run_schedule(shares, s)) for s in interleavings(programs)]
    atomic = []
    for s in interleavings(programs):  # atomics in the order of the programs' loads
        order = [(p, "atomic") for p, op in s if op == "load"]
        atomic.append(right(run_schedule(shares, order)))
    return {"programs": programs, "interleavings": len(plain), "plain_right": sum(plain),
            "plain_lost": len(plain) - sum(plain), "atomic_right": sum(atomic),
            "interpreter_right": right(run_schedule(shares, interpreter_schedule(programs)))}
