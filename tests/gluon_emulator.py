"""Runs a Gluon kernel's Python source on the CPU, program by program, in torch: what Triton's interpreter does for
`tl` kernels and does not do for Gluon. Enough of Gluon for engine/kernels/smem_gemv.py: blocked layouts (ignored:
a value is the whole tensor), shared memory with cp.async copies in commit groups, PDL's wait and trigger.

It also checks what the hardware would not report:
- a shared-memory chunk read while the copy group that fills it is still in flight (not yet covered by a
  `wait_group` that leaves only younger groups outstanding) raises EmulationError;
- with PDL, anything the previous kernel writes (the pointers named `dependent`) read, or copied, before the
  program's `griddepcontrol.wait`, and any store before it, raise EmulationError.

    k = emulate(kernel, dependent=("x_ptr", ...)); k[grid](*args, **constexprs, launch_pdl=True); k.programs
"""
from __future__ import annotations

import inspect
import types

import torch


class EmulationError(AssertionError):
    pass


class _DType:
    def __init__(self, element_ty):
        self.element_ty = element_ty


class Ptr:
    """A tensor's flat storage and element offsets (an int, or an int64 tensor of any shape)."""

    def __init__(self, name: str, base: torch.Tensor, offs=0, program=None):
        self.name, self.base, self.offs, self.program = name, base, offs, program

    @property
    def dtype(self):
        return _DType(self.base.dtype)

    def __add__(self, other):
        return Ptr(self.name, self.base, self.offs + other, self.program)

    __radd__ = __add__

    def read(self, what: str, mask=None, other=None) -> torch.Tensor:
        """The values at the offsets (where mask holds; `other` elsewhere, its offsets never touched)."""
        self.program.check_read(self, what)
        offs = torch.as_tensor(self.offs, dtype=torch.int64)
        live = torch.ones_like(offs, dtype=torch.bool) if mask is None else torch.as_tensor(mask).expand(offs.shape)
        used = offs[live]
        if used.numel() and (used.min() < 0 or used.max() >= self.base.numel()):
            raise EmulationError(f"{what} of {self.name} out of bounds: offsets {used.min()}..{used.max()} of "
                                 f"{self.base.numel()}")
        vals = self.base[torch.where(live, offs, 0)]
        return vals if mask is None else torch.where(live, vals, torch.as_tensor(other, dtype=vals.dtype))


class _Shared:
    """A shared-memory allocation [n, ...]; .index(c) is a chunk whose copies land by commit group."""

    def __init__(self, program, dtype, shape, value=None):
        self.program, self.data = program, torch.zeros(shape, dtype=dtype)
        if value is not None:  # (allocated holding a value: stored whole)
            if list(value.shape) != list(shape):
                raise EmulationError(f"a {list(value.shape)} value stored in a {list(shape)} allocation")
            self.data.copy_(value.to(dtype))
        self.group = [None] * shape[0]  # a chunk's commit group while its copies are in flight

    def index(self, c):
        return _Chunk(self, int(c))

    def reinterpret(self, dtype, shape, layout=None):
        """The same bytes seen in another layout (only the layout may differ here: a value is the whole tensor)."""
        if dtype != self.data.dtype or [int(s) for s in shape] != list(self.data.shape):
            raise EmulationError(f"a reinterpret to {dtype} {list(shape)} of a {self.data.dtype} "
                                 f"{list(self.data.shape)} buffer")
        return self

    _reinterpret = reinterpret  # (Triton 3.6's name)


class _Chunk:
    def __init__(self, buf: _Shared, c: int):
        self.buf, self.c = buf, c

    def load(self, layout=None):
        g = self.buf.group[self.c]
        if g is not None and not self.buf.program.landed(g):
            raise EmulationError(f"shared chunk {self.c} read while its copy group {g} may be in flight")
        return self.buf.data[self.c].clone()

    def store(self, value):
        self.buf.data[self.c] = value.to(self.buf.data.dtype)
        self.buf.group[self.c] = None


class _Program:
    """One program's state: its ids, its copy groups, whether it has passed its PDL wait."""

    def __init__(self, pid: tuple, pdl: bool, dependent: set):
        self.pid, self.pdl, self.dependent = pid, pdl, dependent
        self.waited = not pdl
        self.open_group = []        # chunks copied since the last commit
        self.groups = 0             # commit groups made
        self.landed_below = 0       # groups [0, landed_below) have landed
        self.events = []

    def check_read(self, ptr: Ptr, what: str):
        if not self.waited and ptr.name in self.dependent:
            raise EmulationError(f"{what} of {ptr.name} before the PDL wait: the previous kernel may not have "
                                 "written it")

    def landed(self, group: int) -> bool:
        return group < self.landed_below


