"""examples/torch_decoder.py on the CPU: the small decoder generates the
same tokens with FlashCore as its attention implementation as with torch's
SDPA (prefill and one-token decode steps over a KV cache). Eager only: its
--compile run costs ~50 s of compilation here, and test_torch_ops.py
covers fullgraph compilation. Skipped without torch."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_decoder.py"


def load_example():
    spec = importlib.util.spec_from_file_location("torch_decoder", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generation_matches_sdpa():
    ids, logits = load_example().compare(steps=16)
    assert ids["flashcore"].shape == ids["sdpa"].shape
    assert torch.equal(ids["flashcore"], ids["sdpa"])
    # float32 end to end: the two attentions differ by rounding only (the
    # logits are O(1); measured ~5e-7).
    assert (logits["flashcore"] - logits["sdpa"]).abs().max().item() <= 1e-4
