"""docs/porting.md, "Using an exported run in PyTorch": its script, run as a user runs it on a
run exported by `parity convert`, prints what `flaxformer-mini generate` prints for the same
inputs, for a synthetic task and for word and char runs (their tokenizer files read without
JAX), greedy and with beam search."""

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

from parity.cli import main as parity_main
from helpers import cli

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
# Besides the blank line, as many inputs as the runs' evaluations decode rows (copy_60_steps' batch
# of 8, char_4_steps' 7 held-out pairs), the longest of TEXT_INPUTS over 16 characters
# (char_4_steps' held-out width, 24): generate decodes at the shapes of the decoding loops the
# runs' training compiled, reused where this process trained the run. (word_2_steps, at --max-len
# 6, takes the longest, five words, whole; its evaluation decodes 2 rows.)
SYNTHETIC_INPUTS = ["5 3 6 2", "1", "", "0 0 4", "6 5 4 3 2", "2 2", "4 6 1", "3", "0 1 2 3"]
TEXT_INPUTS = ["the cat", "a red dog sat", "", "zzzq cat", "the <eos> cat",  # an unknown word, a special's spelling
               "old tree", "sat on the mat", "the red fox ran far"]


def script():
    section = GUIDE.read_text().split("## Using an exported run in PyTorch", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_script(monkeypatch, *argv, lines):
    """The guide's script as `python decode_exported.py ARGV < lines`: its standard output."""
    monkeypatch.setattr(sys, "argv", ["decode_exported.py", *map(str, argv)])
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script(), "decode_exported.py", "exec"), {"__name__": "__main__"})  # noqa: S102 - our own doc
    return out.getvalue()


def exported(run, out):
    with contextlib.redirect_stdout(io.StringIO()):
        assert parity_main(["convert", str(run), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_run):
    # The synthetic, word and char runs are the ones tests/test_generate_lines.py and
    # tests/test_evaluate_cli.py decode (helpers.SHARED_RUNS), trained once for all three files.
    d = tmp_path_factory.mktemp("exported")
    synthetic = trained_run("copy_60_steps") / "run"
    text = {"word": trained_run("word_2_steps") / "run", "char": trained_run("char_4_steps") / "run"}
    return {"synthetic": (synthetic, exported(synthetic, d / "synthetic.pt"), SYNTHETIC_INPUTS),
            "word": (text["word"], exported(text["word"], d / "word.safetensors"), TEXT_INPUTS),
            "char": (text["char"], exported(text["char"], d / "char.pt"), TEXT_INPUTS)}


@pytest.mark.parametrize("kind, beam", [("synthetic", 1), ("synthetic", 3), ("word", 1), ("char", 1), ("char", 2)])
def test_the_guides_torch_script_prints_what_generate_prints(runs, monkeypatch, kind, beam):
    run, weights, lines = runs[kind]
    generated = cli("generate", "--checkpoint", str(run), "--beam-size", str(beam),
                    stdin="".join(line + "\n" for line in lines))
    assert generated.returncode == 0, generated.stderr
    printed = run_script(monkeypatch, run, weights, *([beam] if beam > 1 else []), lines=lines)
    assert printed == generated.stdout
    assert any(printed.splitlines()), "every output empty: the comparison would prove little"
