"""`labkit doctor`: is this machine ready for the lab? One PASS/WARN/FAIL row per check.

A check never raises: whatever goes wrong becomes a FAIL row with the reason, so one broken
piece (say, the model folder) does not hide what the other checks would say.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Callable

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.options import Device, DeviceOption, JsonOption, ModelOption
from labkit.output import (
    EXIT_FAIL,
    EXIT_PASS,
    configuration_suffix,
    cuda_available,
    envelope,
    evidence_for,
    finish,
    importable_version,
    runs_dir,
    versions,
    write_json,
)

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
MIN_PYTHON = (3, 10)
MIN_TRANSFORMERS = (4, 51)  # the first release that knows model_type qwen3
MIN_FREE_DISK_GB = 5.0
STYLE = {PASS: "bold green", WARN: "bold yellow", FAIL: "bold red"}


def row(check: str, status: str, detail: str) -> dict:
    return {"check": check, "status": status, "detail": detail}


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_python() -> dict:
    ok = sys.version_info[:2] >= MIN_PYTHON
    need = ".".join(map(str, MIN_PYTHON))
    return row("python", PASS if ok else FAIL,
               f"{platform.python_version()} ({sys.executable})" + ("" if ok else f"; need >= {need}"))


def check_torch() -> dict:
    try:
        import torch
    except Exception as exc:
        return row("torch", FAIL, f"cannot import torch: {exc}")
    return row("torch", PASS, f"{torch.__version__} (built for CUDA {torch.version.cuda or 'none: CPU build'})")


def check_cuda(device: str) -> dict:
    if not cuda_available():
        # Without a GPU the lab still runs on the CPU; only an explicit --device cuda cannot.
        status = FAIL if device == "cuda" else WARN
        return row("cuda", status, "no CUDA GPU visible to torch; engine runs on the CPU only")
    import torch

    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(f"{index}: {props.name} {props.total_memory / 2**30:.1f} GiB")
    return row("cuda", PASS, f"CUDA {torch.version.cuda}; " + "; ".join(gpus))


def check_optional(module: str, label: str, on_gpu: bool, needed_on_gpu: bool, why: str) -> dict:
    version = importable_version(module)
    if version is not None:
        return row(label, PASS, version)
    status = FAIL if (on_gpu and needed_on_gpu) else WARN
    return row(label, status, f"{module} not importable; {why}")


def check_transformers() -> dict:
    version = versions().get("transformers")
    if version is None:
        return row("transformers", FAIL, "not installed (needed for the logits reference and the Transformers "
                                         "baseline; the engine runs without it)")
    if _version_tuple(version) < MIN_TRANSFORMERS:
        need = ".".join(map(str, MIN_TRANSFORMERS))
        return row("transformers", FAIL, f"{version}; need >= {need} for Qwen3")
    return row("transformers", PASS, version)


def check_engine() -> dict:
    # Found, not imported: importing the engine loads its kernels (seconds on a GPU box) and `smoke` runs it.
    try:
        spec = importlib.util.find_spec("engine")
    except Exception as exc:
        return row("engine", FAIL, f"cannot look up the engine package: {exc}")
    if spec is None or not spec.origin or not Path(spec.origin).name == "__init__.py":
        return row("engine", FAIL, "no engine package on sys.path (run from the repository, or `pip install -e .`)")
    return row("engine", PASS, f"found in {Path(spec.origin).parent} (not loaded: `labkit smoke` runs it)")


def model_rows(model: str | None) -> tuple[Path | None, list[dict]]:
    """Rows for the model folder, and the folder (None when there is none to check)."""
    from labkit.model import resolve_model

    try:
        path = Path(resolve_model(model))
    except LabkitError as exc:
        return None, [row("model files", FAIL, str(exc))]
    return path, [_guarded("model files", lambda: check_model_files(path)),
                  _guarded("model config", lambda: check_model_config(path))]


def check_model_files(path: Path) -> dict:
    missing = [name for name in ("config.json", "tokenizer.json") if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        return row("model files", FAIL, f"{path}: missing {', '.join(missing)}")
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return row("model files", PASS, f"{path} ({size / 2**20:.1f} MiB of safetensors)")


def check_model_config(path: Path) -> dict:
    from labkit.model import model_info

    try:
        info = dict(model_info(path))
    except Exception as exc:
        return row("model config", FAIL, f"cannot read {path / 'config.json'}: {exc}")
    model_type = info.get("model_type")
    if model_type is None:
        try:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            pass
    dims = ", ".join(
        f"{key}={info[key]}"
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "vocab_size", "dtype")
        if info.get(key) is not None
    )
    if model_type != "qwen3":
        return row("model config", FAIL, f"model_type is {model_type!r}, the engine runs qwen3; {dims}")
    if info.get("has_chat_template") is False:
        return row("model config", WARN, f"qwen3; {dims}; no chat template (smoke formats prompts with it)")
    return row("model config", PASS, f"qwen3; {dims}")


def check_tensor_op(device: str) -> dict:
    """A matmul on the chosen device must agree with the CPU: catches broken drivers/builds."""
    label = f"tensor op ({device})"
    if device == "cuda" and not cuda_available():
        return row(label, FAIL, "no CUDA GPU to run on")
    try:
        import torch

        gen = torch.Generator().manual_seed(0)
        a = torch.randn(256, 256, generator=gen)
        b = torch.randn(256, 256, generator=gen)
        expected = a @ b
        got = (a.to(device) @ b.to(device)).cpu()
    except Exception as exc:
        return row(label, FAIL, f"{type(exc).__name__}: {exc}")
    # Relative to the largest entry: TF32 on a GPU may round, but never by a percent.
    rel = float((got - expected).abs().max() / expected.abs().max())
    ok = bool(torch.isfinite(got).all()) and rel < 1e-2
    return row(label, PASS if ok else FAIL, f"256x256 matmul, max rel. difference vs CPU {rel:.1e}")


def check_disk(folder: Path) -> dict:
    probe = folder.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # RUNS_DIR may not exist yet; its disk is its nearest existing parent's
    try:
        free_gb = shutil.disk_usage(probe).free / 1e9
    except OSError as exc:
        return row("disk", FAIL, f"cannot read free space at {probe}: {exc}")
    status = PASS if free_gb >= MIN_FREE_DISK_GB else WARN
    note = "" if status == PASS else f" (under {MIN_FREE_DISK_GB:.0f} GB: runs and models may not fit)"
    return row("disk", status, f"{free_gb:.1f} GB free for {folder}{note}")


def _guarded(check: str, fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as exc:  # a bug in one check must not hide the others
        return row(check, FAIL, f"{type(exc).__name__}: {exc}")


def collect(model: str | None, device: str) -> tuple[list[dict], Path | None]:
    """All rows, in the order a person reads them, and the model folder that was checked."""
    on_gpu = device == "cuda" or (device == "auto" and cuda_available())
    rows = [
        _guarded("python", check_python),
        _guarded("torch", check_torch),
        _guarded("cuda", lambda: check_cuda(device)),
        _guarded("triton", lambda: check_optional(
            "triton", "triton", on_gpu, needed_on_gpu=True,
            why="needed for the Triton kernels on GPU" if on_gpu else "not needed on the CPU")),
        _guarded("flash_attn", lambda: check_optional(
            "flash_attn", "flash_attn", on_gpu, needed_on_gpu=False,
            why="the flash_attn backend is unavailable (triton/torch backends still work)")),
        _guarded("transformers", check_transformers),
        _guarded("engine", check_engine),
    ]
    try:
        model_dir, found = model_rows(model)
    except Exception as exc:
        model_dir, found = None, [row("model files", FAIL, f"{type(exc).__name__}: {exc}")]
    rows.extend(found)
    run_on = "cuda" if on_gpu else "cpu"
    rows.append(_guarded(f"tensor op ({run_on})", lambda: check_tensor_op(run_on)))
    rows.append(_guarded("disk", lambda: check_disk(runs_dir())))
    return rows, model_dir


def print_table(rows: list[dict], console: Console) -> None:
    table = Table(title="labkit doctor")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    for r in rows:
        table.add_row(r["check"], Text(r["status"], style=STYLE[r["status"]]), Text(r["detail"]))
    console.print(table)


def markdown(result: dict) -> str:
    """doctor.json's twin: the verdict and a row per check."""
    c = result["counts"]
    lines = [f"# labkit doctor: {result['status']}", "",
             f"{c['PASS']} PASS, {c['WARN']} WARN, {c['FAIL']} FAIL on {result['device'].get('type')} "
             f"({result['device'].get('name') or '-'}); command `{' '.join(result.get('argv') or [])}`", "",
             "| check | status | detail |", "| --- | --- | --- |"]
    lines += [f"| {r['check']} | {r['status']} | {r['detail'].replace('|', '/')} |" for r in result["rows"]]
    return "\n".join(lines) + "\n"


