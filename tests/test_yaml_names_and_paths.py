"""A case or workload given by path or by NAME (labkit/yamlfile.py): a value ending .yaml or .yml, or with a
slash, is a path, and a missing one says so; anything else is a name looked up in the folders."""
from __future__ import annotations

import pytest

from labkit import yamlfile
from labkit.errors import LabkitError


@pytest.mark.parametrize("given", ["gone.yml", "gone.yaml", "sub/gone"])
def test_a_missing_path_is_reported_as_a_file_not_a_name(tmp_path, given):
    (tmp_path / "known.yaml").write_text("x: 1\n")
    with pytest.raises(LabkitError, match=f"case file not found: {given}"):
        yamlfile.resolve(given, [tmp_path], "case")


def test_a_name_is_found_in_the_folders_and_a_near_miss_is_suggested(tmp_path):
    (tmp_path / "known.yaml").write_text("x: 1\n")
    assert yamlfile.resolve("known", [tmp_path], "case") == tmp_path / "known.yaml"
    with pytest.raises(LabkitError, match="did you mean 'known'"):
        yamlfile.resolve("knwon", [tmp_path], "case")
