"""docs/idioms.md quotes the source it explains, and the defaults it says differ do differ.

- drift: the committed guide equals what ``tools/build_idioms.py`` generates from the
  source (a quoted function that changed makes this fail, naming the snippet);
- every placeholder of the template resolves, and the generator's filters (``skip=`` too) do
  what it says;
- the guide's executed checks assert its sentences (shapes, defaults, layouts) with the
  sentence as the message, so a false one fails the build (the ``generated`` fixture) by name;
- the "Defaults that differ" claims, checked here directly (the guide's examples also run,
  with their own asserts, whenever it is built).
"""

import ast
import importlib.util
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():
    spec = importlib.util.spec_from_file_location("build_idioms", ROOT / "tools" / "build_idioms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


@pytest.fixture(scope="module")
def generated():
    """The guide as the generator writes it from the source (runs the examples)."""
    return gen.build()


@pytest.fixture(scope="module")
def guide():
    return gen.OUTPUT.read_text()


# ----------------------------------------------------------------------------- drift


def test_committed_guide_matches_the_source_it_quotes(generated, guide):
    problems = gen.drifted(guide, generated)
    assert not problems, (
        "docs/idioms.md is out of date; run `python tools/build_idioms.py` and review the diff:\n  "
        + "\n  ".join(problems)
    )


def test_every_placeholder_resolves():
    template = gen.TEMPLATE.read_text()
    specs = gen.placeholders(template)
    errors = []
    for spec in specs:
        try:
            code, _, _ = gen.resolve(spec)
            assert code.strip(), spec
        except gen.SnippetError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)
    files = {gen.parse_spec(spec)[0].split("/")[0] for spec in specs}
    assert {"torch_ref", "flaxformer_mini", "parity"} <= files
    assert "{{" not in gen.PLACEHOLDER.sub("", gen.EXAMPLE.sub("", template)).replace(gen.TOC, "")


def test_every_example_asserts_what_it_prints():
    examples = gen.examples(gen.TEMPLATE.read_text())
    assert len(examples) >= 8
    assert all("assert " in code for code in examples.values()), [n for n, c in examples.items() if "assert " not in c]


def test_every_assert_of_the_guide_has_its_sentence_as_message():
    # The intro promises that a failing check names the sentence it asserts.
    bare = [
        f"{name}, line {node.lineno}"
        for name, code in gen.examples(gen.TEMPLATE.read_text()).items()
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Assert) and node.msg is None
    ]
    assert not bare, "asserts without a message: " + "; ".join(bare)


def test_check_names_the_snippet_that_drifted(generated):
    # Change one line inside the quoted masked_fill, as an edit of the source would.
    key = "snippet flaxformer_mini/model/attention.py::masked_fill"
    block = gen.blocks(generated)[key]
    edited = generated.replace(block, block.replace("if mask is None:", "if mask is None or False:"))
    assert edited != generated
    assert gen.drifted(edited, generated) == [f"{key}: no longer matches the code it quotes"]
    assert gen.drifted(generated, generated) == []


def test_an_edited_source_changes_the_generated_snippet(tmp_path):
    (tmp_path / "mod.py").write_text(
        "LIMIT = 3\n\n\n"
        "class A:\n"
        "    def f(self, x):\n"
        '        """Doc."""\n'
        "        y = x + 1\n"
        "        z = y * 2\n"
        "        w = z - 3\n"
        "        return w\n"
    )
    template = "{{snippet: mod.py::A.f nodoc}}\n{{snippet: mod.py::A.f lines=1-1,4-4}}\n" \
               '{{snippet: mod.py::A.f from="z =" to="return"}}\n{{snippet: mod.py::LIMIT}}\n'
    before = gen.build(template, root=tmp_path)
    blocks = gen.blocks(before)
    assert "Doc." not in blocks["snippet mod.py::A.f nodoc"]
    assert "def f(self, x):\n    ...\n    z = y * 2" in blocks["snippet mod.py::A.f lines=1-1,4-4"]
    assert "```python\nz = y * 2\nw = z - 3\nreturn w\n```" in blocks['snippet mod.py::A.f from="z =" to="return"']
    assert "LIMIT = 3" in blocks["snippet mod.py::LIMIT"]

    (tmp_path / "mod.py").write_text((tmp_path / "mod.py").read_text().replace("z - 3", "z - 4"))
    after = gen.build(template, root=tmp_path)
    assert gen.drifted(before, after) == [
        "snippet mod.py::A.f nodoc: no longer matches the code it quotes",
        'snippet mod.py::A.f from="z =" to="return": no longer matches the code it quotes',
    ]


