"""The engine reads a checkpoint without transformers (engine/tokenizer.py, engine/model_config.py): the same
ids, texts, chat prompts and config values as transformers' AutoTokenizer and AutoConfig, and an engine that
starts and generates with transformers unimportable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model_config import load_model_config
from engine.tokenizer import Tokenizer

TEXTS = ["", "hello world", "  leading and trailing  ", "Hello, world! It's 42.", "line\nbreak\r\n\ttab",
         "大语言模型推理 needs a KV cache: 你好，世界!", "emoji 🙂🚀 and e\u0301", "<|im_start|>user\nhi<|im_end|>",
         "a<|endoftext|>b", "don't , they 're here .", "x" * 300]

MESSAGES = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}],
]


@pytest.fixture(scope="module")
def both(tiny_model):
    from transformers import AutoTokenizer

    return Tokenizer(tiny_model), AutoTokenizer.from_pretrained(tiny_model, use_fast=True)


def test_encode_decode_and_specials_equal_transformers(both):
    ours, hf = both
    assert len(ours) == len(hf) and ours.eos_token_id == hf.eos_token_id and ours.eos_token == hf.eos_token
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special), text
        ids = hf.encode(text)
        assert ours.decode(ids) == hf.decode(ids), text  # (the default keeps special tokens)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    ids = list(range(0, len(hf), max(1, len(hf) // 97))) + [len(hf) - 1]  # across the vocabulary, a special id too
    assert ours.decode(ids) == hf.decode(ids)


def test_chat_template_renders_as_transformers_does(both):
    ours, hf = both
    for messages in MESSAGES:
        for gen in (False, True):
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == text
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == hf.encode(
                text, add_special_tokens=False)


def test_template_features_transformers_gives(tmp_path, tiny_model):
    """What real templates use (Qwen3's among them): tojson, raise_exception, loop controls, trimmed blocks,
    the special tokens as variables, extra keyword arguments (enable_thinking)."""
    from transformers import AutoTokenizer

    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}\n"
        "  {% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{{ m | tojson }}|{{ eos_token }}\n"
        "{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours, hf = Tokenizer(model), AutoTokenizer.from_pretrained(str(model))
    msgs = [{"role": "user", "content": "é\"q\""}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}]
    for extra in ({}, {"enable_thinking": False}):
        assert ours.apply_chat_template(msgs, tokenize=False, **extra) == hf.apply_chat_template(
            msgs, tokenize=False, **extra)
    with pytest.raises(Exception, match="no tools here"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_a_checkpoint_without_tokenizer_json_or_template_is_a_clear_error(tmp_path, tiny_model):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(model).apply_chat_template([{"role": "user", "content": "x"}])
    (model / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer(model)


FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
          "tie_word_embeddings", "attention_bias", "model_type")


@pytest.mark.parametrize("drop", [(), ("head_dim", "num_key_value_heads", "rms_norm_eps"),
                                  ("tie_word_embeddings", "max_position_embeddings", "hidden_act", "vocab_size"),
                                  ("num_key_value_heads=null",)])
def test_config_values_equal_autoconfig_full_or_sparse(tmp_path, tiny_model, drop):
    from transformers import AutoConfig

    from engine.models.qwen3 import _rope_theta

    model = tmp_path / "m"
    model.mkdir()
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    for key in drop:
        if key.endswith("=null"):
            cfg[key[:-5]] = None
        else:
            cfg.pop(key)
    (model / "config.json").write_text(json.dumps(cfg))
    ours, hf = load_model_config(model), AutoConfig.from_pretrained(str(model))
    for name in FIELDS:
        assert getattr(ours, name) == getattr(hf, name), name
    assert _rope_theta(ours) == _rope_theta(hf)


def test_a_config_that_is_not_an_object_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        load_model_config(tmp_path)


def test_the_engine_starts_and_generates_with_transformers_unimportable(tiny_model, tmp_path):
    """`import engine`, a whole generate() and `labkit trace` with transformers blocked (its import raises):
    the engine and the commands that drive it never need it."""
    out = tmp_path / "trace"
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import engine\n"
        "from engine import LLM, SamplingParams\n"
        f"llm = LLM({tiny_model!r}, device='cpu')\n"
        "text = llm.tokenizer.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False,\n"
        "                                         add_generation_prompt=True)\n"
        "out = llm.generate([text], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0), use_tqdm=False)\n"
        "assert len(out[0]['token_ids']) == 4, out\n"
        "llm.exit()\n"
        "from labkit.cli import app\n"
        "try:\n"
        f"    app(['trace', '--case', 'chunk', '--model', {tiny_model!r}, '--device', 'cpu', '-q',\n"
        f"         '--out', {str(out)!r}])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
