"""Engine settings at their edges (labkit/engine_args.py): a command's own option named like a Config field stays
the command's, and a file's engine setting of the wrong YAML type is refused even where Python would take it."""
from __future__ import annotations

import pytest

from labkit.engine_args import check_settings
from labkit.errors import LabkitError

from .helpers import run_cli


def test_bench_load_seed_is_not_a_server_setting(tmp_path, capsys):
    """`bench load --seed` seeds the arrival times, not the engine of the server it would start: with --url
    nothing is started, so a server setting given is refused by name, and --seed is not one."""
    code, out, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--seed", "3", "--no-warmup",
                              "--out", str(tmp_path / "r.json")], capsys)
    assert "settings of a server this command starts" not in out + err, out + err
    code, out, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--max-num-seqs", "3",
                              "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and "--max-num-seqs: settings of a server this command starts" in out + err, out + err


def _fail(where, why):
    raise LabkitError(f"{where}: {why}")


@pytest.mark.parametrize("key,value", [("num_kvcache_blocks", True), ("seed", True), ("max_num_seqs", True),
                                       ("max_model_len", 64.0), ("enforce_eager", 1)])
def test_a_files_engine_setting_of_the_wrong_type_is_refused(key, value):
    # (YAML `true` is a Python bool, which is an int: `num_kvcache_blocks: true` would be a pool of one block)
    with pytest.raises(LabkitError, match=f"engine.{key}: must be"):
        check_settings({key: value}, _fail)