def test_skip_elides_the_marked_line_and_its_block_as_one_comment(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def f(x, dtype=None):\n"
        "    y = x + 1\n"
        "    if dtype is not None:  # plumbing\n"
        "        y = y.astype(dtype)\n"
        "\n"
        "        y = y * 1\n"
        "    return y\n"
    )
    code, excerpt, _ = gen.resolve('mod.py::f skip="# plumbing"', root=tmp_path)
    assert code == "def f(x, dtype=None):\n    y = x + 1\n    # ...\n    return y" and excerpt
    with pytest.raises(gen.SnippetError, match="skip='nothing like this'"):
        gen.resolve('mod.py::f skip="nothing like this"', root=tmp_path)


def test_a_false_sentence_fails_the_build_naming_it():
    template = "```python example=claim\nassert 1 + 1 == 3, 'one and one make three'\n```\n"
    with pytest.raises(gen.SnippetError, match="example 'claim' failed: AssertionError: one and one make three"):
        gen.build(template)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("flaxformer_mini/model/attention.py::NoSuchThing", "has no NoSuchThing"),
        ("flaxformer_mini/no_such_file.py::f", "no file"),
        ('flaxformer_mini/model/attention.py::masked_fill from="no such text"', "contains 'no such text'"),
        ("flaxformer_mini/model/attention.py::masked_fill lines=1-99", "has only"),
    ],
)
def test_a_placeholder_that_does_not_resolve_is_named(spec, says):
    with pytest.raises(gen.SnippetError, match="(?s)" + spec.split("::")[1].split()[0] + ".*" + says):
        gen.build("{{snippet: " + spec + "}}")


# ----------------------------------------------------------------------------- defaults that differ

# {text the guide states: the fact it states}: the guide must say it (whitespace aside), and
# it must be true.
CLAIMS = {
    "`nn.LayerNorm` uses `eps=1e-5`": lambda: torch.nn.LayerNorm(4).eps == 1e-5,
    "`nnx.LayerNorm` uses `epsilon=1e-6` and by default `E[x^2] - E[x]^2`": lambda: (
        nnx.LayerNorm(4, rngs=nnx.Rngs(0)).epsilon == 1e-6 and nnx.LayerNorm(4, rngs=nnx.Rngs(0)).use_fast_variance
    ),
    "AdamW's default decay does not: 0.01 in PyTorch, 1e-4 in optax": lambda: (
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).defaults["weight_decay"] == 0.01
        and inspect.signature(optax.adamw).parameters["weight_decay"].default == 1e-4
    ),
    "`nn.Linear` stores `weight` as `(out, in)`": lambda: tuple(torch.nn.Linear(3, 5).weight.shape) == (5, 3),
    "`nnx.Linear` stores `kernel` as `(in, out)`": lambda: nnx.Linear(3, 5, rngs=nnx.Rngs(0)).kernel.get_value().shape == (3, 5),
}


@pytest.mark.parametrize("text", list(CLAIMS))
def test_the_guide_states_true_defaults(guide, text):
    assert text in " ".join(guide.split()), f"the guide no longer says {text!r}; update CLAIMS or the template"
    assert CLAIMS[text](), f"the guide says {text!r}, which is no longer true"


