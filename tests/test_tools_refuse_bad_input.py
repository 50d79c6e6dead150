"""The investigation tools under tools/ refuse bad options with one line before any work.

Each refusal comes before a model is built or a file written, so each case here costs a
parse: a tool's ``main([...])`` called in-process, its ``SystemExit`` caught.
"""

import os
import pathlib
import subprocess

import pytest

from tools import xla_profile


def refusal(main, argv, capsys):
    """The one line a tool's ``main(argv)`` ends with, checked to be argparse's exit 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("option", ["--json", "--hlo"])
def test_xla_profile_refuses_an_output_in_a_missing_directory_before_profiling(option, tmp_path, capsys):
    path = tmp_path / "missing" / "out"
    assert refusal(xla_profile.main, [option, str(path)], capsys) == (
        f"python -m tools.xla_profile: error: {option} {path}: its directory {path.parent} does not exist")


@pytest.mark.parametrize("argv, problem", [
    (["--top", "-1"], "--top must be >= 0, got -1"),
    (["--batch", "0"], "invalid benchmark preset 'base': batch must be >= 1, got 0"),
    (["--seq-len", "0"], "invalid benchmark preset 'base': seq_len must be >= 1, got 0"),
    (["--dropout", "1.5"], "invalid ModelConfig: dropout must be in [0, 1), got 1.5"),
])
def test_xla_profile_refuses_options_that_make_no_profile(argv, problem, capsys):
    assert refusal(xla_profile.main, argv, capsys) == f"python -m tools.xla_profile: error: {problem}"


ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("setting, line", [
    ({"GPU_ITEMS": "check bogus"}, "GPU_ITEMS: unknown item bogus (known: train parity bench bench_scan "
     "bench_decode bench_compile bench_train check profile ablations ablate bfloat16 determinism)"),
    ({"GPU_ITEMS": "check", "LIMIT_CHECK": "0"}, "LIMIT_CHECK=0: must be a positive whole number of seconds"),
])
def test_gpu_items_all_refuses_an_unknown_item_or_a_limit_that_is_no_limit_before_any_setup(setting, line, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMIT_")}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_items.sh"), "all"], env=dict(env, OUT=str(out), **setting),
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not out.exists()  # nothing set up: not even the output directory
