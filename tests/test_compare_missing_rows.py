"""``parity.compare`` where the two models do not have the same rows: a port that calls a
function where torch has a module, ``ignore_missing`` by name, and a rename map that does
not fit (which would otherwise leave rows unmatched, and ignore_missing would hide them).

Shapes: x (N, L, D); every linear layer D -> D but the head, D -> OUT.
"""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import parity
from parity import ConversionError

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

D, OUT, N, L = 4, 3, 2, 5  # every size distinct, so a wrong axis cannot pass
LAYERS = 2


class _TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(D, D), torch.nn.GELU(), torch.nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_TorchBlock() for _ in range(LAYERS)])
        self.proj, self.out_act = torch.nn.Linear(D, OUT), torch.nn.Tanh()

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out_act(self.proj(x))


class _FlaxBlock(nnx.Module):
    def __init__(self, rngs):
        self.fc1, self.fc2 = nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        # torch's nn.GELU() is the exact erf form; jax.nn.gelu's default is the tanh approximation.
        return x + self.fc2(nnx.gelu(self.fc1(x), approximate=False))


class _FlaxNet(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([_FlaxBlock(rngs) for _ in range(LAYERS)])
        self.out = nnx.Linear(D, OUT, rngs=rngs)  # torch's `proj`

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return nnx.tanh(self.out(x))


RENAME = {"proj.weight": "out.weight", "proj.bias": "out.bias"}
GELU_ROWS = [f"blocks.{i}.act" for i in range(LAYERS)]


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    t = _TorchNet().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxNet(nnx.Rngs(0)), rename=RENAME)
    x = np.random.default_rng(0).standard_normal((N, L, D)).astype(np.float32)
    return t, f, (torch.from_numpy(x),), (x,)


def test_rows_only_torch_has_fail_and_the_note_says_how_to_leave_them_out_by_name(pair):
    report = parity.compare(*pair, rename=RENAME)
    assert not report.ok and report.first_divergence.name == "blocks.0.act"
    assert report.first_divergence.note == "missing on the Flax side"
    (note,) = report.notes
    assert note.startswith("3 row(s) only one side has (blocks.0.act, blocks.1.act, out_act): ")
    assert "ignore_missing=[module-path prefixes]" in note and "'blocks.{}.mlp.act'" in note
    assert f"note: {note}" in report.format_table()


def test_ignore_missing_by_prefix_leaves_out_those_rows_alone(pair):
    # The GELU modules by one pattern ({} a layer index): torch's Tanh module still fails.
    report = parity.compare(*pair, rename=RENAME, ignore_missing="blocks.{}.act")
    assert [name for name, _ in report.left_out] == GELU_ROWS
    assert report.first_divergence.name == "out_act" and report.first_divergence.note == "missing on the Flax side"
    assert report.notes == [
        "1 row(s) only one side has (out_act): a port that calls a function where torch has a module (nnx.gelu for "
        "nn.GELU()) or computes a tied head with Embed.attend has no row there; ignore_missing=[module-path prefixes] "
        "leaves those rows out by name ({} for a layer index: 'blocks.{}.mlp.act'), ignore_missing=True every such row"]
    # Both by name, or by a predicate: every other row compared, and within the tolerance.
    for leave in (["blocks.{}.act", "out_act"], [*GELU_ROWS, "out_act"], lambda name: name.endswith("act")):
        report = parity.compare(*pair, rename=RENAME, ignore_missing=leave)
        assert report.ok and report.notes == [], report.format_table()
        assert [name for name, _ in report.left_out] == [*GELU_ROWS, "out_act"]
        assert {r.name for r in report.rows} == {"blocks.0.fc1", "blocks.0.fc2", "blocks.0", "blocks.1.fc1",
                                                  "blocks.1.fc2", "blocks.1", "out", ""}
    assert parity.compare(*pair, rename=RENAME, ignore_missing=True).left_out == report.left_out


def test_an_ignore_missing_prefix_that_matches_no_missing_row_is_an_error_naming_them(pair):
    # "blocks.act" is a typo; "blocks.0.fc1" is on both sides: leaving it out would do nothing.
    for typo in ("blocks.act", "blocks.0.fc1"):
        with pytest.raises(ValueError, match=(rf"compare: ignore_missing prefix '{typo}' matches no row only one "
                                              rf"side has \(those rows: blocks.0.act, blocks.1.act, out_act\)")):
            parity.compare(*pair, rename=RENAME, ignore_missing=["blocks.{}.act", typo])
    with pytest.raises(TypeError, match="ignore_missing is True, False, a predicate on row names or module-path"):
        parity.compare(*pair, rename=RENAME, ignore_missing=[1])


