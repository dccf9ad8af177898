"""Largest errors of every forward and backward function against float64, per dtype.

Uses the test suite's independent float64 reference (tests/helpers.py) and torch autograd.
Run from the repository root: .venv/bin/python -m tests.max_errors
"""

from __future__ import annotations

import argparse

import numpy as np

from flashlib import (
    flash_attention,
    flash_attention_backward,
    flash_attention_v1,
    naive_attention,
    naive_attention_backward,
)
from tests.helpers import make_mask, make_qkv, reference_attention, torch_grads

# lead, n_q, n_k, d, block_q, block_k, causal, mask kind
CASES = [
    ((), 100, 100, 16, 32, 32, False, None),
    ((2, 3), 301, 457, 64, 64, 128, True, "random"),
    ((2,), 77, 50, 128, 16, 8, "bottom_right", "key_padding"),
    ((), 1, 1, 1, 64, 64, False, None),
    ((4,), 200, 200, 64, 64, 64, True, None),
]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rng = np.random.default_rng(0)
    worst: dict[tuple[str, str], float] = {}
    for dtype in (np.float64, np.float32, np.float16):
        for lead, n_q, n_k, d, b_q, b_k, causal, kind in CASES:
            q, k, v = make_qkv(rng, lead, n_q, n_k, d, dtype=dtype)
            mask = make_mask(rng, kind, lead, n_q, n_k)
            opts = {"causal": causal, "mask": mask}
            tiles = {"block_q": b_q, "block_k": b_k}
            ref, _ = reference_attention(q, k, v, **opts)
            o, lse = flash_attention(q, k, v, **opts, **tiles, return_lse=True)
            outs = {
                "naive_attention": naive_attention(q, k, v, **opts),
                "flash_attention_v1": flash_attention_v1(q, k, v, **opts, **tiles),
                "flash_attention": o,
            }
            do = rng.standard_normal(o.shape).astype(dtype)
            g_ref = torch_grads(q, k, v, do, **opts)[1:]
            grads = {
                "naive_attention_backward": naive_attention_backward(q, k, v, do, **opts),
                "flash_attention_backward": flash_attention_backward(
                    q, k, v, o, lse, do, **opts, **tiles
                ),
            }
            errs = {name: float(np.max(np.abs(x.astype(np.float64) - ref)))
                    for name, x in outs.items()}
            errs |= {name: max(float(np.max(np.abs(a.astype(np.float64) - b)))
                               for a, b in zip(g, g_ref, strict=True))
                     for name, g in grads.items()}
            for name, err in errs.items():
                key = (np.dtype(dtype).name, name)
                worst[key] = max(worst.get(key, 0.0), err)
    for (dtype, name), err in worst.items():
        print(f"{dtype:8s} {name:26s} {err:.2e}")


if __name__ == "__main__":
    main()
