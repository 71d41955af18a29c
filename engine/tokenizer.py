"""A checkpoint's tokenizer and chat template, without transformers.

tokenizer.json is run by the tokenizers library (the Rust tokenizer a transformers "fast" tokenizer wraps);
tokenizer_config.json gives the special tokens and the chat template, which is rendered with jinja2 under the
settings transformers renders it with (a sandbox, trim_blocks and lstrip_blocks, the loop-controls extension,
`tojson`, `raise_exception`, `strftime_now`). Importing transformers costs seconds (its auto classes); the
engine needs none of it. tests/test_tokenizer.py holds the two to the same ids, texts and prompts.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as _RustTokenizer


def _content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization: the spaces an English word-level decode leaves before punctuation."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class Tokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"no tokenizer.json in {path} (a tokenizer in another format needs transformers)")
        self.backend_tokenizer = _RustTokenizer.from_file(str(file))
        config = {}
        if (path / "tokenizer_config.json").is_file():
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
            if not isinstance(config, dict):
                raise ValueError("tokenizer_config.json: expected a JSON object")
        template = config.get("chat_template")
        if (path / "chat_template.jinja").is_file():  # (where transformers >= 4.43 saves it)
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self.special_tokens = {name: _content(config.get(name)) for name in
                               ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.eos_token = self.special_tokens["eos_token"]
        self.eos_token_id = None if self.eos_token is None else self.backend_tokenizer.token_to_id(self.eos_token)
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @cached_property
    def max_chars_per_token(self) -> int:
        """The most characters of text one token can stand for: the longest entry of the vocabulary (an entry
        spells its token in at least as many characters as the text it stands for: byte-level entries one a
        byte), times 4 under a Unicode normaliser (NFC composes at most 4 code points into one, U+1FAF). A text
        longer than max_model_len times this cannot fit, so it is refused before it is tokenised (a normaliser
        that deletes text, such as Strip, is not bounded by it: such a text is refused all the same)."""
        tok = self.backend_tokenizer
        longest = max((len(entry) for entry in tok.get_vocab(with_added_tokens=True)), default=1)
        return max(1, longest) * (1 if tok.normalizer is None else 4)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        text = self.backend_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_spaces(text) if self._clean_up else text

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True, add_generation_prompt: bool = False,
                            **kwargs):
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json: chat_template)")
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **{k: v for k, v in self.special_tokens.items() if v is not None}, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    @cached_property
    def _template(self):
        from jinja2.exceptions import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)