@pytest.mark.parametrize(("rename", "named"), [
    ({"proj.weight": "out.weight", "proj.bias": "ot.bias"}, "pattern 'proj.bias': its target 'ot.bias' matches no key"),
    ({"proj.weight": "out.weight", "projj.bias": "out.bias"}, "pattern 'projj.bias' matches no key"),
], ids=["target", "source"])
def test_a_rename_map_that_does_not_fit_is_refused_as_conversion_refuses_it(pair, rename, named):
    # Unrefused, the misspelt pattern would rename no row, `proj` and `out` would each be missing
    # on one side, and ignore_missing=True would leave both out: a pass that compares no head at all.
    t, f, tx, fx = pair
    with pytest.raises(ConversionError, match=named):
        parity.compare(t, f, tx, fx, rename=rename, ignore_missing=True)
    with pytest.raises(ConversionError, match=r"'out.bias'|'proj.bias'"):  # as the conversion refuses it
        parity.torch_to_flax(t.state_dict(), _FlaxNet(nnx.Rngs(0)), rename=rename)


# ------------------------------------------------------------------ a renamed module without parameters


class _TorchMixer(torch.nn.Module):  # holds no parameter of its own: its children do
    def __init__(self):
        super().__init__()
        self.wq, self.wo = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

    def forward(self, x):
        return self.wo(self.wq(x))


class _TorchMixerNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(LAYERS)])
        for layer in self.layers:
            layer.attn = _TorchMixer()

    def forward(self, x):
        for layer in self.layers:
            x = x + layer.attn(x)
        return x


class _FlaxMixer(nnx.Module):
    def __init__(self, rngs):
        self.query, self.out = nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return self.out(self.query(x))


class _FlaxMixerNet(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([nnx.Module() for _ in range(LAYERS)])
        for block in self.blocks:
            block.attention = _FlaxMixer(rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = x + block.attention(x)
        return x


def test_a_module_the_rename_map_renames_only_through_its_childrens_keys_is_matched_by_its_new_name():
    # The map names parameters alone; layers.0.attn (no parameter of its own), left under its
    # torch name, would fail a correct port as missing on the Flax side, blocks.0.attention on torch's.
    rename = {"layers.{}.attn.wq.{}": "blocks.{}.attention.query.{}", "layers.{}.attn.wo.{}": "blocks.{}.attention.out.{}"}
    torch.manual_seed(0)
    t = _TorchMixerNet().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxMixerNet(nnx.Rngs(0)), rename=rename)
    x = np.random.default_rng(0).standard_normal((N, L, D)).astype(np.float32)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5, rename=rename)
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == [f"blocks.{i}.attention{part}" for i in range(LAYERS)
                                             for part in (".query", ".out", "")] + [""]
    # A prefix the map sends to two places is no module's name: left as it is, and reported.
    split = {"layers.0.attn.wq.{}": "blocks.0.attention.query.{}", "layers.0.attn.wo.{}": "blocks.0.mixer.out.{}"}
    assert parity.Rename(split).module_path("layers.0.attn") == "layers.0.attn"
    assert parity.Rename(split).module_path("layers.0") == "blocks.0"


class _TorchActMixer(_TorchMixer):  # a parameter-free child under a module the map renames
    def __init__(self):
        super().__init__()
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.wo(self.act(self.wq(x)))


class _Gelu(nnx.Module):
    def __call__(self, x):
        return jax.nn.gelu(x, approximate=False)  # torch.nn.GELU's default is the exact erf form


class _FlaxActMixer(_FlaxMixer):
    def __init__(self, rngs):
        super().__init__(rngs)
        self.act = _Gelu()

    def __call__(self, x):
        return self.out(self.act(self.query(x)))


def test_a_parameter_free_child_of_a_renamed_module_is_matched_under_its_parents_new_name():
    # layers.0.attn.act is named by no pattern, whole or in part: left under its torch name it
    # would be missing on the Flax side, blocks.0.attention.act on torch's.
    rename = {"layers.{}.attn.wq.{}": "blocks.{}.attention.query.{}", "layers.{}.attn.wo.{}": "blocks.{}.attention.out.{}"}
    torch.manual_seed(0)
    t = _TorchMixerNet()
    for layer in t.layers:
        layer.attn = _TorchActMixer()
    t.eval()
    f = _FlaxMixerNet(nnx.Rngs(0))
    for block in f.blocks:
        block.attention = _FlaxActMixer(nnx.Rngs(0))
    f = parity.torch_to_flax(t.state_dict(), f, rename=rename)
    x = np.random.default_rng(0).standard_normal((N, L, D)).astype(np.float32)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5, rename=rename)
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == [f"blocks.{i}.attention{part}" for i in range(LAYERS)
                                             for part in (".query", ".act", ".out", "")] + [""]
    split = {"layers.0.attn.wq.{}": "blocks.0.attention.query.{}", "layers.0.attn.wo.{}": "blocks.0.mixer.out.{}"}
    assert parity.Rename(split).module_path("layers.0.attn.act") == "layers.0.attn.act"  # no one parent
