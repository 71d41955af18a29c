"""labkit and scripts/ reach the engine through its public API only (`LLM(...)`, add_request, step() ->
StepResult, generate, limits, stats(), the resolved settings, read_kv, per-rank reports), never its
scheduler, model runner, block manager, sequence table or tensor-parallel handle: the engine may change
those freely. Tests may look inside; they are not scanned."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Engine attributes that are its insides. The names are the engine's own, so an attribute of that name
# anywhere in labkit/ or scripts/ is a read of the engine's insides.
INTERNALS = {"scheduler", "model_runner", "block_manager", "_seqs", "executor"}


def engine_private_names(engine_dir: Path = REPO / "engine") -> set[str]:
    """The private attributes and methods of the engine's classes (`self._x = ...`, `def _x`): reading one of
    them on an engine object from outside the engine is reading its insides."""
    names = set()
    for path in engine_dir.rglob("*.py"):
        for cls in (n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = node.name
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    name = node.attr
                else:
                    continue
                if name.startswith("_") and not name.startswith("__"):
                    names.add(name)
    return names


def internal_reads(source: str, name: str = "<src>", internals: set[str] = INTERNALS) -> list[str]:
    """`x.scheduler`-style attribute reads (of anything but the file's own `self`/`cls`) and
    `getattr(x, "scheduler")`-style calls, as "file:line: .attr"."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        attr = None
        if isinstance(node, ast.Attribute) and node.attr in internals \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            attr = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in internals:
            attr = node.args[1].value
        if attr is not None:
            found.append((node.lineno, attr))
    return [f"{name}:{line}: .{attr}" for line, attr in sorted(found)]


def test_labkit_and_scripts_use_the_public_engine_api_only():
    files = sorted(p for d in ("labkit", "scripts") for p in (REPO / d).rglob("*.py"))
    assert len(files) > 50
    internals = INTERNALS | engine_private_names()
    assert {"_loop", "_step_loop", "_closed", "_ring"} <= internals  # LLMEngine's and staging's private names are seen
    found = [hit for p in files for hit in internal_reads(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)),
                                                          internals)]
    assert not found, "engine internals read outside the engine:\n" + "\n".join(found)


def test_the_scan_sees_attribute_reads_and_getattr():
    src = ("def f(llm):\n    pool = llm.model_runner.kv_cache\n    n = getattr(llm, '_seqs', {})\n"
           "    return llm.config.max_num_seqs, llm.stats()['free_blocks']\n")
    assert internal_reads(src) == ["<src>:2: .model_runner", "<src>:3: ._seqs"]
    private = ("class Client:\n    def go(self, llm):\n        self._closed = True\n"
               "        return llm._closed, self._seqs\n")
    assert internal_reads(private, internals=INTERNALS | {"_closed"}) == ["<src>:4: ._closed"]
