"""The Precision chapter's diagram and widget table (the only chapter module that needs
``ml_dtypes``, through :mod:`flashlib.studies.precision`).

:func:`precision_diagram`  in which format a FlashAttention-2 kernel keeps each number
:func:`precision_table`    the widget's table: errors of standard and tiled attention per setting
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from flashlib.book.svg import Diagram
from flashlib.core.checks import check_int
from flashlib.studies.precision import (
    Casts,
    ErrorStats,
    as_dtype,
    attention_with_casts,
    error_stats,
    random_inputs,
    round_to,
    spacing,
)

__all__ = ["precision_diagram", "TableRow", "precision_table"]


_SHORT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
          "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def precision_diagram(kept: dict[str, str]) -> Diagram:
    """In which format a FlashAttention-2 kernel keeps each number: ``kept`` maps the cast
    points of :class:`flashlib.studies.precision.Casts` (inputs, S, P, acc, m, l, O, compute) to
    dtype names, e.g. ``dataclasses.asdict(Casts.flash("bfloat16"))``.  HBM holds Q, K, V and O in
    their formats; on chip, the tile S_ij, m_i, l_i and the accumulator O_i stay in theirs, and
    the unnormalised P_ij is rounded to ``kept["P"]`` just before the P V matmul."""
    missing = {"inputs", "S", "P", "acc", "m", "l", "O"} - set(kept)
    if missing:
        raise ValueError(f"kept: missing cast points {sorted(missing)}")
    short = {k: _SHORT.get(v, v) for k, v in kept.items()}
    alt = (f"Two stacked boxes. HBM holds Q, K and V in {kept['inputs']} and the output O in "
           f"{kept['O']}. On chip, the tile of scores S_ij is kept in {kept['S']}, the running "
           f"maximum m_i in {kept['m']}, the running sum l_i in {kept['l']} and the output "
           f"accumulator O_i in {kept['acc']}; the unnormalised probabilities P_ij are rounded to "
           f"{kept['P']} just before the P V matrix product.")
    caption = ("Where the rounding happens: loading Q, K, V, rounding P before P V, and "
               "writing O; the sums that outgrow their terms, l and the accumulator, never "
               "leave a wide format.")
    dg = Diagram(312, alt=alt, caption=caption)

    def labelled(x: float, y: float, name: str, note: str, w: float, fill: str) -> None:
        dg.chip(x, y, "", w=w, h=44, fill=fill)  # name and note spaced for subscripts
        dg.text(x + w / 2, y + 17, name, anchor="middle", bold=True)
        dg.text(x + w / 2, y + 37, note, anchor="middle")

    dg.box(0, 0, 360, 78, "HBM (stored)", fill="blue")
    for k, name in enumerate(("Q", "K", "V")):
        labelled(8 + 52 * k, 26, name, short["inputs"], 46, "sky_blue")
    labelled(300, 26, "O", short["O"], 52, "sky_blue")
    dg.arrow(80, 80, 80, 118)
    dg.text(88, 104, "load", italic=True)
    dg.arrow(326, 118, 326, 80)
    dg.text(318, 104, "write O_i / l_i", anchor="end", italic=True)
    dg.box(0, 120, 360, 192, "On chip (registers and SRAM)", fill="orange")
    labelled(8, 146, "S_ij", f"{short['S']} (QK^T in {short.get('compute', 'fp32')})", 166,
             "orange")
    labelled(186, 146, "P_ij", f"rounded to {short['P']}", 166, "vermillion")
    for k, (name, point) in enumerate((("m_i", "m"), ("l_i", "l"), ("O_i", "acc"))):
        labelled(8 + 118 * k, 202, name, short[point], 110, "bluish_green")
    dg.text(8, 270, "O_i += P_ij V_j: products exact,", italic=True)
    dg.text(8, 290, f"sums kept in {short['acc']}; l_i likewise ({short['l']})", italic=True)
    return dg


class TableRow(NamedTuple):
    """One setting of the chapter's widget and what it shows (errors against float64 of the
    inputs rounded to ``inputs``): standard and tiled attention with the chosen casts, plain
    attention in the input dtype (the 2x line is twice its error) and the spacing of the
    input dtype near max|O| (rounding the output alone errs by up to half of it)."""

    n: int
    block: int
    scale: float
    outlier: float
    inputs: str
    P: str
    acc: str
    standard: ErrorStats
    tiled: ErrorStats
    plain: ErrorStats
    spacing: float


def precision_table(
    *,
    ns: Sequence[int] = (128, 512),
    blocks: Sequence[int] = (16, 128),
    scales: Sequence[float] = (1.0, 4.0),
    outliers: Sequence[float] = (0.0,),
    inputs: Sequence[str] = ("float16", "bfloat16"),
    P: Sequence[str | None] = (None, "float32"),
    acc: Sequence[str] = ("float32", "bfloat16"),
    d: int = 32,
    seed: int = 0,
) -> list[TableRow]:
    """The widget's table: one :class:`TableRow` per combination of the arguments.

    For each setting the kernel keeps what FlashAttention-2 keeps (:meth:`Casts.flash` of the
    input dtype) except for the chosen P and accumulator dtypes (``None`` for P: the input
    dtype); ``l`` follows the accumulator (both are sums kept across key blocks).  Inputs:
    :func:`random_inputs` (n x d, ``np.random.default_rng(seed)``), rounded to the input dtype.
    Standard and plain attention are computed once per setting, whatever the block.
    """
    rows = []
    for n in ns:
        n = check_int(n, "ns", minimum=1)
        for scale in scales:
            for outlier in outliers:
                Q, K, V = random_inputs(n, d, np.random.default_rng(seed), scale=scale,
                                        outlier=outlier)
                for dt_in in inputs:
                    dt_in = as_dtype(dt_in, "inputs").name
                    Qr, Kr, Vr = (round_to(X, dt_in) for X in (Q, K, V))
                    ref = attention_with_casts(Qr, Kr, Vr, Casts.exact(), None)
                    plain = error_stats(
                        attention_with_casts(Qr, Kr, Vr, Casts.plain(dt_in), None), ref)
                    gap = float(spacing(np.max(np.abs(ref)), dt_in))
                    for dt_p in P:
                        dt_p = dt_in if dt_p is None else as_dtype(dt_p, "P").name
                        for dt_acc in acc:
                            dt_acc = as_dtype(dt_acc, "acc").name
                            casts = Casts.flash(dt_in).replace(P=dt_p, acc=dt_acc, l=dt_acc)
                            standard = error_stats(
                                attention_with_casts(Qr, Kr, Vr, casts, None), ref)
                            for b in blocks:
                                b = check_int(b, "blocks", minimum=1)
                                tiled = error_stats(
                                    attention_with_casts(Qr, Kr, Vr, casts, b), ref)
                                rows.append(TableRow(n, b, float(scale), float(outlier),
                                                     dt_in, dt_p, dt_acc, standard, tiled,
                                                     plain, gap))
    return rows
