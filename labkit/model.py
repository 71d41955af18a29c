"""`labkit model`: make, fetch and inspect model folders, and find the model every command uses.

Resolution (`resolve_model`): the --model argument, else $MODEL_DIR, else the embedded default
(`fake --preset tiny --seed 0` in $LABKIT_CACHE/models/tiny-seed0), which is made on first use.
Any other folder must already hold config.json and *.safetensors.

This module is imported by every command, so it imports nothing heavy at module level
(torch, transformers and huggingface_hub load inside the functions that need them).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.fake_model import make_fake_model
from labkit.options import JsonOption, Out

DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 0

QWEN3_REPO = "Qwen/Qwen3-0.6B"
QWEN3_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"
# Config and tokenizer; --weights adds *.safetensors.
FETCH_PATTERNS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "vocab.json", "merges.txt", "LICENSE", "README.md")
FETCH_TIMEOUT_S = 10.0

# What a complete fake folder holds (the default model is remade when one is missing).
FAKE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1}
_ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                   "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class Preset(str, enum.Enum):
    tiny = "tiny"
    qwen3_0_6b = "qwen3-0.6b"


# ---------------------------------------------------------------------------------------------
# Where models live


def cache_root() -> Path:
    """$LABKIT_CACHE, else ~/.cache/labkit."""
    env = os.environ.get("LABKIT_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "labkit"


def default_model_dir() -> Path:
    """The embedded default model: the tiny preset, seed 0, made on first use."""
    return cache_root() / "models" / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}"


def _missing(path: Path) -> list[str]:
    """What a model folder lacks of config.json and *.safetensors (empty: usable)."""
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


def _fake_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in FAKE_FILES)


def resolve_model(model: str | os.PathLike | None = None) -> Path:
    """The model folder a command uses (absolute): `model`, else $MODEL_DIR, else the default.

    The default folder is made when it is missing or incomplete. Any other folder that is
    missing or lacks config.json / *.safetensors raises LabkitError (exit code 2).
    """
    raw = str(model) if model is not None and str(model).strip() else os.environ.get("MODEL_DIR", "").strip()
    default = default_model_dir()
    path = Path(raw).expanduser() if raw else default
    if path.resolve() == default.resolve():
        if not _fake_complete(default):
            ensure_default_model()
        return default.resolve()
    if not path.exists():
        raise LabkitError(
            f"model folder {path}: does not exist (make one with `labkit model fake --out {path}`, "
            f"or leave --model and MODEL_DIR unset to use the embedded tiny model)", code=2)
    if not path.is_dir():
        raise LabkitError(f"model folder {path}: is not a folder", code=2)
    missing = _missing(path)
    if missing:
        raise LabkitError(f"model folder {path}: missing {' and '.join(missing)} "
                          f"(`labkit model fetch --weights` or `labkit model fake` make complete folders)", code=2)
    return path.resolve()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX); elsewhere the atomic rename alone keeps races safe."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_default_model() -> Path:
    """Make the default model folder unless a complete one is there; safe when processes race.

    The model is written into a temporary sibling folder and renamed into place, so a reader
    never sees a half-written folder; when another process got there first, its copy is used.
    """
    final = default_model_dir()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with _locked(final.parent / f".{final.name}.lock"):
            if not _fake_complete(final):
                _make_into_place(final)
    except LabkitError:
        raise
    except Exception as exc:
        raise LabkitError(f"model folder {final}: could not make the default tiny model: "
                          f"{type(exc).__name__}: {exc}", code=2) from exc
    return final


def _make_into_place(final: Path) -> None:
    parent = final.parent
    if final.exists():  # interrupted or damaged: move it aside, then replace it
        aside = parent / f".{final.name}.stale-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            pass
        else:
            shutil.rmtree(aside, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
    try:
        make_fake_model(DEFAULT_PRESET, tmp, DEFAULT_SEED)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _fake_complete(final):  # not a lost race (another process's copy is in place)
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Inspecting a folder


# config.json keys model_info computes with: each must be a positive integer when present (a string would be
# multiplied into a string of gigabytes, a float gives a KV size in fractions of a byte).
DIMENSION_KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                  "intermediate_size", "vocab_size", "max_position_embeddings")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes), without its data. ValueError
    naming what is wrong when it is not one (the header a JSON object, each tensor a dtype and a shape of
    non-negative integers)."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        if size <= 0 or size > 100 * 2**20:
            raise ValueError(f"{path.name}: not a safetensors file (header size {size})")
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: the header is a JSON {type(header).__name__}, not an object")
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape) \
                or not isinstance(meta.get("dtype"), str):
            raise ValueError(f"{path.name}: tensor {_shown(name)} needs a dtype string and a shape of "
                             f"non-negative integers, got {_shown(meta)}")
    return header


def _dimensions(cfg: dict, path: Path) -> None:
    for key in DIMENSION_KEYS:
        v = cfg.get(key)
        if v is not None and not (_is_int(v) and v > 0):
            raise LabkitError(f"model folder {path}: config.json: {key} must be a positive integer, got "
                              f"{_shown(v)}", code=2)


def model_info(path: str | os.PathLike) -> dict[str, Any]:
    """What a model folder holds, read from config.json and safetensors headers (no weights loaded).

    Dimension keys use the Hugging Face config names; `num_parameters` counts the stored tensors
    (a tied LM head is stored once); `kv_bytes_per_token` = 2 x layers x kv heads x head_dim x
    bytes of the config dtype.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        what = "does not exist" if not path.exists() else "has no config.json"
        raise LabkitError(f"model folder {path}: {what}", code=2)
    raw = cfg_path.read_bytes()
    try:
        cfg = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise LabkitError(f"model folder {path}: config.json is not valid JSON: {exc}", code=2) from None
    if not isinstance(cfg, dict):
        raise LabkitError(f"model folder {path}: config.json is a JSON {type(cfg).__name__}, not an object",
                          code=2)
    _dimensions(cfg, path)

    files = [{"name": f.name, "bytes": f.stat().st_size}
             for f in sorted(path.iterdir()) if f.is_file() and not f.name.startswith(".")]
    num_params: Optional[int] = 0
    st_dtypes: set[str] = set()
    weights_bytes = 0
    shards = sorted(path.glob("*.safetensors"))
    for shard in shards:
        weights_bytes += shard.stat().st_size
        try:
            header = safetensors_header(shard)
        except (OSError, ValueError, RecursionError) as exc:
            raise LabkitError(f"model folder {path}: cannot read {shard.name}: {exc}", code=2) from None
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            num_params += math.prod(meta["shape"])
            st_dtypes.add(meta["dtype"])
    if not shards:
        num_params = None

    layers = cfg.get("num_hidden_layers")
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", heads)
    hidden = cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")
    rope_theta = cfg.get("rope_theta")
    if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):
        rope_theta = cfg["rope_parameters"].get("rope_theta")
    dtype_bytes = _DTYPE_BYTES.get(str(dtype))
    if dtype_bytes is None and len(st_dtypes) == 1:
        dtype_bytes = _ST_DTYPE_BYTES.get(next(iter(st_dtypes)))
    kv_bytes = (2 * layers * kv_heads * head_dim * dtype_bytes
                if layers and kv_heads and head_dim and dtype_bytes else None)
    return {
        "path": str(path.resolve()),
        "files": files,
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": cfg.get("intermediate_size"),
        "vocab_size": cfg.get("vocab_size"),
        "max_position_embeddings": cfg.get("max_position_embeddings"),
        "rope_theta": rope_theta,
        "tie_word_embeddings": cfg.get("tie_word_embeddings"),
        "dtype": dtype,
        "num_parameters": num_params,
        "safetensors_dtypes": sorted(st_dtypes),
        "weights_bytes": weights_bytes,
        "has_tokenizer": (path / "tokenizer.json").is_file() or (path / "vocab.json").is_file(),
        "has_chat_template": _has_chat_template(path),
        "config_sha256": hashlib.sha256(raw).hexdigest(),
        "kv_bytes_per_token": kv_bytes,
        "fake": cfg.get("labkit_fake") if isinstance(cfg.get("labkit_fake"), dict) else None,
    }


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Fetching the real model


