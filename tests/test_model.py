"""labkit.model / labkit.fake_model: the fake checkpoints, model resolution, info and fetch."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from labkit import model
from labkit.errors import LabkitError
from labkit.fake_model import make_fake_model, num_parameters, preset_config, tensor_specs

N_NEW = 8  # greedy tokens per prompt in the behaviour tests


def _sha256_tree(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_fake_model("tiny", tmp_path_factory.mktemp("fake") / "tiny", seed=0)


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    texts = ["The lighthouse keeper climbed the stairs", "Bread rises because yeast", "Hello, my name is",
             "def count_words(text):", "Once upon a time there was", "Q: Why is the sky blue?\nA:",
             "Seven plus five is", "The engine schedules a batch of"]
    gen = torch.Generator().manual_seed(1)
    rand = [torch.randint(100, 2045, (n,), generator=gen).tolist() for n in (3, 5, 13, 34, 89, 233)]
    return [tokenizer.encode(t) for t in texts] + rand


@pytest.fixture(scope="module")
def base_runs(hf_model, prompts) -> list[tuple[list[int], list[float]]]:
    return [greedy(hf_model, p) for p in prompts]


def greedy(m, ids: list[int], n: int = N_NEW, position_ids=None) -> tuple[list[int], list[float]]:
    """Greedy continuation by full forwards (no KV cache), and the top-1 minus top-2 margins."""
    ids = list(ids)
    margins = []
    for _ in range(n):
        kwargs = {} if position_ids is None else {"position_ids": position_ids(len(ids))}
        with torch.no_grad():
            logits = m(torch.tensor([ids]), **kwargs).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        ids.append(int(logits.argmax()))
    return ids[-n:], margins


# --- the files ------------------------------------------------------------------------------


def test_tiny_files_and_config(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "generation_config.json"} <= names
    assert not [n for n in names if n.startswith(".")], "no partial files left behind"
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["vocab_size"] >= 1024 and cfg["vocab_size"] % 2 == 0
    assert cfg["max_position_embeddings"] >= 4096
    assert cfg["num_attention_heads"] == 2 * cfg["num_key_value_heads"]  # GQA
    assert cfg["tie_word_embeddings"] is True and cfg["hidden_act"] == "silu" and cfg["attention_bias"] is False
    assert cfg["dtype"] == cfg["torch_dtype"] == "float32"
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    assert cfg["eos_token_id"] == 2047 and cfg["pad_token_id"] == cfg["bos_token_id"] == 2045

    from safetensors import safe_open

    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys}
        assert f.get_slice("model.norm.weight").get_dtype() == "F32"
    assert "lm_head.weight" not in keys
    assert shapes == {name: shape for name, shape, _ in tensor_specs(cfg)}
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 32, 128)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (32,)


def test_tokenizer_round_trip_and_chat_template(tiny_dir, tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert len(tokenizer) == raw.get_vocab_size() == 2048
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [2045, 2046, 2047]
    for text in ["Hello world! The quick brown fox, 12345 tokens.", "  two spaces\n\nnew lines\ttab",
                 "naïve café, 清晨的阳光 🙂", "def f(x):\n    return x ** 2\n",
                 "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text).ids
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("The lighthouse keeper")) < len("The lighthouse keeper") / 2  # real merges
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    two = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "hi"}], tokenize=False)
    assert two == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    ids = tokenizer.encode(chat, add_special_tokens=False)
    assert ids[0] == 2046 and ids.count(2047) == 1


def test_transformers_loads_config_and_weights(tiny_dir):
    from transformers import AutoConfig, Qwen3ForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_dir)
    assert cfg.model_type == "qwen3"
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert rope["rope_theta"] == 1e6
    m, info = Qwen3ForCausalLM.from_pretrained(tiny_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()  # tied
    inv_freq = m.model.rotary_emb.inv_freq
    assert torch.allclose(inv_freq[1], torch.tensor(1e6 ** (-2 / 32)))
    assert sum(p.numel() for p in m.parameters()) == num_parameters(json.loads((tiny_dir / "config.json").read_text()))


def test_same_seed_same_bytes_other_seed_other_weights(tiny_dir, tmp_path):
    again = make_fake_model("tiny", tmp_path / "again", seed=0)
    assert _sha256_tree(again) == _sha256_tree(tiny_dir)
    other = _sha256_tree(make_fake_model("tiny", tmp_path / "seed1", seed=1))
    base = _sha256_tree(tiny_dir)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["config.json"] != base["config.json"]  # the seed is recorded: the config sha tells them apart
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_qwen3_0_6b_preset_shapes(tmp_path):
    cfg = preset_config("qwen3-0.6b")
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]) == \
        (28, 1024, 16, 8, 128, 3072, 151936, 40960)
    assert cfg["rope_theta"] == 1e6 and cfg["rms_norm_eps"] == 1e-6
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "bfloat16"
    shapes = {name: shape for name, shape, _ in tensor_specs(cfg)}
    assert len(shapes) == 2 + 28 * 11 and "lm_head.weight" not in shapes
    assert shapes["model.embed_tokens.weight"] == (151936, 1024)
    assert shapes["model.layers.27.self_attn.q_proj.weight"] == (2048, 1024)
    assert shapes["model.layers.27.self_attn.k_proj.weight"] == (1024, 1024)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (1024, 2048)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (1024, 3072)
    assert num_parameters(cfg) == 596_049_920  # Qwen3-0.6B's count (tied head stored once)

    # The full preset's config alone: info reads the KV size the seeds quote (112 KiB per token).
    only_cfg = tmp_path / "cfg-only"
    only_cfg.mkdir()
    (only_cfg / "config.json").write_text(json.dumps(cfg))
    info = model.model_info(only_cfg)
    assert info["kv_bytes_per_token"] == 2 * 28 * 8 * 128 * 2 == 114688
    assert info["num_parameters"] is None

    # The write path in bf16, cut down to one layer and a small vocab to stay quick.
    small = make_fake_model("qwen3-0.6b", tmp_path / "q1", overrides={"num_hidden_layers": 1, "vocab_size": 4096})
    from transformers import Qwen3ForCausalLM

    m, loading = Qwen3ForCausalLM.from_pretrained(small, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert m.dtype == torch.bfloat16 and m.model.layers[0].self_attn.k_proj.weight.shape == (1024, 1024)
    with torch.no_grad():
        logits = m(torch.tensor([[100, 200, 300, 400]])).logits.float()
    assert torch.isfinite(logits).all()
    assert model.model_info(small)["safetensors_dtypes"] == ["BF16"]


# --- the weights make a useful test subject -----------------------------------------------------


def test_greedy_continuations_vary_and_use_context(hf_model, prompts, tokenizer, base_runs):
    runs = base_runs
    conts = [c for c, _ in runs]
    margins = [x for _, ms in runs for x in ms]
    # Different prompts, different continuations, and not an echo of the last token.
    assert len({tuple(c) for c in conts}) == len(conts)
    assert len({c[0] for c in conts}) >= len(conts) - 1
    repeats = sum(c[i] == (p + c)[len(p) + i - 1] for p, c in zip(prompts, conts) for i in range(N_NEW))
    assert repeats / (N_NEW * len(prompts)) < 0.2
    # Argmax decisions are clear: float32 noise (~1e-5) cannot flip them.
    assert statistics.median(margins) > 0.2
    assert sum(m < 1e-3 for m in margins) <= 1
    # Same last tokens, different beginnings: different continuations.
    suffix = tokenizer.encode(" and the")
    tails = [greedy(hf_model, tokenizer.encode(t) + suffix)[0]
             for t in ["Bread rises because yeast", "Hello, my name is", "Seven plus five is", "Dear Tomas,"]]
    assert len({tuple(c) for c in tails}) == len(tails)
    # Changing only the first token of a long prompt still changes what follows.
    long = [p for p in prompts if len(p) >= 13]
    changed = sum(greedy(hf_model, p, 4)[0] != greedy(hf_model, [100 + (p[0] + 7) % 1900] + p[1:], 4)[0]
                  for p in long)
    assert changed >= len(long) - 1


def test_breaking_attention_changes_greedy_output(hf_model, prompts, base_runs):
    n = 4
    base = [c[:n] for c, _ in base_runs]
    # Zero k_norm: every attention score is 0, attention becomes a plain average.
    broken = copy.deepcopy(hf_model)
    for layer in broken.model.layers:
        layer.self_attn.k_norm.weight.data.zero_()
    assert sum(a != greedy(broken, p, n)[0] for a, p in zip(base, prompts)) >= len(prompts) - 1
    # Reversed positions: RoPE sees the wrong relative distances.
    reverse = [greedy(hf_model, p, n, position_ids=lambda k: torch.arange(k - 1, -1, -1)[None])[0] for p in prompts]
    assert sum(a != b for a, b in zip(base, reverse)) >= len(prompts) - 1
    # A constant shift of every position is NOT a breakage RoPE can see (only differences matter).
    shifted = [greedy(hf_model, p, n, position_ids=lambda k: torch.arange(7, k + 7)[None])[0] for p in prompts]
    assert sum(a == b for a, b in zip(base, shifted)) >= len(prompts) - 1


def test_kv_cached_generate_matches_full_forward(hf_model, prompts, base_runs):
    for p, (cont, _) in list(zip(prompts, base_runs))[:6]:
        out = hf_model.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False,
                                pad_token_id=2045, eos_token_id=None)
        assert out[0, len(p):].tolist() == cont


# --- resolution ---------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MODEL_DIR", raising=False)
    return tmp_path / "cache"


def test_cache_root_and_default_dir(cache, monkeypatch):
    assert model.cache_root() == cache
    assert model.default_model_dir() == cache / "models" / "tiny-seed0"
    monkeypatch.delenv("LABKIT_CACHE")
    assert model.cache_root() == Path.home() / ".cache" / "labkit"


def test_resolve_model_makes_the_default_once(cache, tiny_dir, monkeypatch):
    default = model.default_model_dir()
    assert not default.exists()
    got = model.resolve_model(None)
    assert got == default.resolve()
    assert _sha256_tree(got) == _sha256_tree(tiny_dir)
    stamp = (got / "model.safetensors").stat().st_mtime_ns
    assert model.resolve_model(None) == got
    monkeypatch.setenv("MODEL_DIR", str(cache / "models" / ".." / "models" / "tiny-seed0"))  # same folder
    assert model.resolve_model(None) == got
    assert (got / "model.safetensors").stat().st_mtime_ns == stamp  # not made again
    assert [p.name for p in default.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")] == []
    # An incomplete default folder is made again.
    (got / "model.safetensors").unlink()
    assert model.resolve_model(None) == got and (got / "model.safetensors").is_file()


def test_resolve_model_race_between_processes(cache, tiny_dir):
    code = "from labkit.model import resolve_model; print(resolve_model(None))"
    env = {**os.environ, "LABKIT_CACHE": str(cache)}
    env.pop("MODEL_DIR", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(model.default_model_dir().resolve())
    assert _sha256_tree(Path(outs[0])) == _sha256_tree(tiny_dir)  # same bytes from another process
    leftovers = [p.name for p in model.default_model_dir().parent.iterdir() if ".tmp-" in p.name or ".stale-" in p.name]
    assert leftovers == []


def test_resolve_model_lost_race_uses_the_winners_copy(cache, tiny_dir, monkeypatch):
    final = model.default_model_dir()

    def make_while_another_process_wins(preset, out, seed=0, **kw):
        make_fake_model(preset, final, seed)  # the other process renames its copy in first
        return make_fake_model(preset, out, seed, **kw)

    monkeypatch.setattr(model, "make_fake_model", make_while_another_process_wins)
    assert model.resolve_model(None) == final.resolve()
    assert _sha256_tree(final) == _sha256_tree(tiny_dir)
    assert [p.name for p in final.parent.iterdir() if ".tmp-" in p.name] == []


def test_resolve_model_default_cannot_be_made(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "file" / "cache"))
    monkeypatch.delenv("MODEL_DIR", raising=False)
    with pytest.raises(LabkitError) as err:
        model.resolve_model(None)
    assert err.value.code == 2 and "\n" not in str(err.value)


def test_resolve_model_explicit_and_env(cache, tiny_dir, tmp_path, monkeypatch):
    assert model.resolve_model(str(tiny_dir)) == tiny_dir.resolve()
    monkeypatch.setenv("MODEL_DIR", str(tmp_path / "nowhere"))
    assert model.resolve_model(tiny_dir) == tiny_dir.resolve()  # the argument wins over MODEL_DIR
    with pytest.raises(LabkitError) as err:
        model.resolve_model(None)
    assert err.value.code == 2 and str(err.value).startswith(f"model folder {tmp_path / 'nowhere'}:")
    assert "\n" not in str(err.value)
    monkeypatch.setenv("MODEL_DIR", str(tiny_dir))
    assert model.resolve_model(None) == tiny_dir.resolve()
    assert not model.default_model_dir().exists()  # nothing made when another folder is named


def test_resolve_model_incomplete_folder(cache, tmp_path):
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text("{}")
    with pytest.raises(LabkitError) as err:
        model.resolve_model(str(half))
    assert err.value.code == 2 and "*.safetensors" in str(err.value)
    (half / "config.json").unlink()
    (half / "model.safetensors").write_bytes(b"")
    with pytest.raises(LabkitError, match="config.json"):
        model.resolve_model(str(half))
    with pytest.raises(LabkitError):
        model.resolve_model(str(half / "model.safetensors"))  # a file, not a folder


# --- info ---------------------------------------------------------------------------------------


def test_model_info(tiny_dir):
    info = model.model_info(tiny_dir)
    assert info["model_type"] == "qwen3"
    assert (info["num_hidden_layers"], info["hidden_size"], info["num_attention_heads"], info["num_key_value_heads"],
            info["head_dim"], info["intermediate_size"], info["vocab_size"]) == (2, 128, 4, 2, 32, 256, 2048)
    assert info["tie_word_embeddings"] is True and info["dtype"] == "float32"
    assert info["num_parameters"] == 557_824
    assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert info["config_sha256"] == hashlib.sha256((tiny_dir / "config.json").read_bytes()).hexdigest()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f["name"] for f in info["files"]}
    assert info["has_tokenizer"] and info["has_chat_template"]
    assert info["fake"]["preset"] == "tiny" and info["fake"]["seed"] == 0
    json.dumps(info)
    with pytest.raises(LabkitError) as err:
        model.model_info(tiny_dir / "missing")
    assert err.value.code == 2


def _config_only(tmp_path: Path, cfg: dict, **files: bytes) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    for name, content in files.items():
        (folder / name.replace("_", ".")).write_bytes(content)
    return folder


def test_model_info_reads_what_a_config_leaves_out_as_transformers_defaults_it(tmp_path):
    """No num_key_value_heads: as many KV heads as heads (MHA); no rope_theta: rope_parameters' one; no dtype: the
    one dtype the safetensors files hold, and no KV size when they hold several."""
    cfg = {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
           "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    one = _safetensors({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}) + bytes(12)
    info = model.model_info(_config_only(tmp_path, cfg, model_safetensors=one))
    assert info["num_key_value_heads"] == 4 and info["head_dim"] == 16 and info["rope_theta"] == 5e5
    assert info["num_parameters"] == 6 and info["kv_bytes_per_token"] == 2 * 3 * 4 * 16 * 2
    two = _safetensors({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}) + bytes(8)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    info = model.model_info(_config_only(mixed, cfg, model_safetensors=two))
    assert info["safetensors_dtypes"] == ["BF16", "F32"] and info["kv_bytes_per_token"] is None


def test_model_info_lists_no_hidden_files(tiny_dir, tmp_path):
    folder = _broken_copy(tiny_dir, tmp_path, ".labkit-lock", b"")
    names = {f["name"] for f in model.model_info(folder)["files"]}
    assert "config.json" in names and ".labkit-lock" not in names


def test_cli_info(tiny_dir, cache):
    runner = CliRunner()
    res = runner.invoke(model.app, ["info", str(tiny_dir), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["num_parameters"] == 557_824
    res = runner.invoke(model.app, ["info", str(tiny_dir)])
    assert res.exit_code == 0 and "qwen3" in res.output and "1,024" in res.output
    res = runner.invoke(model.app, ["info", str(tiny_dir / "missing")])
    assert isinstance(res.exception, LabkitError) and res.exception.code == 2


def test_cli_fake(tiny_dir, tmp_path, cache):
    runner = CliRunner()
    out = tmp_path / "made"
    res = runner.invoke(model.app, ["fake", "--preset", "tiny", "--out", str(out), "--seed", "0"])
    assert res.exit_code == 0, res.output
    assert _sha256_tree(out) == _sha256_tree(tiny_dir)
    res = runner.invoke(model.app, ["fake", "--preset", "tiny", "--out", str(out)])
    assert isinstance(res.exception, LabkitError) and res.exception.code == 2 and "--force" in str(res.exception)
    (out / "model-00002-of-00002.safetensors").write_bytes(b"stale")
    res = runner.invoke(model.app, ["fake", "--out", str(out), "--seed", "3", "--force"])
    assert res.exit_code == 0, res.output
    assert not (out / "model-00002-of-00002.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["labkit_fake"]["seed"] == 3
    res = runner.invoke(model.app, ["fake", "--preset", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2  # click's usage error


# --- fetch without a network --------------------------------------------------------------------


def test_fetch_fails_fast_without_network(tmp_path, monkeypatch):
    from huggingface_hub import constants

    # Connection refused at once, whatever network this machine has.
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    res = CliRunner().invoke(model.app, ["fetch", "--out", str(tmp_path / "q")])
    assert time.monotonic() - start < 30
    assert isinstance(res.exception, LabkitError) and res.exception.code == 2
    msg = str(res.exception)
    assert "\n" not in msg and "Qwen/Qwen3-0.6B" in msg and model.QWEN3_REVISION in msg
    # HF_HUB_OFFLINE=1: the same clean failure (with an empty hub cache: a real one may hold Qwen3).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with pytest.raises(LabkitError) as err:
        model.fetch_model(tmp_path / "q", weights=True)
    assert err.value.code == 2


def test_fetch_cli_exit_code_and_one_line(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0",
           "HF_HUB_CACHE": str(tmp_path / "hf"),
           "LABKIT_CACHE": str(tmp_path / "cache")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import sys; from labkit.cli import main; main(sys.argv[1:])",
                           "model", "fetch", "--out", str(tmp_path / "q")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not download Qwen/Qwen3-0.6B" in lines[0]


def _broken_copy(tiny_dir: Path, tmp_path: Path, name: str, content: bytes) -> Path:
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in tiny_dir.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    (folder / name).write_bytes(content)
    return folder


def _config_with(tiny_dir: Path, **changes) -> bytes:
    return json.dumps({**json.loads((tiny_dir / "config.json").read_text()), **changes}).encode()


def _safetensors(header) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw


@pytest.mark.parametrize("name, content, message", [
    # Issue 22: a string of layers was multiplied into ~2 GB of text (MemoryError); a float of heads likewise
    ("config.json", lambda d: _config_with(d, num_hidden_layers="L" * 1000),
     "num_hidden_layers must be a positive integer"),
    ("config.json", lambda d: _config_with(d, num_key_value_heads=1e6),
     "num_key_value_heads must be a positive integer"),
    ("config.json", lambda d: _config_with(d, hidden_size=True), "hidden_size must be a positive integer"),
    ("config.json", lambda d: b"[1, 2]", "config.json is a JSON list, not an object"),
    ("model.safetensors", lambda d: _safetensors([1, 2]), "the header is a JSON list, not an object"),
    ("model.safetensors", lambda d: _safetensors({"w": {"dtype": "F32", "shape": ["a", 10 ** 8]}}),
     "tensor 'w' needs a dtype string and a shape of non-negative integers"),
    ("model.safetensors", lambda d: _safetensors({"w": {"dtype": "F32", "shape": [-4, 10]}}),
     "tensor 'w' needs a dtype string and a shape of non-negative integers"),
    ("model.safetensors", lambda d: (0).to_bytes(8, "little"), "not a safetensors file (header size 0)"),
    ("config.json", lambda d: _config_with(d, num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
], ids=["layers-str", "kv-heads-float", "hidden-bool", "config-list", "header-list", "shape-str", "shape-negative",
        "header-size-0", "layers-zero"])
def test_model_info_refuses_what_it_cannot_compute_with(tiny_dir, tmp_path, name, content, message):
    folder = _broken_copy(tiny_dir, tmp_path, name, content(tiny_dir))
    res = CliRunner().invoke(model.app, ["info", str(folder)])
    assert isinstance(res.exception, LabkitError) and res.exception.code == 2
    assert message in str(res.exception) and len(str(res.exception)) < 300
