"""The GPU chapter's first kernel (flashlib.gpu.primer), in Triton's interpreter without a GPU:
rows normalised on strided views and ragged widths; bad input refused by name."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch", reason="the first kernel needs torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("the first kernel needs triton", allow_module_level=True)

import flashlib.gpu  # noqa: E402  (before triton: TRITON_INTERPRET=1 without a GPU)

CAPS = flashlib.gpu.capabilities()
pytestmark = pytest.mark.skipif(not CAPS.triton, reason=" ".join(CAPS.notes[:1]))

from flashlib.gpu.primer import normalize_rows  # noqa: E402


@pytest.mark.parametrize(("rows", "cols", "width"), [(5, 10, 16), (1, 1, 1), (3, 17, 40)])
def test_normalize_rows_on_a_strided_view(rows, cols, width):
    wide = torch.rand(rows, width, generator=torch.Generator().manual_seed(0)) + 0.1
    x = wide[:, :cols].to(CAPS.device)
    y = normalize_rows(x)
    torch.testing.assert_close(y, x / x.sum(1, keepdim=True), rtol=1e-6, atol=1e-7)


def test_normalize_rows_refuses_bad_input_by_name():
    with pytest.raises(TypeError, match="x: expected a float32"):
        normalize_rows(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="x: expected a 2-D tensor"):
        normalize_rows(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="contiguous columns"):
        normalize_rows(torch.ones(4, 3).T)
