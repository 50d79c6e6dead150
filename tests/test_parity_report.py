"""What a parity report tells a porter about any pair of models: where in a tensor the largest
difference lies, what the comparison left out and why, outputs of any structure (tuples,
dicts), and the whole model's output called "output" (the seed's "logits" is an alias of its own).
"""

import numpy as np
import pytest
import torch
from flax import nnx

import parity
from parity import Row, compare_intermediates
from parity.report import largest_at

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

D = 8


def test_the_first_divergence_names_the_index_of_its_largest_difference():
    t = np.zeros((2, 3, 4), np.float32)
    f = t.copy()
    f[1, 2, 3], f[0, 1, 1] = 0.5, 0.25
    report = compare_intermediates({"ok": np.ones(2), "bad": t}, {"ok": np.ones(2), "bad": f}, atol=1e-5)
    first = report.first_divergence
    assert first.name == "bad" and first.at == (1, 2, 3) and report.rows[0].at is None  # nothing differs there
    assert report.format_table().endswith("first divergence: bad (max abs diff 5.000e-01 > 1e-05 at [1, 2, 3])")
    assert report.to_dict()["rows"][1]["at"] == [1, 2, 3]


def test_a_non_finite_difference_is_located_before_any_larger_finite_one():
    d = np.array([[0.0, 7.0], [np.nan, np.inf]])  # NaN wins no argmax: the first non-finite is where to look
    assert largest_at(d) == (1, 0)
    assert largest_at(np.zeros((2, 2))) is None and largest_at(np.array(3.0)) is None


def test_a_row_missing_on_one_side_is_named_missing_not_an_infinite_difference():
    report = compare_intermediates({"a": np.ones(2)}, {"a": np.ones(2), "b": np.ones(2)}, atol=1e-5)
    assert report.format_table().endswith("first divergence: b (missing on the torch side)")


class _TorchDictOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.head = torch.nn.Linear(D, 3)

    def forward(self, x):
        h = self.proj(x)
        return {"pooled": h.mean(1), "logits": self.head(h)}


class _FlaxDictOut(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, D, rngs=rngs)
        self.head = nnx.Linear(D, 3, rngs=rngs)

    def __call__(self, x):
        h = self.proj(x)
        return {"logits": self.head(h), "pooled": h.mean(1)}  # another insertion order than torch's


def test_dict_outputs_are_compared_item_by_item_under_their_keys():
    torch.manual_seed(0)
    t = _TorchDictOut().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxDictOut(nnx.Rngs(0)))
    x = np.random.default_rng(0).normal(size=(2, 5, D)).astype(np.float32)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.ok, report.format_table(show_all=True)
    assert [r.label for r in report.rows] == ["proj", "head", "output['logits']", "output['pooled']"]
    # A fault that only the pooled output shows:
    class Wrong(_FlaxDictOut):
        def __call__(self, x):
            out = super().__call__(x)
            return {**out, "pooled": out["pooled"] * 1.01}

    f.__class__ = Wrong
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.first_divergence.label == "output['pooled']"


class _TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(D, 2, batch_first=True)
        self.out = torch.nn.Linear(D, 3)

    def forward(self, x):
        return self.out(self.attn(x, x, x, need_weights=False)[0])


class _FlaxAttention(nnx.Module):
    def __init__(self, rngs):
        self.attn = nnx.MultiHeadAttention(2, D, decode=False, rngs=rngs)
        self.out = nnx.Linear(D, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(self.attn(x))


def _ported_and_compared(torch_type):
    """(torch model, its port with the converted weights, compare's inputs, the report) of
    ``torch_type``'s attention model against ``_FlaxAttention``; a correct port, so the report passes."""
    torch.manual_seed(0)
    t = torch_type().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxAttention(nnx.Rngs(0)))
    x = np.random.default_rng(1).normal(size=(2, 4, D)).astype(np.float32)
    inputs = ((torch.as_tensor(x),), (x,))
    report = parity.compare(t, f, *inputs, atol=1e-5)
    assert report.ok, report.format_table(show_all=True)
    return t, f, inputs, report


