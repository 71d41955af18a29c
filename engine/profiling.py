"""Named ranges around the phases of a step, for torch.profiler (`labkit bench --profile` reads them).

`@phase("engine::schedule")` wraps a method in `torch.profiler.record_function` only while a profiler is
recording. Otherwise the call costs one flag check: record_function itself is not free when no profiler
runs (it enters the dispatcher on every call, tens of microseconds on a busy host), and the hot loop calls
these methods on every step.
"""
from __future__ import annotations

import functools

from torch.autograd import profiler as _autograd_profiler
from torch.profiler import record_function


def phase(name: str):
    def wrap(fn):
        @functools.wraps(fn)
        def ranged(*args, **kwargs):
            if not _autograd_profiler._is_profiler_enabled:
                return fn(*args, **kwargs)
            with record_function(name):
                return fn(*args, **kwargs)
        return ranged
    return wrap
