"""The Beyond chapter's pictures: split-KV decoding, and FlashAttention-3's schedules as
timelines (:func:`flashlib.studies.beyond.fa3_timeline`).
"""

from __future__ import annotations

from flashlib.book.plots import OKABE_ITO
from flashlib.book.svg import WIDTH, Diagram, fmt, size_text
from flashlib.studies.beyond import fa3_timeline

__all__ = ["split_kv_diagram", "fa3_schedule_diagram"]


def split_kv_diagram(N: int, d: int, n_splits: int, itemsize: int) -> Diagram:
    """Split-KV decoding of one query row against a cache of N keys and values (head dimension
    d, ``itemsize`` bytes per number): ``n_splits`` programs (one per SM) each read q and their
    share of K and V from HBM, write a partial result (O_s, L_s), and a merge combines them."""
    share = -(-N // n_splits)
    kv = 2 * share * d * itemsize
    alt = (f"Top: HBM holds the KV cache of {N} keys and values, cut into {n_splits} shares of "
           f"{share} rows ({size_text(kv)} of K and V each). Middle: {n_splits} programs, one per "
           "SM, each read the query row q and one share, and write their output O_s and "
           "logsumexp L_s back to HBM. Bottom: a merge reads the partial results and writes "
           "the output O, weighting each O_s by exp(L_s - L).")
    caption = (f"Split-KV decoding at N = {N}, d = {d}, {n_splits} splits, {itemsize} bytes per "
               "number: the splits run at once on different SMs; only n_splits small partial "
               "results are merged.")
    dg = Diagram(290, alt=alt, caption=caption)
    col = 360 / n_splits
    dg.box(0, 0, 360, 76, "HBM: the KV cache (and q)", fill="blue")
    dg.text(352, 17, f"{N} rows", anchor="end")
    for s in range(n_splits):
        x = s * col
        dg.chip(x + 6, 25, f"K_{s + 1}, V_{s + 1}", size_text(kv), w=col - 12, h=44)
        dg.arrow(x + col / 2, 70, x + col / 2, 108)
        dg.box(x + 4, 110, col - 8, 74, f"SM {s + 1}: q", fill="orange")
        dg.chip(x + 10, 144, f"O_{s + 1}, L_{s + 1}", w=col - 20, h=30, fill="yellow")
        dg.arrow(x + col / 2, 186, 180, 222)
    dg.box(60, 224, 240, 60, "merge", fill="bluish_green")
    dg.text(180, 270, "O = Σ exp(L_s - L) O_s", anchor="middle")
    return dg


def fa3_schedule_diagram(exp_share: float, tiles: int = 2) -> Diagram:
    """Three timelines of one SM on a shared time axis, from
    :func:`flashlib.studies.beyond.fa3_timeline`: one warpgroup doing each step after the last,
    two warpgroups in ping-pong, and one warpgroup pipelining its softmax under its next
    matmuls. ``exp_share``: exponential time over matmul time (the softmax of a tile takes
    ``2 * exp_share`` matmul units); ``tiles``: key tiles per warpgroup."""
    panels = [
        ("serial", "one after the other: one warpgroup", ["warpgroup 1"], ["WG 1"]),
        ("ping-pong", "ping-pong: two warpgroups take turns", ["warpgroup 1", "warpgroup 2"],
         ["WG 1", "WG 2"]),
        ("pipelined", "pipelined inside one warpgroup", ["tensor cores", "softmax"],
         ["matmul", "exp"]),
    ]
    timelines = {name: fa3_timeline(name, exp_share, tiles) for name, *_ in panels}
    span = max(stop for ops in timelines.values() for _, _, stop, _, _ in ops)
    x0, row_h = 58.0, 24.0
    scale = (WIDTH - x0 - 4) / span
    summaries = {}
    for name, ops in timelines.items():
        busy = sum(b - a for _, a, b, kind, _ in ops if kind == "matmul")
        end = max(b for _, _, b, _, _ in ops)
        steps = tiles * (2 if name == "ping-pong" else 1)
        summaries[name] = (f"{steps} tiles in {end:.1f} units, tensor cores busy "
                           f"{busy / end:.0%}")
    alt = (f"Three timelines of one GPU multiprocessor, time running to the right, in units of "
           f"one tile's matmul; a tile's softmax takes {2 * exp_share:.2g} units. One after "
           f"the other: a warpgroup computes Q K transposed, then its softmax, then P V, and "
           f"the tensor cores wait during each softmax ({summaries['serial']}). Ping-pong: two "
           f"warpgroups with their own query rows alternate, one doing its softmax while the "
           f"other does its matmuls ({summaries['ping-pong']}). Pipelined: one warpgroup "
           f"issues the next tile's Q K transposed and the previous tile's P V while it "
           f"computes the softmax of the current tile ({summaries['pipelined']}).")
    caption = (f"FlashAttention-3's overlaps as a schematic timeline (our model, not a measured "
               f"trace): matmuls (blue) on the tensor cores, softmax (orange) on the exp units; "
               f"a softmax takes {2 * exp_share:.2g} matmul units, as computed above.")
    height = 26 + sum(18 + row_h * len(rows) + 20 for *_, rows, _ in panels) + 20
    dg = Diagram(height, alt=alt, caption=caption)
    for k, (kind, text) in enumerate((("matmul", "matmul (tensor cores)"),
                                      ("softmax", "softmax (exp)"))):
        x = 0 if k == 0 else 200
        dg.element("rect", x=fmt(x), y="4", width="14", height="14", rx=2,
               fill=OKABE_ITO["blue" if kind == "matmul" else "vermillion"], fill_opacity=0.4)
        dg.text(x + 19, 16, text)
    y = 26.0
    for name, title, rows, short in panels:
        dg.text(0, y + 13, title, bold=True)
        y += 18
        for row, label in zip(rows, short, strict=True):
            dg.text(0, y + row_h / 2 + 4, label)
            for r, a, b, kind, name_ in timelines[name]:
                if r != row:
                    continue
                fill = OKABE_ITO["blue" if kind == "matmul" else "vermillion"]
                dg.element("rect", x=fmt(x0 + a * scale + 1), y=fmt(y + 2),
                       width=fmt((b - a) * scale - 2), height=fmt(row_h - 4), rx=2,
                       fill=fill, fill_opacity=0.35, stroke=fill, stroke_width=1)
                if (b - a) * scale >= 30:
                    dg.text(x0 + (a + b) / 2 * scale, y + row_h / 2 + 4, name_,
                            anchor="middle")
            y += row_h
        dg.text(x0, y + 14, summaries[name], italic=True)
        y += 20
    dg.element("line", x1=fmt(x0), y1=fmt(y + 2), x2=fmt(WIDTH - 4), y2=fmt(y + 2),
           stroke="currentColor", stroke_width=1, marker_end="url(#flashlib-arrow)")
    dg.text(WIDTH - 4, y + 16, f"time ({span:g} matmul units)", anchor="end")
    return dg
