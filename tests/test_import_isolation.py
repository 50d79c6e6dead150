"""Each side works alone (DESIGN.md, import rules): ``flaxformer_mini`` with no PyTorch
installed, ``torch_ref`` with no JAX.

"Not installed" is simulated in a fresh interpreter by a meta-path finder that refuses the
other side's packages. Each subprocess first proves the block works (``import torch`` does
raise ImportError), so the test cannot pass vacuously, then builds a model and runs it, and
finally checks that nothing blocked slipped into ``sys.modules`` another way.
"""

import re
import textwrap
from pathlib import Path

import pytest

from helpers import run_blocking

REPO = Path(__file__).resolve().parents[1]

FLAX_ALONE = textwrap.dedent(
    """
    import jax.numpy as jnp
    from flax import nnx

    import flaxformer_mini as fm

    cfg = fm.get_preset("tiny")
    model = fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0))
    model.eval()
    source = jnp.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]])
    target = jnp.array([[1, 2, 3], [4, 5, 6]])
    logits = model(source, target)
    assert logits.shape == (2, 3, cfg.target_vocab_size), logits.shape
    assert bool(jnp.isfinite(logits).all())
    """
)

TORCH_ALONE = textwrap.dedent(
    """
    import torch

    import torch_ref

    torch.manual_seed(0)
    model = torch_ref.Transformer(
        src_pad_idx=0, source_vocab_size=23, target_vocab_size=19, max_len=17,
        embed_size=30, heads=5, num_layers=2, dropout=0.1,
    ).eval()
    source = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]])
    target = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        logits = model(source, target)
    assert tuple(logits.shape) == (2, 3, 19), logits.shape
    assert bool(torch.isfinite(logits).all())
    """
)

def test_flaxformer_mini_runs_without_torch_torch_ref_or_parity():
    run_blocking({"torch", "torch_ref", "parity"}, FLAX_ALONE)


def test_torch_ref_runs_without_jax_flax_flaxformer_mini_or_parity():
    run_blocking({"jax", "jaxlib", "flax", "flaxformer_mini", "parity"}, TORCH_ALONE)


def test_block_fails_the_subprocess_when_a_blocked_package_is_needed():
    # The harness itself can fail: blocking jax must break the Flax forward.
    with pytest.raises(AssertionError, match="subprocess failed"):
        run_blocking({"jax"}, FLAX_ALONE)


# Both command lines parse before they start a framework: `--help` and an option's error answer
# in a fraction of a second (flaxformer_mini's and parity's names are imported on first use).
CLI_ALONE = textwrap.dedent(
    """
    import contextlib
    import io

    from {cli} import main

    for argv, code, says in {cases!r}:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(err):
            try:
                got = main(argv)  # parity's returns its exit code, as console scripts expect
            except SystemExit as e:  # flaxformer-mini's leaves argparse's exit as it is
                got = e.code
        assert got == code, (argv, got, err.getvalue())
        assert says in out.getvalue() + err.getvalue(), (argv, out.getvalue(), err.getvalue())
    """
)
FRAMEWORKS = {"jax", "jaxlib", "flax", "optax", "orbax", "torch", "numpy"}


@pytest.mark.parametrize("cli, cases", [
    ("flaxformer_mini.cli.main", [(["--help"], 0, "generate"), (["train", "--help"], 0, "--max-tokens"),
                         (["train", "--task", "copy", "--out", "o", "--steps", "-1"], 2, "--steps must be >= 1, got -1"),
                         (["generate", "--help"], 0, "--beam-size")]),
    ("parity.cli", [(["--help"], 0, "convert"), (["convert", "--help"], 0, "--heads H"), (["check", "--batch", "0"], 2, "--batch must be >= 1, got 0")]),
])
def test_command_line_help_and_option_errors_answer_without_importing_a_framework(cli, cases):
    run_blocking(FRAMEWORKS, CLI_ALONE.format(cli=cli, cases=cases))


@pytest.mark.parametrize("cli, blocked, argv, says", [
    ("flaxformer_mini.cli.main", {"jax", "jaxlib"}, ["train", "--task", "copy", "--steps", "1", "--out"],
     "this command needs the Python package jax, which is not installed here: pip install -e . (the Flax side), as "
     "the README's set-up does"),
    ("parity.cli", {"torch", "safetensors"}, ["check", "--preset", "seed", "--json"],
     'this command needs the Python package torch, which is not installed here: pip install torch==2.13.0 (the CPU '
     'build), then pip install -e ".[torch]"'),
])
def test_a_command_needing_a_package_not_installed_names_it_and_how_to_install_it(tmp_path, cli, blocked, argv, says):
    out = tmp_path / "out"
    run_blocking(blocked, CLI_ALONE.format(cli=cli, cases=[([*argv, str(out)], 2, says)]))
    assert not out.exists()  # refused before anything was written


# --- static check over the source ----------------------------------------------------------


