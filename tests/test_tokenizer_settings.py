"""The tokenizer settings a checkpoint may carry, each read as transformers reads it (engine/tokenizer.py claims
transformers' ids, texts and prompts): clean_up_tokenization_spaces given or not, a list of named chat templates,
a chat_template.jinja file beside tokenizer_config.json, a post-processor that adds special tokens; and the
character bound a text prompt is checked against before it is tokenised."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.request_limits import RequestLimits
from engine.tokenizer import Tokenizer

SPACED = "don't , they 're here ."
MESSAGES = [{"role": "user", "content": "hi"}]


def _copy(tiny_model, dst: Path, **config_changes) -> Path:
    dst.mkdir()
    src = Path(tiny_model)
    shutil.copy(src / "tokenizer.json", dst)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def _hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, use_fast=True)


@pytest.mark.parametrize("clean_up", [None, False])
def test_clean_up_tokenization_spaces_off_or_not_given_decodes_as_transformers(tiny_model, tmp_path, clean_up):
    """(Given true, transformers 5.25 ignores it for a BPE tokenizer, with a warning, where earlier versions and
    this engine apply it: a checkpoint question no Qwen3 raises, its tokenizer_config.json saying false.)"""
    path = _copy(tiny_model, tmp_path / "t", clean_up_tokenization_spaces=clean_up)
    hf = _hf(path)
    ids = hf.encode(SPACED)
    assert Tokenizer(path).decode(ids) == hf.decode(ids) == SPACED


def test_a_list_of_named_templates_takes_the_default_one(tiny_model, tmp_path):
    default = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    path = _copy(tiny_model, tmp_path / "t", chat_template=[{"name": "tool_use", "template": "TOOLS {{ messages }}"},
                                                             {"name": "default", "template": default}])
    text = Tokenizer(path).apply_chat_template(MESSAGES, tokenize=False)
    assert text == _hf(path).apply_chat_template(MESSAGES, tokenize=False) == "[user] hi\n"


def test_a_chat_template_file_wins_over_the_config_one(tiny_model, tmp_path):
    path = _copy(tiny_model, tmp_path / "t", chat_template="FROM CONFIG {{ messages[0]['content'] }}")
    (path / "chat_template.jinja").write_text("FROM FILE {{ messages[0]['content'] }}")
    text = Tokenizer(path).apply_chat_template(MESSAGES, tokenize=False)
    assert text == _hf(path).apply_chat_template(MESSAGES, tokenize=False) == "FROM FILE hi"


def test_a_chat_prompt_gets_no_special_tokens_from_a_post_processor(tiny_model, tmp_path):
    """A tokenizer whose post-processor adds <|endoftext|> in front of every encode (as a BOS): the template's
    text is tokenised without it (transformers' apply_chat_template), a plain prompt with it."""
    path = _copy(tiny_model, tmp_path / "t")
    tok = json.loads((path / "tokenizer.json").read_text())
    bos = next(t for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    tok["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bos["id"]],
                                                                  "tokens": ["<|endoftext|>"]}}}
    (path / "tokenizer.json").write_text(json.dumps(tok))
    ours, hf = Tokenizer(path), _hf(path)
    assert ours.encode("hi")[0] == bos["id"]  # (the post-processor is live)
    got = ours.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert got == hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert bos["id"] not in got


def test_a_text_whose_tokens_fit_is_never_refused_for_its_characters(tmp_path):
    """NFC composes four code points into one character (U+1FAF), which one vocabulary entry one character long
    stands for: four characters a token. A prompt of max_model_len such tokens fits, so the character bound the
    engine checks first must let its 4 x max_model_len characters through."""
    from tokenizers import Tokenizer as Rust, models, normalizers, pre_tokenizers

    composed = "\u1faf"
    rust = Rust(models.WordLevel({composed: 0, "x": 1}, unk_token="x"))
    rust.normalizer = normalizers.NFC()
    rust.pre_tokenizer = pre_tokenizers.Split(composed, behavior="isolated")
    rust.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path)
    decomposed = "\u03a9\u0314\u0342\u0345"  # (NFC: U+1FAF)
    text = decomposed * 3
    assert tok.encode(text) == [0, 0, 0]
    limits = RequestLimits(max_model_len=3, vocab_size=2, block_size=16, num_blocks=4,
                           max_prompt_chars=3 * tok.max_chars_per_token)
    assert limits.check_text(text) == text


def test_clean_up_given_true_removes_the_spaces_of_an_english_word_level_decode(tiny_model, tmp_path):
    """transformers' clean_up_tokenization, every pair it joins (see the note above on transformers 5.25)."""
    path = _copy(tiny_model, tmp_path / "t", clean_up_tokenization_spaces=True)
    tok = Tokenizer(path)
    text = "a . b ? c ! d , e ' f n't g 'm h 's i 've j 're"
    assert tok.decode(tok.encode(text)) == "a. b? c! d, e'fn't g'm h's i've j're"


def test_indented_block_tags_render_as_transformers_does(tiny_model, tmp_path):
    """transformers renders templates with trim_blocks and lstrip_blocks: a block tag's indentation and the
    newline after it are not output."""
    template = ("{% for m in messages %}\n    {% if m['role'] == 'user' %}\n        U: {{ m['content'] }}\n"
                "    {% endif %}\n{% endfor %}")
    path = _copy(tiny_model, tmp_path / "t", chat_template=template)
    text = Tokenizer(path).apply_chat_template(MESSAGES, tokenize=False)
    assert text == _hf(path).apply_chat_template(MESSAGES, tokenize=False) == "        U: hi\n"