def test_the_sublayers_of_an_attention_torch_computes_in_one_call_are_left_out_and_said_so():
    # nn.MultiheadAttention runs its projections inside one call (no query/key/value modules);
    # nnx.MultiHeadAttention calls four sublayers. Compared, they would fail a correct port on
    # "attn.key ... missing on the torch side" without ignore_missing.
    t, f, inputs, report = _ported_and_compared(_TorchAttention)
    assert [r.name for r in report.rows] == ["attn[0]", "out", ""]
    why = "inside attn, a MultiHeadAttention that torch computes in one call"
    assert sorted(report.left_out) == [(f"attn.{n}", why) for n in ("key", "out", "query", "value")]
    assert f"(4 left out, {why}: attn." in report.format_table()
    assert {"name": "attn.query", "why": why} in report.to_dict()["left_out"]


class _TorchAttentionDefaultCall(_TorchAttention):
    def forward(self, x):
        return self.out(self.attn(x, x, x)[0])  # need_weights=True, torch's default: (output, weights)


def test_the_attention_weights_of_a_default_multihead_attention_call_are_left_out_not_failed():
    # Compared, torch's averaged attention weights, which nnx.MultiHeadAttention never returns, would
    # fail a correct port of a default nn.MultiheadAttention call on "attn[1] missing on the Flax side".
    t, f, inputs, report = _ported_and_compared(_TorchAttentionDefaultCall)
    assert [r.name for r in report.rows] == ["attn[0]", "out", ""]
    assert ("attn[1]", "the attention weights torch's attn returns (need_weights=True, its default), which the "
                       "port's MultiHeadAttention does not") in report.left_out
    f.attn.value.kernel.set_value(f.attn.value.kernel.get_value() * 2)  # the output itself is still compared
    assert parity.compare(t, f, *inputs, atol=1e-5).first_divergence.name == "attn[0]"


class _TorchSequenceFirstAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(D, 2)  # batch_first=False, torch's default: (L, N, E)
        self.out = torch.nn.Linear(D, 3)

    def forward(self, x):  # x: (N, L, E), as the port's
        y = x.transpose(0, 1)
        return self.out(self.attn(y, y, y, need_weights=False)[0].transpose(0, 1))


def test_a_sequence_first_multihead_attention_is_compared_batch_first_and_said_so():
    # Compared as torch returns it, the (L, N, E) output would fail a correct port at attn[0]
    # with "shape differs: Flax (2, 4, D)".
    t, f, inputs, report = _ported_and_compared(_TorchSequenceFirstAttention)
    assert [(r.name, r.shape) for r in report.rows] == [("attn[0]", (2, 4, D)), ("out", (2, 4, 3)), ("", (2, 4, 3))]
    assert any(note.startswith("torch's attn computes sequence-first (L, N, E)") for note in report.notes)
    f.attn.value.kernel.set_value(f.attn.value.kernel.get_value() * 2)  # a fault there is still found there
    assert parity.compare(t, f, *inputs, atol=1e-5).first_divergence.name == "attn[0]"


def test_ignore_missing_lists_every_row_it_left_out_and_a_rename_typo_is_refused_not_left_out():
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.ReLU(), torch.nn.Linear(D, 3)).eval()

    class Port(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, 3, rngs=rngs)])
            self.extra = nnx.Linear(3, 3, rngs=rngs)  # run on the side: only Flax has its row

        def __call__(self, x):
            y = self.layers[1](nnx.relu(self.layers[0](x)))
            self.extra(y)
            return y

    rename = {"0.{}": "layers.0.{}", "2.{}": "layers.1.{}"}
    f = Port(nnx.Rngs(0))
    state = {**parity.flax_to_torch(f, rename=rename), **t.state_dict()}
    f = parity.torch_to_flax(state, f, rename=rename)
    x = np.ones((2, D), np.float32)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5, rename=rename, ignore_missing=True)
    assert report.ok and [r.name for r in report.rows] == ["layers.0", "layers.1", ""]
    assert report.left_out == [("1", "only torch has them, by ignore_missing"),
                               ("extra", "only Flax has them, by ignore_missing")]
    table = report.format_table()
    assert "(1 left out, only torch has them, by ignore_missing: 1)" in table
    assert "(1 left out, only Flax has them, by ignore_missing: extra)" in table
    # A typo in the map ("layer" for "layers") renames no row, and ignore_missing would leave the
    # unmatched rows of both sides out: a pass that compares nothing but the output. Refused.
    typo = {"0.{}": "layer.0.{}", "2.{}": "layer.1.{}"}
    with pytest.raises(parity.ConversionError, match=r"its target 'layer.0.\{\}' matches no key \(did you mean "
                                                     r"'layers.0.\{\}'\?\)"):
        parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5, rename=typo, ignore_missing=True)


