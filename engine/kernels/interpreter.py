"""Running our Triton kernels on a CPU, in Triton's interpreter (tests and `kernel_bench.py --dry-run`).

TRITON_INTERPRET=1 must be in the environment before triton is first imported; then call patch_interpreter().
"""
from __future__ import annotations

import os


def script_device(dry_run: bool) -> str | None:
    """A kernel benchmark script's device: "cpu" under --dry-run (Triton's interpreter, set up before triton is
    imported), "cuda" when a GPU is visible, None when there is neither."""
    if dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        patch_interpreter()
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else None


def patch_interpreter() -> None:
    """Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound with int(array),
    which numpy >= 2.4 refuses; take the element instead. Touches the interpreter only."""
    try:
        import triton.runtime.interpreter as interp
    except ImportError:
        return
    if getattr(interp, "_labkit_patched", False):
        return
    patch_tensor = interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = _patch_lang_tensor
    interp._labkit_patched = True
