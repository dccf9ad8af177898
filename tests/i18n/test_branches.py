"""Sentences the chapters choose by what this machine measured (a speed-up, a load average,
which side of the ridge, what torch returns) are translated in every branch, not only in the
one the machine that last built the book took. One built on another machine (CI) takes
another branch: a missing branch leaves an English paragraph on a Japanese page.

Each sentence below is one branch with made-up numbers; its first words must still be in a
chapter, so that a reworded branch fails here rather than on a slower machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashlib.book.i18n import template, translate

BOOK = Path(__file__).resolve().parents[2] / "book"

LOAD = [
    ("The load average was 3.2 on 2 cores while this page was built (other programs "
     "running),"),
    "Other programs may have been running,",
]
BRANCHES = [
    ("This machine has one core, so rung 4 runs on one thread, like rung 3 (their ratio "
     "here, 1.02, is noise)."),
    ("On the 2 cores of this machine rung 4 ran 1.81 times as fast as rung 3 (wall clock, "
     "medians of 7 round-robin runs). That is close to the number of cores."),
    ("On the 2 cores of this machine rung 4 ran 1.31 times as fast as rung 3 (wall clock, "
     "medians of 7 round-robin runs). That is below the number of cores: the cores share "
     "the memory bandwidth and the last-level cache, Python's lock serialises the "
     "statements between numpy calls, and other programs running at the same time take "
     "their share."),
    "real",
    "slower",
    "within noise",
    "faster than the rung above",
    "within the noise",
    "right of the ridge, so compute-bound here",
    "left of the ridge, so limited by memory bandwidth here",
    ("and everything else (Python, the exact first tile of each row block, reading K and "
     "V from memory once per row block) about 12 ms"),
    ("which together already exceed the whole run, so the rest (Python, the exact first "
     "tiles, reading K and V from memory) cannot be told apart from the noise"),
    "faster than",
    "slower than",
    ("causal `flash_attention` ran 1.50 times as fast as non-causal at n = 512 and 1.70 "
     "times as fast as it at n = 1024 (the tile counts allow up to 1.88 and 1.94 times)"),
    ("causal `flash_attention` ran no faster than (0.98 times) non-causal at n = 512 and "
     "no faster than (0.99 times) it at n = 1024 (the tile counts allow up to 1.88 and "
     "1.94 times)"),
    ("causal `flash_attention` ran 1.50 times as fast as non-causal at n = 512 and no "
     "faster than (0.99 times) it at n = 1024 (the tile counts allow up to 1.88 and 1.94 "
     "times)"),
    ("causal `flash_attention` ran no faster than (0.98 times) non-causal at n = 512 and "
     "1.70 times as fast as it at n = 1024 (the tile counts allow up to 1.88 and 1.94 "
     "times)"),
    ("causal `flash_attention` ran 1.70 times as fast as non-causal here, while causal "
     "`naive_attention`, which masks after computing every score, took 1.01 times its "
     "non-causal time"),
    ("causal `flash_attention` ran no faster than (0.99 times) non-causal here, while "
     "causal `naive_attention`, which masks after computing every score, took 1.01 times "
     "its non-causal time"),
    (" (These times disagree with the tile counts: the machine that built this page was "
     "busy; run the cell again to measure yours.)"),
    "PyTorch 2.13.0+cpu's SDPA on the CPU returns NaN",
    "PyTorch 2.13.0+cpu's SDPA on the CPU returns zeros",
    "PyTorch 2.13.0+cpu's SDPA on the CPU returns neither NaN nor zeros",
    "torch's autograd agrees to 1e-15",
    ("PyTorch's backward alone took 35 ms, so `flash_attention_backward` took 2.10 times "
     "PyTorch's time"),
    ("`flash_attention` takes 3.10 times its time (one thread, backend `FLASH_ATTENTION`; "
     "the roofline below compares the two against their libraries' peaks)"),
    ("torch brings its own matrix library (`mkl` here) and its own fused attention "
     "kernel; its sgemm peak on this core is 95 GFLOP/s, 1.10 times numpy's. Its point "
     "sits at 120% of numpy's peak, above numpy's roof: a roof is a property of one "
     "library's matmul, not of the machine, and torch's is higher. Against its own "
     "library's peak, torch's SDPA reaches 50%, and `flash_attention` reaches 20% of its "
     "own (numpy's)"),
    ("torch brings its own matrix library (`mkl` here) and its own fused attention "
     "kernel; its sgemm peak on this core is 95 GFLOP/s, 1.10 times numpy's. Its point "
     "sits at 80% of numpy's peak, below numpy's roof. Against its own library's peak, "
     "torch's SDPA reaches 50%, and `flash_attention` reaches 20% of its own (numpy's)"),
    ("PyTorch's cast of 500 to e4m3 gives 448: it saturates, where ml_dtypes gives NaN. "
     "Two libraries, two conventions for the same format."),
    "PyTorch's cast of 500 to e4m3 gives nan, as ml_dtypes does.",
]
for load in LOAD:  # the two branches that say how busy the machine was
    BRANCHES += [
        ("On the 2 cores of this machine rung 4 was not measurably faster than rung 3 "
         f"(ratio 1.01, wall clock). {load} so the extra threads found no free core to run "
         "on. On an idle machine, run this cell again."),
        ("On the 2 cores of this machine rung 4 was slower than rung 3: it took 1.20 "
         f"times as long (wall clock). {load} so the threads only took turns on the same "
         "cores and added the cost of switching between them. On an idle machine, run "
         "this cell again."),
    ]

def _source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(BOOK.glob("*.md")))


@pytest.mark.parametrize("sentence", BRANCHES, ids=lambda s: template(s)[0][:60])
def test_every_branch_is_translated(sentence: str) -> None:
    head = re.split(r"[0-9`({]", sentence.strip(), maxsplit=1)[0].strip()
    assert head in _source(), f"no chapter says {head!r} any more: update this test"
    assert translate(sentence, "ja") != sentence, (
        f"no translation of {template(sentence)[0]!r} in flashlib/book/locale/ja/*.json")