def test_gelu_defaults_differ_and_the_same_form_agrees():
    x = np.linspace(-3, 3, 13, dtype=np.float32)
    torch_default = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()  # exact (erf)
    torch_tanh = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    jax_default = np.asarray(jax.nn.gelu(x))  # tanh approximation
    jax_exact = np.asarray(jax.nn.gelu(x, approximate=False))
    assert np.abs(torch_default - jax_default).max() > 1e-4
    assert np.abs(torch_tanh - jax_default).max() < 1e-6
    assert np.abs(torch_default - jax_exact).max() < 1e-6


def test_twin_layer_norm_takes_torch_epsilon_and_two_pass_variance():
    from flaxformer_mini.model.primitives import layer_norm

    ln = layer_norm(4, rngs=nnx.Rngs(0))
    assert ln.epsilon == torch.nn.LayerNorm(4).eps == 1e-5 and not ln.use_fast_variance


def test_out_of_range_id_raises_in_torch_but_not_in_jax():
    with pytest.raises(IndexError):
        torch.nn.Embedding(4, 2)(torch.tensor([[1, 7]]))
    out = nnx.Embed(4, 2, rngs=nnx.Rngs(0))(jnp.array([[1, 7]]))  # no error: NaN-filled
    assert bool(jnp.isnan(out[0, 1]).all()) and not bool(jnp.isnan(out[0, 0]).any())
    assert float(jnp.arange(4.0)[7]) == 3.0  # indexing clamps
    import flaxformer_mini as fm

    with pytest.raises(ValueError, match="token id 7 is outside the vocabulary"):
        fm.check_tokens(jnp.array([[1, 7]]), vocab_size=4, max_len=10)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_fully_masked_softmax_row_is_nan_with_inf_and_uniform_with_large_fill(framework):
    def softmax(fill):
        if framework == "torch":
            return torch.softmax(torch.full((4,), fill), dim=-1).numpy()
        return np.asarray(jax.nn.softmax(jnp.full((4,), fill)))

    assert np.isnan(softmax(-np.inf)).all()
    np.testing.assert_allclose(softmax(-1e20), 0.25)


def test_both_twins_fill_masks_with_the_same_finite_value():
    import flaxformer_mini.model.attention
    import torch_ref.attention

    assert flaxformer_mini.model.attention.MASK_FILL_VALUE == torch_ref.attention.MASK_FILL_VALUE == -1e20


def test_embedding_default_scales_differ_and_the_twin_takes_torch():
    from flaxformer_mini.model.primitives import embedding

    D = 64
    torch.manual_seed(0)
    assert torch.nn.Embedding(1000, D).weight.detach().std().item() == pytest.approx(1.0, abs=0.02)
    flax_std = float(nnx.Embed(1000, D, rngs=nnx.Rngs(0)).embedding.get_value().std())
    assert flax_std == pytest.approx(1 / np.sqrt(D), rel=0.02)
    assert float(embedding(1000, D, rngs=nnx.Rngs(0)).embedding.get_value().std()) == pytest.approx(1.0, abs=0.02)


def test_torch_clipping_ends_under_max_norm_and_optax_and_the_twin_hit_it():
    from torch_ref.training import clip_grad_norm

    def param():
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.tensor([1.2, 1.6])  # norm 2
        return p

    q, r = param(), param()
    torch.nn.utils.clip_grad_norm_([q], max_norm=1.0)
    clip_grad_norm([r], max_norm=1.0)
    clipped, _ = optax.clip_by_global_norm(1.0).update(jnp.array([1.2, 1.6]), optax.EmptyState())
    assert 1.0 - q.grad.norm().item() == pytest.approx(5e-7, rel=0.2)  # max / (norm + 1e-6)
    np.testing.assert_array_equal(r.grad.numpy(), np.asarray(clipped))