def _imports_of(path, names):
    """Lines of ``path`` that import one of ``names`` (import x, from x import, from x.y
    import, importlib.import_module("x"), __import__("x"))."""
    alternatives = "|".join(map(re.escape, names))
    statement = re.compile(rf"^\s*(?:import|from)\s+(?:{alternatives})(?:\.|\s|,|$)", re.MULTILINE)
    dynamic = re.compile(rf"(?:import_module|__import__)\(\s*['\"](?:{alternatives})(?:\.|['\"])")
    text = path.read_text()
    hits = [m.group(0).strip() for m in statement.finditer(text)]
    hits += [m.group(0) for m in dynamic.finditer(text)]
    # `import os, torch` also counts.
    for line in re.findall(r"^\s*import\s+(.+)$", text, re.MULTILINE):
        if any(name.strip().split(" ")[0].partition(".")[0] in names for name in line.split(",")[1:]):
            hits.append(line)
    return hits


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("flaxformer_mini", ("torch", "torch_ref", "parity")),
        ("torch_ref", ("jax", "jaxlib", "flax", "flaxformer_mini", "parity")),
    ],
)
def test_package_source_never_imports_the_other_side(package, forbidden):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no source files found under {package}/"
    offenders = {str(f.relative_to(REPO)): hits for f in files if (hits := _imports_of(f, forbidden))}
    # No exception: `train --init-from` reaches parity's weight reader through a packaging entry
    # point (flaxformer_mini/runs/init_from.py, tests/test_init_from.py), not an import.
    assert not offenders, f"{package} must not import {', '.join(forbidden)}: {offenders}"


def test_static_import_check_finds_real_imports():
    # The regex is not blind: it sees torch_ref's own torch imports and parity's of both sides.
    assert _imports_of(REPO / "torch_ref" / "model.py", ("torch",))
    assert _imports_of(REPO / "parity" / "twins.py", ("flaxformer_mini",))
    assert _imports_of(REPO / "parity" / "twins.py", ("jax",))
    assert _imports_of(REPO / "flaxformer_mini" / "model" / "attention.py", ("flax",))


def test_every_package_directory_is_listed_in_pyproject_so_the_wheel_ships_it():
    """``[tool.setuptools] packages`` is an explicit list, and setuptools takes no subpackage
    unasked: a package directory missing from it works in the editable install and is absent
    from the wheel a user installs."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(init.parent.relative_to(REPO).parts)
               for top in ("flaxformer_mini", "torch_ref", "parity") for init in (REPO / top).rglob("__init__.py")}
    assert "flaxformer_mini.data" in on_disk  # the walk finds subpackages
    assert listed == on_disk


INIT_FROM_WITHOUT_TORCH = textwrap.dedent(
    """
    import pathlib

    import numpy as np
    from safetensors.numpy import load_file

    import flaxformer_mini as fm
    from flaxformer_mini.runs.init_from import InitFromError, read_params
    from flaxformer_mini.runs.config import DataConfig, RunConfig
    from flaxformer_mini.train.optimizer import TrainConfig

    # What `train --init-from` reads, for the model the file holds (no train step: the
    # property is the reading; tests/test_init_from.py trains from it, torch present).
    d = pathlib.Path({d!r})
    config = RunConfig(model=fm.ModelConfig(0, 11, 11, 6, 30, 5, 1, 0.0), train=TrainConfig(),
                       data=DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5))
    params, notes = read_params(str(d / "model.safetensors"), config)
    embedding = load_file(d / "model.safetensors")["encoder.embedding_layer.weight"]
    assert np.array_equal(params["encoder/embedding_layer/embedding"], embedding), "the file's values"
    try:
        read_params(str(d / "model.pt"), config)
    except InitFromError as e:
        assert "needs PyTorch to read, and torch is not installed" in str(e), e
    else:
        raise AssertionError("a .pt file was read without torch")
    """
)


def test_train_init_from_reads_a_torch_safetensors_file_without_torch(tmp_path):
    """--init-from model.safetensors (torch keys) needs parity's torch-free readers only; a .pt
    file says that torch is needed, and writes nothing."""
    import torch
    from safetensors.torch import save_file

    import torch_ref

    model = torch_ref.Transformer(0, 11, 11, 6, 30, 5, 1, 0.0)
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    run_blocking({"torch", "torch_ref"}, INIT_FROM_WITHOUT_TORCH.format(d=str(tmp_path)))


def test_a_missing_module_of_an_installed_package_keeps_its_traceback_not_an_install_hint():
    # "pip install jax" is no answer when jax is installed and one of its modules is not there
    # (a broken install, or a module path that is wrong in the code): the traceback says which.
    from flaxformer_mini.cli.errors import describe_missing_dependency, explain

    inside = ModuleNotFoundError("No module named 'jax._no_such_module'", name="jax._no_such_module")
    assert describe_missing_dependency(inside) is None and explain(inside) == (None, None)
    whole = ModuleNotFoundError("No module named 'jax'", name="jax")
    assert describe_missing_dependency(whole).startswith("this command needs the Python package jax, which is not "
                                                         "installed here")