def test_a_parameter_frozen_in_torch_is_left_out_of_the_gradients_not_failed():
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Linear(D, 3))
    t[0].weight.requires_grad_(False)

    class Port(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(D, D, rngs=rngs), nnx.Linear(D, 3, rngs=rngs)])

        def __call__(self, x):
            return self.layers[1](self.layers[0](x))

    rename = {"{}.{}": "layers.{}.{}"}  # torch's Sequential indices are the port's list's
    f = parity.torch_to_flax(t.state_dict(), Port(nnx.Rngs(0)), rename=rename)
    x = np.random.default_rng(2).normal(size=(2, D)).astype(np.float32)
    report = parity.compare_gradients(t, f, lambda m, x: m(x).square().sum(), lambda m, x: (m(x) ** 2).sum(),
                                      (torch.as_tensor(x),), (x,), rename=rename)
    # A frozen weight's zero torch "gradient" compared with Flax's real one would fail: left out.
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == ["loss", "grad:0.bias", "grad:1.weight", "grad:1.bias"]
    assert report.left_out == [("grad:0.weight", "frozen in torch by requires_grad=False")]


def test_a_models_whole_output_reads_output_and_the_seeds_reads_logits():
    assert [Row(n, (), 0.0, 0.0, True).label for n in ("", "[1]", "#2", "#1[0]", "enc")] == \
        ["output", "output[1]", "output#2", "output#1[0]", "enc"]
    assert Row("", (), 0.0, 0.0, True, alias="logits").label == "logits"


def test_the_table_says_how_to_show_every_row_in_the_callers_words():
    rows = {f"r{i}": np.ones(2) for i in range(3)}
    table = compare_intermediates(rows, dict(rows), atol=1e-5)
    assert "show_all=True shows them" in table.format_table()
    assert "--all shows them" in table.format_table(all_hint="--all")


def test_the_summary_of_hidden_rows_speaks_only_of_them_not_of_a_failure_shown_above():
    # Not "(8 parameter gradients compared, all within tolerance, largest difference inf in
    # grad:lstm.bias_ih_l0; ...)" when that gradient is the failure shown above the line.
    inf = float("inf")
    rows = [Row("", (2,), 1e-7, 1e-7, True), Row("enc.a", (2,), 2e-7, 1e-7, True),
            Row("enc.b", (2,), 0.5, 0.1, False), Row("loss", (), 0.0, 0.0, True),
            Row("grad:w", (20,), inf, inf, False, "shape differs: Flax (1,)"),
            Row("grad:u", (3,), 4e-8, 1e-7, True), Row("grad:v", (3,), 6e-8, 1e-7, True)]
    table = parity.Report(rows, 1e-5).format_table()
    assert "grad:w  " in table and "enc.b  " in table  # the failures, shown as rows
    assert "(1 more submodule outputs compared, all within tolerance; show_all=True shows them)" in table
    assert ("(2 more parameter gradients compared, all within tolerance, largest difference 6.000e-08 in grad:v; "
            "show_all=True shows them)") in table
    # With every gradient hidden, they are all of them, and the largest is the largest of all.
    passing = parity.Report([rows[3], rows[5], rows[6]], 1e-5).format_table()
    assert "(2 parameter gradients compared, all within tolerance, largest difference 6.000e-08 in grad:v;" in passing
