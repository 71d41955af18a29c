"""What every command's JSON carries (SPEC section 7), the exit codes, and where a run goes (device).

Every command that measures or checks builds `envelope(...)` before it starts, `finish(...)`
when it ends, and `write_json(runs_dir() / "NAME.json", ...)`. Nothing here may fail because
an optional package or git is missing: provenance is best effort, the measurement is not.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.config import DEVICES
from labkit import __version__
from labkit.errors import LabkitError

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_CANNOT_RUN = 2

EVIDENCE_KINDS = ("gpu-measured", "cpu-executed", "static-estimate", "simulated")


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def resolve_device(device: str | enum.Enum) -> str:
    """auto -> cuda when a GPU is visible, else cpu. Asking for cuda without one cannot run."""
    name = str(device.value if isinstance(device, enum.Enum) else device)
    if name not in DEVICES:
        raise LabkitError(f"--device must be one of {', '.join(DEVICES)}, not {name!r}")
    if name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if name == "cuda" and not cuda_available():
        raise LabkitError("--device cuda was asked for but no CUDA GPU is visible to torch")
    return name


def evidence_for(device: str) -> str:
    """Runs on a GPU measure; runs on the CPU only show that the code path executes."""
    return "gpu-measured" if str(device).startswith("cuda") else "cpu-executed"


def importable_version(module: str) -> str | None:
    """The version of an optional package that imports here (doctor's question), else None."""
    # find_spec first: importing a missing optional GPU package must stay cheap and silent.
    try:
        if importlib.util.find_spec(module) is None:
            return None
        mod = importlib.import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def _installed_version(module: str) -> str | None:
    """The version of an optional package for provenance: the imported module's, else its installed metadata's
    (importing triton only to name it would cost a command that never uses it a third of a second)."""
    if module in sys.modules:
        return str(getattr(sys.modules[module], "__version__", "unknown"))
    try:
        return importlib.metadata.version(module) if importlib.util.find_spec(module) is not None else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def dist_version(dist: str) -> str | None:
    """An installed distribution's version, or None. Reading package metadata avoids importing the package
    (transformers takes seconds) just to name its version."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_versions() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built for. A command that has not imported torch (principles, report,
    ...) reads them from torch/version.py, run on its own: importing torch only to name it would cost seconds."""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        return str(torch.__version__), torch.version.cuda
    try:
        spec = importlib.util.find_spec("torch")  # a top-level package: found, not imported
        if spec is None or not spec.submodule_search_locations:
            return None, None
        path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
        version_spec = importlib.util.spec_from_file_location("_labkit_torch_version", path)
        module = importlib.util.module_from_spec(version_spec)
        version_spec.loader.exec_module(module)
        return str(module.__version__), module.cuda
    except Exception:
        return None, None


@functools.lru_cache(maxsize=1)
def _cached_versions() -> tuple[tuple[str, Any], ...]:
    torch_version, cuda = _torch_versions()
    found = {
        "python": platform.python_version(),
        "torch": torch_version,
        "cuda": cuda,
        "triton": _installed_version("triton"),
        "flash_attn": _installed_version("flash_attn"),
        "transformers": dist_version("transformers"),
        "labkit": __version__,
    }
    return tuple(found.items())


def versions() -> dict:
    """Software versions for provenance; a package that cannot be imported is None."""
    return dict(_cached_versions())


def project_root() -> Path:
    """LAB_ROOT when env.sh set it, else the folder holding the labkit package."""
    root = os.environ.get("LAB_ROOT")
    return Path(root) if root else Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(project_root()), *args],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _own_checkout() -> bool:
    """Whether the project folder is the top of its own git checkout. An exported copy (`git archive`)
    inside some other repository must not report that repository's commit as ours."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == project_root().resolve()


# `git archive` writes the commit into this file (export-subst in .gitattributes): the provenance of a copy
# made without .git, as the GPU runs use.
ARCHIVED_COMMIT_FILE = "labkit/COMMIT"


def archived_commit() -> str | None:
    try:
        text = (project_root() / ARCHIVED_COMMIT_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9a-f]{40}", text) else None


def git_head() -> str | None:
    """The project's commit: its checkout's HEAD, else the commit an archive was made from, else None.
    Never raises."""
    return (_git("rev-parse", "HEAD") if _own_checkout() else None) or archived_commit()


def write_result(out: Path, log: dict, markdown: str) -> None:
    """A device script's result: its log as JSON at `out` (with the commit it ran at), its Markdown table beside it
    (.md), and the table printed."""
    log["commit"] = git_head()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(log, indent=1))
    out.with_suffix(".md").write_text(markdown)
    print(markdown)


# The user's lab notes (labkit notes init/new write them, the user fills them in): text about results, never
# code that makes them, so a note written or edited leaves a result tied to its commit.
NOT_CODE = ("notes",)


def git_dirty() -> bool | None:
    """Whether tracked or new files differ from HEAD, so a result can be tied to exact code (None: not a
    checkout of its own, so unknown). The lab notes (NOT_CODE) do not count."""
    if not _own_checkout():
        return None
    status = _git("status", "--porcelain", "--untracked-files=normal", "--", ".",
                  *(f":(exclude){p}" for p in NOT_CODE))
    return None if status is None else bool(status)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info(device: Any) -> dict:
    """type, name and count of the device a command ran on ('auto' is resolved first)."""
    text = str(getattr(device, "value", device) or "cpu")
    if text == "auto":
        text = "cuda" if cuda_available() else "cpu"
    kind = text.split(":", 1)[0]
    if kind == "cuda" and cuda_available():
        import torch

        index = int(text.split(":", 1)[1]) if ":" in text else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "type": "cuda",
            "name": props.name,
            "count": torch.cuda.device_count(),
            "index": index,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
        }
    if kind == "cuda":
        return {"type": "cuda", "name": None, "count": 0}
    return {"type": "cpu", "name": _cpu_model(), "count": os.cpu_count() or 1}


def config_sha256(model_dir: str | Path | None) -> str | None:
    """sha256 of the model's config.json bytes: which model a result belongs to, cheaply."""
    if model_dir is None:
        return None
    try:
        return hashlib.sha256((Path(model_dir) / "config.json").read_bytes()).hexdigest()
    except OSError:
        return None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# The command line being run, where it is not sys.argv: labkit.cli.main(argv) called in-process (tests, scripts).
