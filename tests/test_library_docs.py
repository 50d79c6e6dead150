"""What a learner reads in the library (docstrings, comments, help()) names what exists."""

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flaxformer_mini"
# Names of other projects that docstrings compare with (torch.load, nn.LayerNorm, hashlib.sha256),
# and fm, the examples' flaxformer_mini (its names are lazy_exports', which no module defines).
OTHER_PROJECTS = {"torch", "torch_ref", "nn", "hashlib", "str", "optax", "orbax", "flax", "parity", "fm"}


def _definitions():
    """Each module's name (a package's: its folder's) -> what it defines, its classes' members
    included; and every top-level function and class of the package."""
    defined, top_level = {}, set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
                top_level.add(node.name)
                if isinstance(node, ast.ClassDef):
                    names |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {a.asname or a.name.split(".")[0] for a in node.names}
        key = path.parent.name if path.name == "__init__.py" else path.stem
        defined.setdefault(key, set()).update(names)
        if path.name == "__init__.py":
            defined[key] |= {p.stem for p in path.parent.glob("*.py")} | {p.parent.name for p in path.parent.glob("*/__init__.py")}
    return defined, top_level


def _bound(tree):
    """Every name a file binds or reads (variables, parameters, attributes): ``state.model`` in
    its text is then a variable's attribute, not a module's."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def test_every_module_a_docstring_or_comment_names_exists_and_defines_the_name():
    # e.g. ``training.fresh_streams``: no module training exists (train/state.py holds fresh_streams).
    defined, top_level = _definitions()
    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        bound = _bound(ast.parse(text)) | OTHER_PROJECTS | set(sys.stdlib_module_names)
        # Not the tail of a longer dotted path (flax.training.train_state.TrainState) nor a quoted
        # key ("evaluation.length_penalty" in config.json).
        for m in re.finditer(r"(?<![\w.\"'])([a-z_]\w*)\.([A-Za-z_]\w*)\b", text):
            module, name = m.groups()
            if name not in top_level or module in bound:
                continue
            if name not in defined.get(module, ()):
                stale.append(f"{path.relative_to(PACKAGE.parent)}: {module}.{name}")
    assert not stale, stale


def test_help_shows_each_model_class_with_its_constructors_arguments():
    # flax's module metaclass alone makes it Transformer(*args: 'Any', **kwargs: 'Any') -> 'Any'.
    import inspect

    import jax.numpy as jnp
    from flax import nnx

    import flaxformer_mini as fm

    modules = [getattr(fm, name) for name in fm.__all__
               if isinstance(getattr(fm, name), type) and issubclass(getattr(fm, name), nnx.Module)]
    assert len(modules) == 11
    for cls in modules:
        init = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert list(inspect.signature(cls).parameters.values()) == init, cls
    assert str(inspect.signature(fm.FeedForward)).startswith("(d_model=4, hidden_dim=8, *, dtype=None,")
    feed_forward = fm.FeedForward(4, 8, rngs=nnx.Rngs(0))
    assert str(inspect.signature(feed_forward)) == "(x)"  # an instance's is its __call__'s
    assert feed_forward(jnp.ones((1, 2, 4))).shape == (1, 2, 4)


def test_the_package_docstrings_walkthrough_runs_as_written(tmp_path, monkeypatch):
    # help(flaxformer_mini)'s example: a model, batches, three train steps, the three searches and
    # a checkpoint saved and restored, at the tiny preset with one layer a side. Its compilations
    # (one train step, three decoding loops) are most of this test's time: running them is the
    # only proof that the example a learner copies runs.
    import doctest
    import tempfile

    import flaxformer_mini

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's checkpoint directory
    result = doctest.testmod(flaxformer_mini, optionflags=doctest.ELLIPSIS, raise_on_error=True)
    assert (result.failed, result.attempted) == (0, 25)
    assert [p.name for p in tmp_path.glob("*/*")] == ["3"]


def test_the_run_modules_example_runs_as_written(tmp_path, monkeypatch):
    # A run started, its initial state saved and the run opened again, at the tiny preset: no
    # step compiles (runs.fit's training is the walkthrough's Trainer step, above).
    import doctest
    import tempfile

    from flaxformer_mini.runs import run

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = doctest.testmod(run, raise_on_error=True)
    assert (result.failed, result.attempted) == (0, 13)
    assert sorted(p.name for p in (next(tmp_path.iterdir()) / "checkpoints").iterdir()) == ["0"]


def test_each_floor_is_an_attribute_of_the_package_as_help_reaches_it():
    # A fresh process: here the test suite has imported every subpackage already. Without the
    # lazy attribute: "AttributeError: module 'flaxformer_mini' has no attribute 'train'".
    import subprocess

    code = ("import flaxformer_mini as fm; "
            "print([getattr(fm, n).__name__ for n in ('data', 'decode', 'model', 'runs', 'scale', 'train')], "
            "{'train', 'model'} <= set(dir(fm)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == ("['flaxformer_mini.data', 'flaxformer_mini.decode', 'flaxformer_mini.model', "
                           "'flaxformer_mini.runs', 'flaxformer_mini.scale', 'flaxformer_mini.train'] True")


def test_design_md_lists_every_module_path_the_docs_import_and_each_holds_its_names():
    import importlib

    repo = PACKAGE.parent
    design = (repo / "docs" / "design.md").read_text()
    section = design[design.index("- These module paths"):design.index("Every other module path is internal")]
    listed = {m.group(1): re.findall(r"`(\w+)`", m.group(2) or "")
              for m in re.finditer(r"`((?:flaxformer_mini|parity)(?:\.\w+)+)`(?: \(([^)]*)\))?", section)}
    assert len(listed) == 22 and listed["flaxformer_mini.train.checkpoint"] == ["open_manager", "save", "restore"]
    for path, names in listed.items():
        module = importlib.import_module(path)
        assert [n for n in names if not hasattr(module, n)] == [], path
    # What the README, the guides and help(flaxformer_mini) import.
    texts = [repo / "README.md", PACKAGE / "__init__.py", *(repo / "docs").glob("*.md")]
    imported = {m.group(1) for p in texts for m in re.finditer(r"from (flaxformer_mini(?:\.\w+)+) import (?!lazy_exports)",
                                                               p.read_text())}
    imported |= {f"flaxformer_mini.train.{m}" for m in re.findall(r"from flaxformer_mini\.train import (\w+)",
                                                                   (PACKAGE / "__init__.py").read_text())}
    imported.discard("flaxformer_mini.train")
    assert imported and imported <= set(listed), sorted(imported - set(listed))
    # parity's modules the guides reach by attribute after a plain `import parity`, in a fresh
    # process (here the suite has imported them all): without the lazy attribute,
    # "AttributeError: module 'parity' has no attribute 'rules'".
    import subprocess

    reached = sorted({m.groups() for p in texts
                      for m in re.finditer(r"\b(parity\.(?!cli\b)\w+)\.([A-Za-z_]\w*)\b", p.read_text())})
    modules = {path for path, _ in reached}
    assert {"parity.rules", "parity.tied", "parity.checkpoint_io", "parity.nn_transformer"} <= modules
    assert modules <= set(listed), sorted(modules - set(listed))
    code = f"import parity; [getattr(getattr(parity, p.split('.')[1]), n) for p, n in {reached!r}]"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_help_of_a_transformer_call_says_what_it_takes_and_returns():
    import pydoc

    import flaxformer_mini as fm

    text = pydoc.render_doc(fm.Transformer, renderer=pydoc.plaintext)
    call = text[text.index("__call__(self, source_input, target_input)"):]
    assert call.split("\n")[1].strip(" |").startswith("Logits (B, T, V) for source ids (B, S) and target ids (B, T)")
