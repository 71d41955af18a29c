"""Hostile and edge inputs outside the server (issue 35, items 14, 16 and 17): each refused with a one-line
error naming the file, key or field, in time and memory bounded by the input's declared limits, nothing
written outside the folder given; or, where the value is valid, taken at its edge."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.sampler import row_seeds

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SEED_END = 1 << 63  # the end of the seed's range, [0, 2**63)


# --- 17: the seed's range, as documented and as enforced ---------------------------------------------------
def test_the_documented_seed_range_is_the_enforced_one():
    doc = (REPO / "docs" / "serving.md").read_text()
    m = re.search(r"`seed` not an integer in \[0, 2\*\*(\d+)\)", doc)
    assert m, "docs/serving.md no longer states the seed's range"
    end = 1 << int(m.group(1))
    assert end == SEED_END
    SamplingParams(seed=end - 1)
    with pytest.raises(ValueError, match=r"^seed: must be an integer in \[0, 2\*\*%s\)" % m.group(1)):
        SamplingParams(seed=end)


@pytest.mark.parametrize("seed", [0, 1, SEED_END - 1])
def test_seeds_at_the_edges_are_taken(seed):
    assert SamplingParams(seed=seed).seed == seed


@pytest.mark.parametrize("seed", [-1, SEED_END, 1 << 64, True, 1.0, "3"])
def test_seeds_beyond_the_edges_are_refused_naming_the_seed(seed):
    with pytest.raises(ValueError, match=r"^seed: "):
        SamplingParams(seed=seed)


def test_every_seed_in_the_range_has_a_stream_of_its_own():
    """The row seed of a request's seed is a bijection of [0, 2**63) (an odd multiplier modulo 2**63), so
    seeds at the edges and their neighbours never share noise; each fits the int64 the sampler takes."""
    seeds = [0, 1, 2, SEED_END // 2 - 1, SEED_END // 2, SEED_END - 2, SEED_END - 1]
    rows = row_seeds(0, [0] * len(seeds), [5] * len(seeds), [SamplingParams(seed=s) for s in seeds])
    assert len(set(rows)) == len(seeds) and all(0 <= r < SEED_END for r in rows)


def test_the_engine_samples_with_the_largest_seed(tiny_model):
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256)
    try:
        sp = [SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=s) for s in (SEED_END - 1, 0)]
        outs = llm.generate([[5, 6, 7, 8]] * 2, sp, use_tqdm=False)
        again = llm.generate([[5, 6, 7, 8]], sp[:1], use_tqdm=False)
        assert outs[0]["token_ids"] == again[0]["token_ids"]
        assert outs[0]["token_ids"] != outs[1]["token_ids"]
    finally:
        llm.exit()


# --- 16: a note's title is text, never a pattern ------------------------------------------------------------
@pytest.mark.parametrize("title", [r"why \1 and \n here", r"\g<0> and \\", "a\nsecond line"])
def test_a_note_title_with_backslashes_is_written_as_given(title, tmp_path, capsys):
    out = tmp_path / "note.md"
    code, _, err = run_cli(["notes", "new", "trace", "--title", title, "--out", str(out)], capsys)
    assert code == 0, err
    first = out.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# Trace note: " + " ".join(title.split()), first
