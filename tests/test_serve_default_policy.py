"""serve's --help states the default scheduling policy and the measurement that chose it (issue 34, Deliver 7):
the policy and budget it names must be the engine's defaults, and every figure it quotes must be in the
measured table of docs/serving.md, so that neither a changed default nor an invented figure goes unnoticed."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from engine.config import Config
from engine.policies import policy_class

REPO = Path(__file__).resolve().parents[1]


def _help() -> str:
    from labkit.serve.command import serve

    return " ".join(serve.__doc__.split())


def test_the_help_names_the_engines_default_policy_and_its_budget():
    m = re.search(r"The default policy, (\w+) \(([\d,]+) tokens a step\)", _help())
    assert m, "serve's help no longer states its default policy"
    default = {f.name: f.default for f in dataclasses.fields(Config)}["scheduling_policy"]
    assert m.group(1) == default
    assert int(m.group(2).replace(",", "")) == policy_class(default).default_token_budget


def test_every_figure_the_help_quotes_is_in_the_measured_table():
    text = _help()
    para = text[text.index("The default policy"):text.index("Example:")]
    figures = re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", para)
    serving = (REPO / "docs" / "serving.md").read_text()
    table = serving[serving.index("### Session 12: serve's default policy"):]
    table = table[:table.index("\n## ")]
    cells = set(re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", table))
    quoted = [f for f in figures if f not in {"3", "16", "32"}]   # the rule's 3% and the rates
    assert len(quoted) >= 8
    missing = [f for f in quoted if f not in cells]
    assert not missing, f"serve --help quotes figures docs/serving.md's session-12 table does not hold: {missing}"