def _namespaces(program_ref: list):
    """The `gl`, `cp` and helper substitutes, bound to the running program (program_ref[0])."""
    def prog() -> _Program:
        return program_ref[0]

    def load(ptr: Ptr, mask=None, other=None, cache_modifier="", **_):
        return ptr.read("a load", mask, 0 if other is None else other)

    def store(ptr: Ptr, value, mask=None, **_):
        p = prog()
        if not p.waited:
            raise EmulationError(f"a store to {ptr.name} before the PDL wait")
        ptr.base[torch.as_tensor(ptr.offs, dtype=torch.int64)] = value.to(ptr.base.dtype)

    def copy(chunk: _Chunk, ptr: Ptr, mask=None, cache_modifier="", **_):
        p = prog()
        chunk.buf.data[chunk.c] = ptr.read("a cp.async copy").to(chunk.buf.data.dtype)
        chunk.buf.group[chunk.c] = p.groups  # the group the next commit closes
        p.open_group.append(chunk)

    def commit_group():
        p = prog()
        p.groups += 1
        p.open_group = []

    def wait_group(num_outstanding=0):
        p = prog()
        if p.open_group:
            raise EmulationError("a wait with copies not yet committed to a group")
        p.landed_below = max(p.landed_below, p.groups - int(num_outstanding))

    def gdc_wait():
        prog().waited = True
        prog().events.append("wait")

    def gdc_launch_dependents():
        prog().events.append("trigger")

    def layout(*args, **kwargs):
        return None

    gl = types.SimpleNamespace(
        float32=torch.float32, float16=torch.float16, bfloat16=torch.bfloat16, int32=torch.int32, int64=torch.int64,
        constexpr=lambda v: v, BlockedLayout=layout, SliceLayout=layout, SwizzledSharedLayout=layout,
        program_id=lambda axis: prog().pid[axis],
        arange=lambda start, end, layout=None: torch.arange(int(start), int(end)),
        zeros=lambda shape, dtype, layout=None: torch.zeros([int(s) for s in shape], dtype=dtype),
        allocate_shared_memory=lambda dtype, shape, layout, value=None: _Shared(prog(), dtype,
                                                                                [int(s) for s in shape], value),
        static_range=lambda *a: range(*[int(x) for x in a]), load=load, store=store,
        sum=lambda x, axis: torch.sum(x, dim=axis), rsqrt=torch.rsqrt, exp=torch.exp, sqrt=torch.sqrt,
        exp2=torch.exp2, maximum=torch.maximum, cdiv=lambda a, b: (a + b - 1) // b,
        where=torch.where)
    cp = types.SimpleNamespace(commit_group=commit_group, wait_group=wait_group)
    return gl, cp, copy, gdc_wait, gdc_launch_dependents


def _python(fn, env: dict, seen: dict):
    """The plain Python function behind a gluon.jit function, its globals replaced by env (helpers too)."""
    raw = getattr(fn, "fn", fn)
    if raw in seen:
        return seen[raw]
    g = dict(raw.__globals__)
    for name, val in raw.__globals__.items():  # (a module's constexpr constants as plain values)
        if type(val).__name__ == "constexpr":
            g[name] = val.value
    g.update(env)
    out = types.FunctionType(raw.__code__, g, raw.__name__, raw.__defaults__, raw.__closure__)
    seen[raw] = out
    for name, val in raw.__globals__.items():
        if name not in env and hasattr(val, "fn") and inspect.isfunction(getattr(val, "fn", None)):
            g[name] = _python(val, env, seen)
    return out


class emulate:
    """emulate(kernel, dependent=names)[grid](args..., constexprs..., launch_pdl=...): every program run in turn, the
    arguments' tensors (contiguous) written in place as the kernel writes them; `programs` then holds each
    program's PDL events ("wait", "trigger") in order."""

    def __init__(self, kernel, dependent: tuple = ()):
        self.kernel, self.dependent, self.programs = kernel, set(dependent), []

    def __getitem__(self, grid):
        def run(*args, launch_pdl: bool = False, enable_fp_fusion=None, num_warps=4, **kwargs):
            raw = getattr(self.kernel, "fn", self.kernel)
            params = inspect.signature(raw).parameters
            bound = dict(zip(params, args))
            bound.update(kwargs)
            if "num_warps" in params:
                bound["num_warps"] = num_warps
            ref = [None]
            gl, cp, copy, wait, trigger = _namespaces(ref)
            fn = _python(self.kernel, {"gl": gl, "cp": cp, "_copy": copy, "_gdc_wait": wait,
                                       "_gdc_launch_dependents": trigger}, {})
            self.programs = []
            g = tuple(grid) + (1,) * (3 - len(grid))
            for pid in ((a, b, c) for a in range(g[0]) for b in range(g[1]) for c in range(g[2])):
                ref[0] = p = _Program(pid, launch_pdl, self.dependent)
                call = {}
                for k, v in bound.items():
                    if isinstance(v, torch.Tensor):
                        assert v.is_contiguous(), k
                        v = Ptr(k, v.view(-1), 0, p)
                    call[k] = v
                fn(**call)
                self.programs.append(p)
        return run
