"""Integer knobs read from the environment at import (the LABKIT_DECODE_* and sampler variables a device sweep
sets): a value that is not an integer is refused with the variable's name, as an out-of-range one is."""
from __future__ import annotations

import os


def int_knob(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: must be an integer, got {text!r}") from None