def run(model: ModelOption = None, device: DeviceOption = Device.auto, as_json: JsonOption = False) -> None:
    """Check Python, torch, GPU, optional kernels, the model folder and disk space.

    One PASS/WARN/FAIL row per check; the tensor check runs on --device. Exit 1 when a row FAILs.

    Example: labkit doctor --device cpu
    """
    rows, model_dir = collect(model, device.value)
    counts = {s: sum(r["status"] == s for r in rows) for s in (PASS, WARN, FAIL)}
    ok = counts[FAIL] == 0
    used = "cuda" if device is Device.cuda or (device is Device.auto and cuda_available()) else "cpu"
    ran_on = used if cuda_available() else "cpu"
    env = envelope("doctor", device=used, model_dir=model_dir, evidence=evidence_for(ran_on))
    result = finish(env, status=PASS if ok else FAIL, counts=counts, rows=rows)
    # Another --device or --model is a record of its own: a failed try never replaces a good record.
    path = write_json(runs_dir() / f"doctor{configuration_suffix()}.json", result)
    path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")

    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        console = Console()
        print_table(rows, console)
        verdict = Text(PASS if ok else FAIL, style=STYLE[PASS if ok else FAIL])
        console.print(Text.assemble("doctor: ", verdict,
                                    f" ({counts[WARN]} warning(s), {counts[FAIL]} failure(s)); wrote {path} and "
                                    f"{path.with_suffix('.md').name}"))
    raise typer.Exit(EXIT_PASS if ok else EXIT_FAIL)