_command_line: list[str] | None = None


def set_command_line(argv: list[str] | None) -> None:
    global _command_line
    _command_line = None if argv is None else [str(a) for a in argv]


# The engine's tuning knobs: environment variables its kernels and graphs read once, at import (docs/perf.md names
# each). A run made with one set computes along another path, so every result records the ones that were set.
KNOB_PREFIXES = ("LABKIT_DECODE_", "LABKIT_GUMBEL_", "LABKIT_GRAPH_", "LABKIT_FP8_")


def engine_knobs() -> dict[str, str]:
    """The engine knobs set in this process's environment (none set: {}, the engine's defaults)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(KNOB_PREFIXES)}


def knobs_text(knobs: dict | None) -> str:
    """A result's engine knobs for a person: 'none set (the defaults)', or NAME=VALUE, ..., or unknown."""
    if knobs is None:
        return "unknown (a server that does not report them, or servers that differ)"
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "none set (the engine's defaults)"


def envelope(command: str, *, device: Any, model_dir: str | Path | None, evidence: str,
             argv: list[str] | None = None) -> dict:
    """The provenance every JSON output starts with (SPEC section 7)."""
    if evidence not in EVIDENCE_KINDS:
        raise ValueError(f"evidence must be one of {', '.join(EVIDENCE_KINDS)}, not {evidence!r}")
    return {
        "command": command,
        "argv": list(argv if argv is not None else _command_line if _command_line is not None else sys.argv),
        "versions": versions(),
        "device": device_info(device),
        "model": {
            "path": str(Path(model_dir).resolve()) if model_dir is not None else None,
            "config_sha256": config_sha256(model_dir),
        },
        "git_head": git_head(),
        "git_dirty": git_dirty(),
        "knobs": engine_knobs(),
        "started_at": now_iso(),
        "evidence": evidence,
    }


