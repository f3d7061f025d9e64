"""Module-level setup of the CUDA test files: torch with a GPU and a library
with a CUDA backend, or the whole module is skipped cleanly."""

import pytest

import flashcore


def torch_with_cuda():
    """The torch module; skips the calling test module when torch, a GPU or
    the library's CUDA backend is missing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch", allow_module_level=True)
    if not flashcore.cuda_available():
        pytest.skip("this libflashcore has no CUDA backend or no device of a compiled architecture",
                    allow_module_level=True)
    return torch