def fetch_model(out: Path, weights: bool = False, revision: str = QWEN3_REVISION,
                timeout: float = FETCH_TIMEOUT_S) -> Path:
    """Download Qwen3-0.6B's config and tokenizer (and weights) into `out`.

    Checks that the Hub answers first (one request, no retries), so that without a network it
    fails within `timeout` seconds with LabkitError (code 2) rather than after minutes of retries.
    """
    try:
        from huggingface_hub import HfApi, constants as hf_constants, snapshot_download
    except ImportError as exc:
        raise LabkitError(f"model fetch needs huggingface-hub ({exc}); pip install huggingface-hub", code=2) from exc
    where = f"{QWEN3_REPO}@{revision}"
    hint = ("check the network (or HF_ENDPOINT / proxy settings); without the Hub, "
            "`labkit model fake --preset qwen3-0.6b` writes random weights with the same shapes")
    try:
        if not hf_constants.HF_HUB_OFFLINE:
            HfApi().model_info(QWEN3_REPO, revision=revision, timeout=timeout)
        patterns = list(FETCH_PATTERNS) + (["*.safetensors"] if weights else [])
        got = snapshot_download(repo_id=QWEN3_REPO, revision=revision, allow_patterns=patterns,
                                local_dir=str(out), etag_timeout=timeout)
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(reason) > 240:
            reason = reason[:237] + "..."
        raise LabkitError(f"model fetch: could not download {where} from the Hugging Face Hub ({reason}); {hint}",
                          code=2) from exc
    got_path = Path(got)
    if not (got_path / "config.json").is_file():
        raise LabkitError(f"model fetch: {where} downloaded into {got_path} but config.json is missing", code=2)
    return got_path


# ---------------------------------------------------------------------------------------------
# The `labkit model` commands

app = typer.Typer(help="Make, fetch and inspect model folders.\n\nExample: labkit model fake --preset tiny",
                  no_args_is_help=True)


def _console() -> Console:
    return Console()