def finish(env: dict, **results: Any) -> dict:
    """A new dict: the envelope, the results, and ended_at."""
    done = dict(env)
    done.update(results)
    done["ended_at"] = now_iso()
    return done


def _jsonable(obj: Any) -> Any:
    # Paths, torch.device and enums end up in results; their text is what a reader wants.
    if isinstance(obj, enum.Enum):
        return obj.value
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def _umask() -> int:
    # Linux shows the umask in /proc without changing it; os.umask() must set one to read it, which would
    # race with files other threads (the server's) create meanwhile.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode open() gives a new file (0644 under the usual umask 022): results are as readable as the
    Markdown written beside them, not 0600 as a temporary file would leave them."""
    return 0o666 & ~_umask()


def write_json(path: str | Path, data: Any) -> Path:
    """Write atomically, so a crash or a reader never sees half a file; mode as for any new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=_jsonable)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# Parameters that change where a result goes or how it is shown, not what ran: never part of a record's name.
_NOT_CONFIGURATION = frozenset({"out", "as_json", "json", "quiet", "wide", "perfetto", "list_", "list",
                                "expect_changes", "title"})
RECORD_NAME_MAX = 120


def configuration_suffix(skip: tuple[str, ...] = ()) -> str:
    """The options given on the command line that change what a command runs (device, engine options, sizes),
    as a file-name suffix: `--device cuda --max-num-batched-tokens 100` -> "-device-cuda-max-num-batched-tokens-100",
    "" when none (an option
    given its default value, the device `auto` resolves to here, or the model folder used without --model,
    changes nothing). A command's
    default output path adds it, so that a run of another configuration is a record of its own beside the
    others (`labkit doctor --device cuda` failing on a CPU box adds runs/doctor-device-cuda.json and leaves a
    passing runs/doctor.json as it was); a second run of one configuration replaces its own record. `skip`:
    parameters the name holds already (the case, the suite)."""
    try:  # typer >= 0.24 carries its own copy of click
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return ""
    parts: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        source = ctx.get_parameter_source(name)
        if (name in _NOT_CONFIGURATION or name in skip or getattr(param, "param_type_name", "") != "option"
                or getattr(source, "name", None) != "COMMANDLINE"):
            continue
        value = ctx.params.get(name)
        plain = getattr(value, "value", value)
        if plain == getattr(getattr(param, "default", None), "value", getattr(param, "default", None)):
            continue  # given, but the default: the same configuration
        if name == "device" and plain in ("auto", "cuda" if cuda_available() else "cpu"):
            continue  # the device `auto` stands for here
        if name == "model" and plain is not None and _default_model() == Path(str(plain)).expanduser().resolve():
            continue  # the model folder a command takes without --model ($MODEL_DIR, else the tiny model)
        flag = max(param.opts, key=len).lstrip("-")
        if isinstance(value, bool) and param.is_flag:
            chosen = param.opts if value else param.secondary_opts or [f"--no-{flag}"]
            parts.append(max(chosen, key=len).lstrip("-"))
            continue
        text = str(getattr(value, "value", value))
        if isinstance(value, Path) or "/" in text:
            text = Path(text).stem  # a file or folder given by path: its name
        parts.append(f"{flag}-{re.sub(r'[^A-Za-z0-9._=+-]+', '_', text)}")
    suffix = "".join(f"-{p}" for p in parts)
    if len(suffix) > RECORD_NAME_MAX:
        digest = hashlib.sha256(suffix.encode()).hexdigest()[:10]
        suffix = suffix[:RECORD_NAME_MAX - 11] + "-" + digest
    return suffix


def _default_model() -> Path:
    from labkit.model import default_model_dir

    return Path(os.environ.get("MODEL_DIR", "").strip() or default_model_dir()).expanduser().resolve()


def runs_dir() -> Path:
    """Where outputs go: $RUNS_DIR (env.sh sets it) or ./runs."""
    return Path(os.environ.get("RUNS_DIR") or "runs")


def print_json(result: Any) -> None:
    sys.stdout.write(json.dumps(result, indent=2, default=_jsonable) + "\n")
    sys.stdout.flush()