def _human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def info_table(info: dict[str, Any], title: str) -> Group:
    """The folder's facts as a table, and its config sha256 on a line of its own: 64 characters do not fit a
    table cell at 80 columns."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    params = info["num_parameters"]
    rows = [
        ("path", info["path"]),
        ("model_type", info["model_type"]),
        ("layers", info["num_hidden_layers"]),
        ("hidden", info["hidden_size"]),
        ("heads (q / kv)", f"{info['num_attention_heads']} / {info['num_key_value_heads']}"),
        ("head_dim", info["head_dim"]),
        ("ffn", info["intermediate_size"]),
        ("vocab", info["vocab_size"]),
        ("max positions", info["max_position_embeddings"]),
        ("rope theta", info["rope_theta"]),
        ("tied embeddings", info["tie_word_embeddings"]),
        ("dtype", f"{info['dtype']} (stored: {', '.join(info['safetensors_dtypes']) or '-'})"),
        ("parameters", "-" if params is None else f"{params:,} ({params / 1e6:.1f} M)"),
        ("weights", _human_bytes(info["weights_bytes"]) if info["weights_bytes"] else "none"),
        ("KV bytes / token", "-" if info["kv_bytes_per_token"] is None
         else f"{info['kv_bytes_per_token']:,} ({_human_bytes(info['kv_bytes_per_token'])})"),
        ("tokenizer", "yes" + (" + chat template" if info["has_chat_template"] else "")
         if info["has_tokenizer"] else "no"),
        ("files", ", ".join(f["name"] for f in info["files"])),
    ]
    if info.get("fake"):
        rows.append(("fake", f"preset {info['fake'].get('preset')}, seed {info['fake'].get('seed')}"))
    for what, value in rows:
        table.add_row(what, Text(str(value)))  # Text: paths must not be read as markup
    return Group(table, Text.assemble(("config sha256 ", "bold"), str(info["config_sha256"])))


@app.command("fake")
def fake_cmd(
    preset: Preset = typer.Option(Preset.tiny, "--preset", help="tiny (the embedded test model) or "
                                  "qwen3-0.6b (Qwen3-0.6B's exact shapes, random bf16 weights, ~1.2 GB)."),
    out: Out("Folder to write (default: $LABKIT_CACHE/models/PRESET-seedN).") = None,
    seed: int = typer.Option(0, "--seed", help="Weights seed; same preset and seed give identical files."),
    force: bool = typer.Option(False, "--force", help="Write into a folder that is not empty."),
) -> None:
    """Write a deterministic fake Qwen3 checkpoint (config, safetensors, tokenizer) offline.

    Example: labkit model fake --preset qwen3-0.6b --seed 1
    """
    target = out if out is not None else cache_root() / "models" / f"{preset.value}-seed{seed}"
    if target.exists() and not target.is_dir():
        raise LabkitError(f"--out {target}: exists and is not a folder", code=2)
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise LabkitError(f"--out {target}: folder is not empty (add --force to overwrite the model files in it)",
                              code=2)
        for stale in list(target.glob("*.safetensors")) + [target / "model.safetensors.index.json"]:
            if stale.is_file():  # another checkpoint's shards would be loaded with ours
                stale.unlink()
    start = time.perf_counter()
    try:
        make_fake_model(preset.value, target, seed)
    except OSError as exc:
        raise LabkitError(f"--out {target}: cannot write: {exc}", code=2) from exc
    took = time.perf_counter() - start
    console = _console()
    console.print(info_table(model_info(target), f"fake model: preset {preset.value}, seed {seed}"))
    console.print(f"wrote {target} in {took:.1f} s")


@app.command("fetch")
def fetch_cmd(
    out: Out("Folder to download into (default: $LABKIT_CACHE/models/Qwen3-0.6B).") = None,
    weights: bool = typer.Option(False, "--weights", help="Also download model.safetensors (~1.5 GB)."),
    revision: str = typer.Option(QWEN3_REVISION, "--revision", help="Hub revision (default: the pinned commit)."),
) -> None:
    """Download Qwen/Qwen3-0.6B (config and tokenizer; --weights adds the weights) from the Hub.

    Example: labkit model fetch --weights
    """
    target = out if out is not None else cache_root() / "models" / "Qwen3-0.6B"
    start = time.perf_counter()
    got = fetch_model(target, weights=weights, revision=revision)
    console = _console()
    console.print(info_table(model_info(got), f"fetched {QWEN3_REPO}@{revision[:12]}"))
    note = "" if weights else " (config and tokenizer only: add --weights to run it)"
    console.print(f"downloaded into {got} in {time.perf_counter() - start:.1f} s{note}")


@app.command("info")
def info_cmd(
    model_dir: Optional[Path] = typer.Argument(None, metavar="DIR",
                                               help="Model folder (default: $MODEL_DIR, else the embedded tiny "
                                                    "model)."),
    as_json: JsonOption = False,
) -> None:
    """Show a model folder's shapes, parameter count, KV bytes per token and config sha256.

    Example: labkit model info ~/.cache/labkit/models/tiny-seed0
    """
    path = model_dir if model_dir is not None else resolve_model(None)
    info = model_info(path)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    else:
        _console().print(info_table(info, f"model {path}"))
