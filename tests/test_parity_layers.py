"""Every conversion rule against the PyTorch layer it stands for, with the same weights.

For each pair: the torch layer's state dict loads into the Flax layer (``parity.torch_to_flax``),
both compute the same outputs on the same input (within 1e-5: the two frameworks' kernels sum
in different orders, so forward outputs agree to float32 rounding, not bit for bit), and
torch -> Flax -> torch gives back every tensor bit for bit and loads with ``strict=True``.
Sizes are odd and distinct so a swapped axis changes a shape.

Defaults that differ, set explicitly in each Flax layer below and said in docs/porting.md:
- ``nnx.GroupNorm`` / ``nnx.RMSNorm`` epsilon 1e-6; torch's GroupNorm 1e-5, RMSNorm
  ``finfo(dtype).eps`` (1.19e-7 for float32) when ``eps=None``;
- BatchNorm momentum: torch's 0.1 weighs the new batch, Flax's 0.99 weighs the old average
  (flax momentum = 1 - torch momentum); torch's running_var uses the unbiased batch variance,
  Flax's the biased one.
"""

import copy

import numpy as np
import pytest
import torch
from flax import nnx

import parity
from parity import ConversionError, flax_to_torch, torch_to_flax

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

ATOL = 1e-5
RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _nlc(x):  # torch (N, C, *spatial) -> Flax (N, *spatial, C)
    return np.moveaxis(x, 1, -1)


def _randomize_buffers(layer):
    # Fresh running statistics are 0 and 1, which a swapped mean/var would not reveal.
    if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
        layer.running_mean.copy_(torch.randn_like(layer.running_mean))
        layer.running_var.copy_(torch.rand_like(layer.running_var) + 0.5)
        layer.num_batches_tracked.fill_(7)
    return layer


# name: (torch layer, Flax layer, torch input, Flax input from it, Flax output -> torch layout, call)
CASES = {
    "Linear-no-bias": (lambda: torch.nn.Linear(5, 7, bias=False),
                       lambda r: nnx.Linear(5, 7, use_bias=False, rngs=r), (3, 5), None, None),
    "Conv1d-stride-padding-groups": (
        lambda: torch.nn.Conv1d(3, 6, 3, stride=2, padding=1, groups=3),
        lambda r: nnx.Conv(3, 6, (3,), strides=2, padding=((1, 1),), feature_group_count=3, rngs=r),
        (2, 3, 9), _nlc, _nlc),
    "Conv2d-no-bias": (
        lambda: torch.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2, bias=False),
        lambda r: nnx.Conv(4, 6, (3, 2), strides=(2, 1), padding=((1, 1), (0, 0)), feature_group_count=2,
                           use_bias=False, rngs=r),
        (2, 4, 7, 5), _nlc, _nlc),
    "BatchNorm1d-eval": (lambda: torch.nn.BatchNorm1d(5), lambda r: nnx.BatchNorm(5, momentum=0.9, rngs=r),
                         (6, 5), None, None),
    "BatchNorm2d-eval": (lambda: torch.nn.BatchNorm2d(4), lambda r: nnx.BatchNorm(4, momentum=0.9, rngs=r),
                         (3, 4, 5, 3), _nlc, _nlc),
    "GroupNorm": (lambda: torch.nn.GroupNorm(2, 6), lambda r: nnx.GroupNorm(6, num_groups=2, epsilon=1e-5, rngs=r),
                  (2, 6, 5), _nlc, _nlc),
    "RMSNorm": (lambda: torch.nn.RMSNorm(7),
                lambda r: nnx.RMSNorm(7, epsilon=float(np.finfo(np.float32).eps), rngs=r), (3, 4, 7), None, None),
    "LayerNorm-no-affine-bias": (lambda: torch.nn.LayerNorm(7, bias=False),
                                 lambda r: nnx.LayerNorm(7, epsilon=1e-5, use_bias=False, rngs=r), (3, 7), None, None),
    # torch's slope starts at 0.25, Flax's at 0.01: the outputs agree only if it was carried.
    "PReLU": (lambda: torch.nn.PReLU(), lambda r: nnx.PReLU(), (3, 7), None, None),
}


def _pair(name):
    make_torch, make_flax, *_ = CASES[name]
    torch.manual_seed(1)
    t = _randomize_buffers(make_torch()).eval()
    f = make_flax(nnx.Rngs(5))
    f.eval()
    return t, f


def _assert_round_trip(t, f, **kw):
    back = flax_to_torch(f, **kw)
    want = t.state_dict()
    assert list(back) == [k for k in want if k in back] and set(back) == set(want)
    for key, value in want.items():
        if key.endswith("num_batches_tracked"):
            continue  # no Flax counterpart: written back as 0 (its rule), not carried
        assert torch.equal(back[key], value), key
    copy.deepcopy(t).load_state_dict(back, strict=True)  # loads strictly into the torch layer


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_forward_matches_torch_and_round_trip_is_bit_exact(name):
    _, _, shape, to_flax_input, to_torch_output = CASES[name]
    t, f = _pair(name)
    torch_to_flax(t.state_dict(), f)
    x = _rand(*shape)
    with torch.no_grad():
        want = t(torch.as_tensor(x)).cpu().numpy()
    got = np.asarray(f(to_flax_input(x) if to_flax_input else x))
    got = np.moveaxis(got, -1, 1) if to_torch_output else got
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    _assert_round_trip(t, f)


def test_embedding_with_padding_idx_matches_forward_and_differs_only_in_the_pad_rows_gradient():
    torch.manual_seed(0)
    t = torch.nn.Embedding(11, 5, padding_idx=0)
    f = torch_to_flax(t.state_dict(), nnx.Embed(11, 5, rngs=nnx.Rngs(0)))
    ids = np.array([[0, 3, 4], [5, 0, 0]])
    np.testing.assert_array_equal(np.asarray(f(ids)), t(torch.as_tensor(ids)).detach().cpu().numpy())
    _assert_round_trip(t, f)
    # padding_idx is a torch-only gradient rule: the pad row gets no gradient in torch, and
    # does in Flax (nnx.Embed has no padding_idx), so gradient parity names exactly that row.
    report = parity.compare_gradients(t, f, lambda m, i: m(i).sum(), lambda m, i: m(i).sum(),
                                      (torch.as_tensor(ids),), (ids,), atol=ATOL)
    (row,) = [r for r in report.rows if r.kind == "gradient"]
    assert not row.ok and row.max_abs == 3.0  # the pad id appears 3 times; d(sum)/d(row) = 3
    assert row.at == (0, 0)  # the largest difference lies in row 0, the pad row (every column equal: the first)
    assert report.format_table().endswith("first divergence: grad:weight (max abs diff 3.000e+00 > 1e-05 at [0, 0])")


class _TorchAttentionBlock(torch.nn.Module):
    def __init__(self, need_weights):
        super().__init__()
        self.need_weights = need_weights
        self.norm = torch.nn.LayerNorm(12)
        self.attention = torch.nn.MultiheadAttention(12, 3, batch_first=True)
        self.out = torch.nn.Linear(12, 5)

    def forward(self, x):
        y = self.norm(x)
        return self.out(self.attention(y, y, y, need_weights=self.need_weights)[0])


class _FlaxAttentionBlock(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.LayerNorm(12, epsilon=1e-5, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(3, 12, decode=False, rngs=rngs)
        self.out = nnx.Linear(12, 5, rngs=rngs)

    def __call__(self, x):
        return self.out(self.attention(self.norm(x)))


@pytest.mark.parametrize("need_weights", [False, True])
def test_compare_of_a_multihead_attention_port_keeps_the_attention_row_and_names_a_fault_there(need_weights):
    # torch's module returns (output, weights or None), recorded as attention[0] (and [1]); the
    # port's returns the output alone, matched to [0]. ignore_missing drops only what one side
    # has (the port's query/key/value/out calls, torch's weights): never the attention's output.
    torch.manual_seed(0)
    t = _TorchAttentionBlock(need_weights).eval()
    f = _FlaxAttentionBlock(nnx.Rngs(0))
    torch_to_flax(t.state_dict(), f)
    x = _rand(2, 5, 12)
    inputs = ((torch.as_tensor(x),), (x,))
    report = parity.compare(t, f, *inputs, atol=ATOL, ignore_missing=True)
    assert report.ok and [r.name for r in report.rows] == ["norm", "attention[0]", "out", ""]  # "": the whole model
    f.attention.query.kernel.set_value(f.attention.query.kernel.get_value()[:, ::-1, :])  # the heads reversed
    report = parity.compare(t, f, *inputs, atol=ATOL, ignore_missing=True)
    assert report.first_divergence.name == "attention[0]"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_multihead_attention_in_proj_splits_into_query_key_value(bias):
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(12, 3, bias=bias, batch_first=True).eval()
    f = nnx.MultiHeadAttention(3, 12, use_bias=bias, decode=False, rngs=nnx.Rngs(0))
    torch_to_flax(t.state_dict(), f)
    assert f.query.kernel.get_value().shape == (12, 3, 4)  # (D, H, K)
    x = _rand(2, 5, 12)
    with torch.no_grad():
        want = t(*(torch.as_tensor(x),) * 3, need_weights=False)[0].cpu().numpy()
    np.testing.assert_allclose(np.asarray(f(x)), want, atol=ATOL, rtol=0)
    _assert_round_trip(t, f)


def test_multihead_attention_with_other_key_and_value_widths_converts_from_its_separate_projections():
    # kdim/vdim other than embed_dim: torch keeps q_proj_weight, k_proj_weight, v_proj_weight
    # (and one in_proj_bias). A plan expecting one in_proj_weight of the query's shape (24, 8)
    # for chunks of (8, 8), (8, 6), (8, 6) would refuse torch's own state dict.
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(12, 3, kdim=7, vdim=7, batch_first=True).eval()
    f = nnx.MultiHeadAttention(3, 12, in_kv_features=7, decode=False, rngs=nnx.Rngs(0))
    assert parity.torch_key_shapes(f) == {"q_proj_weight": (12, 12), "k_proj_weight": (12, 7), "v_proj_weight": (12, 7),
                                          "in_proj_bias": (36,), "out_proj.weight": (12, 12), "out_proj.bias": (12,)}
    torch_to_flax(t.state_dict(), f)
    assert f.key.kernel.get_value().shape == (7, 3, 4)  # (kdim, H, K)
    q, kv = _rand(2, 5, 12), _rand(2, 6, 7)
    with torch.no_grad():
        want = t(torch.as_tensor(q), torch.as_tensor(kv), torch.as_tensor(kv), need_weights=False)[0].cpu().numpy()
    np.testing.assert_allclose(np.asarray(f(q, kv, kv)), want, atol=ATOL, rtol=0)
    _assert_round_trip(t, f)


def test_chunks_of_one_torch_tensor_that_differ_past_axis_0_without_names_of_their_own_are_refused():
    class Pair(nnx.Module):  # torch: one (5, 3) weight = [a; b]; here b is (2, 4) after transposing
        def __init__(self):
            self.a = nnx.Param(np.zeros((3, 3), np.float32))
            self.b = nnx.Param(np.zeros((4, 2), np.float32))

    rules = dict(parity.RULES)
    parity.register_rule(Pair, parity.Rule("w", "a", parity.rules.TRANSPOSE, part=(0, 2)),
                         parity.Rule("w", "b", parity.rules.TRANSPOSE, part=(1, 2)), table=rules)
    with pytest.raises(ConversionError, match=r"^'w': its 2 chunks have torch shapes that differ past axis 0 "
                                              r"\(a \(3, 3\), b \(2, 4\)\), so no one tensor holds them; give each "
                                              r"chunk's Rule the name it has on its own \(Rule\(\.\.\., unfused_name=\.\.\.\)\)"):
        parity.torch_key_shapes(Pair(), rules=rules)


def test_batchnorm_train_mode_outputs_match_and_running_stats_follow_the_documented_conventions():
    torch.manual_seed(0)
    t = _randomize_buffers(torch.nn.BatchNorm1d(5, momentum=0.1)).train()
    # flax momentum = 1 - torch momentum: Flax weighs the old average, torch the new batch.
    f = torch_to_flax(t.state_dict(), nnx.BatchNorm(5, momentum=0.9, rngs=nnx.Rngs(0)))
    f.train()
    old_mean, old_var = t.running_mean.cpu().numpy().copy(), t.running_var.cpu().numpy().copy()
    x = _rand(8, 5)
    want = t(torch.as_tensor(x)).detach().cpu().numpy()
    np.testing.assert_allclose(np.asarray(f(x)), want, atol=ATOL, rtol=0)  # both normalize by the biased variance
    x64, n = x.astype(np.float64), x.shape[0]
    expected_mean = 0.9 * old_mean + 0.1 * x64.mean(axis=0)
    np.testing.assert_allclose(np.asarray(f.mean.get_value()), expected_mean, atol=1e-6, rtol=0)
    np.testing.assert_allclose(t.running_mean.cpu().numpy(), expected_mean, atol=1e-6, rtol=0)
    # torch folds the unbiased batch variance (n / (n - 1)) into running_var; Flax the biased one.
    np.testing.assert_allclose(np.asarray(f.var.get_value()), 0.9 * old_var + 0.1 * x64.var(axis=0), atol=1e-6, rtol=0)
    np.testing.assert_allclose(t.running_var.cpu().numpy(), 0.9 * old_var + 0.1 * x64.var(axis=0) * n / (n - 1),
                               atol=1e-6, rtol=0)


def test_register_rule_teaches_a_new_layer_type_without_editing_the_package():
    class Scale(nnx.Module):
        def __init__(self, n, rngs):
            self.w = nnx.Param(rngs.params.normal((n,)))

    table = dict(parity.RULES)
    with pytest.raises(ConversionError, match=r"w \(a Scale\)"):
        torch_to_flax({"w": torch.ones(3)}, Scale(3, nnx.Rngs(0)), rules=table)
    parity.register_rule(Scale, parity.Rule("gain", "w"), table=table)
    f = torch_to_flax({"gain": torch.arange(3.0)}, Scale(3, nnx.Rngs(0)), rules=table)
    np.testing.assert_array_equal(np.asarray(f.w.get_value()), [0.0, 1.0, 2.0])
    assert Scale not in parity.RULES  # the package's table is untouched


def test_a_per_channel_prelu_is_refused_by_shape_since_nnx_prelu_has_one_slope():
    with pytest.raises(ConversionError, match=r"shape mismatch for 'weight': checkpoint \(4,\), model expects \(1,\)"):
        torch_to_flax(torch.nn.PReLU(4).state_dict(), nnx.PReLU())


def test_a_reshape_that_changes_the_number_of_values_is_refused_naming_both_shapes():
    rules = dict(parity.RULES)
    parity.register_rule(nnx.PReLU, parity.Rule("weight", "negative_slope", (parity.rules.Reshape((2,)),)), table=rules)
    with pytest.raises(ConversionError, match=r"Reshape\(\(2,\)\) cannot stand for a Flax variable of shape \(\): "
                                              r"they hold 2 and 1 values"):
        parity.torch_key_shapes(nnx.PReLU(), rules=rules)


def test_torch_only_buffer_without_a_rule_is_reported_not_dropped():
    t = torch.nn.BatchNorm1d(5)
    f = nnx.LayerNorm(5, rngs=nnx.Rngs(0))  # a port that lost the running statistics
    with pytest.raises(ConversionError) as info:
        torch_to_flax(t.state_dict(), f)
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        assert f"unexpected key {key!r}" in str(info.value)


def test_conv_kernel_given_in_flax_layout_is_called_another_layout():
    t = torch.nn.Conv2d(4, 6, (3, 2))
    f = nnx.Conv(4, 6, (3, 2), rngs=nnx.Rngs(0))
    bad = dict(t.state_dict(), weight=t.weight.detach().permute(2, 3, 1, 0))  # HWIO: what Flax holds
    with pytest.raises(ConversionError, match=r"looks like a kernel in another layout"):
        torch_to_flax(bad, f)


class _TorchConvThenSequence(torch.nn.Module):
    """Conv1d on (N, C, L), then sequence layers on (N, L, C), as speech and text front ends do."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 5, 3, padding=1)
        self.norm = torch.nn.LayerNorm(5)
        self.head = torch.nn.Linear(5, 7)

    def forward(self, x):  # x: (N, 3, L)
        return self.head(self.norm(self.conv(x).transpose(1, 2)))


class _FlaxConvThenSequence(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 5, (3,), padding=((1, 1),), rngs=rngs)
        self.norm = nnx.LayerNorm(5, epsilon=1e-5, rngs=rngs)
        self.head = nnx.Linear(5, 7, rngs=rngs)

    def __call__(self, x):  # x: (N, L, 3): nnx.Conv is channels-last, so no transpose
        return self.head(self.norm(self.conv(x)))


@pytest.mark.parametrize("channels_last", [["conv"], "conv", lambda name: name.startswith("conv")],
                         ids=["prefixes", "one-prefix", "predicate"])
def test_compare_moves_the_channel_axis_only_in_the_rows_channels_last_names(channels_last):
    torch.manual_seed(0)
    t = _TorchConvThenSequence().eval()
    f = torch_to_flax(t.state_dict(), _FlaxConvThenSequence(nnx.Rngs(0)))
    x = _rand(2, 3, 11)  # N=2, C=3, L=11: every size distinct
    inputs = ((torch.as_tensor(x),), (_nlc(x),))
    report = parity.compare(t, f, *inputs, atol=ATOL, channels_last=channels_last)
    assert report.ok, report.format_table(show_all=True)
    assert [(r.name, r.shape) for r in report.rows] == [
        ("conv", (2, 5, 11)), ("norm", (2, 11, 5)), ("head", (2, 11, 7)), ("", (2, 11, 7))]
    # All or nothing cannot pass: True moves the sequence layers' rows too.
    everywhere = parity.compare(t, f, *inputs, atol=ATOL, channels_last=True)
    assert everywhere.first_divergence.name == "norm" and everywhere.first_divergence.note.startswith("shape differs")

    f.norm.epsilon = 1e-1  # a planted fault after the transpose
    assert parity.compare(t, f, *inputs, atol=ATOL, channels_last=channels_last).first_divergence.name == "norm"
    f.norm.epsilon = 1e-5
    f.conv.kernel.set_value(f.conv.kernel.get_value()[::-1])  # one before it: the kernel's taps reversed
    assert parity.compare(t, f, *inputs, atol=ATOL, channels_last=channels_last).first_divergence.name == "conv"


def test_channels_last_prefix_matching_no_row_is_refused_naming_it():
    t, f = _TorchConvThenSequence().eval(), _FlaxConvThenSequence(nnx.Rngs(0))
    x = _rand(2, 3, 11)
    with pytest.raises(ValueError, match=r"channels_last prefix 'con' matches no row of the Flax model"):
        parity.compare(t, f, (torch.as_tensor(x),), (_nlc(x),), channels_last=["conv", "con"])
    with pytest.raises(ValueError, match=r"input 0: torch shape \(2, 3, 11\), Flax shape \(2, 4, 11\) \(nor with"):
        parity.compare(t, f, (torch.as_tensor(x),), (_rand(2, 4, 11),), channels_last=["conv"])


@pytest.mark.parametrize("rules, problem", [
    ([], r"rules is a table \{Flax layer type: \(parity.Rule, ...\)\}, such as dict\(parity.RULES\) .* got a list"),
    ({nnx.Linear: parity.Rule("weight", "kernel")}, r"rules maps each Flax layer type \(a class\) to a tuple of "
                                                     r"parity.Rule; these entries do not: Linear: Rule\("),
    ({"Linear": (parity.Rule("weight", "kernel"),)}, r"these entries do not: 'Linear': \(Rule\("),
], ids=["a list", "one Rule, not a tuple", "a name, not a class"])
def test_a_rules_argument_that_is_no_rule_table_is_refused_naming_the_problem(rules, problem):
    # Unchecked, these fail deep inside the plan: "'list' object has no attribute 'get'", "'Rule'
    # object is not iterable", "'str' object has no attribute '__name__'".
    t, f = torch.nn.Linear(3, 2).eval(), nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    x = _rand(2, 3)
    for call in (lambda: torch_to_flax(t.state_dict(), f, rules=rules), lambda: parity.torch_key_shapes(f, rules=rules),
                 lambda: flax_to_torch(f, rules=rules),
                 lambda: parity.compare(t, f, (torch.as_tensor(x),), (x,), rules=rules)):
        with pytest.raises(TypeError, match=problem):
            call()


def test_a_rule_naming_a_variable_its_layer_lacks_is_named_with_the_nearest_one():
    # Unchecked, a misspelt flax_name is skipped as a bias-free layer's bias is, and the refusal names
    # only the variable left uncovered ("no conversion rule covers ... g"), under a rule the user registered.
    class Gain(nnx.Module):
        def __init__(self):
            self.g = nnx.Param(np.ones(4, np.float32))

    rules = dict(parity.RULES)
    parity.register_rule(Gain, parity.Rule("gain", "gg"), table=rules)
    with pytest.raises(ConversionError) as info:
        torch_to_flax({"gain": torch.full((4,), 2.0)}, Gain(), rules=rules)
    assert str(info.value).startswith("no conversion rule covers these variables of Gain: g (a Gain)")
    assert str(info.value).endswith("their variable types: Param (g); Gain's Rule('gain', 'gg') names 'gg', which it "
                                    "does not have (did you mean 'g'?)")
    # A bias-free layer's absent bias (an attribute holding None) is no misspelling: it converts.
    t = torch.nn.Linear(3, 2, bias=False)
    torch_to_flax(t.state_dict(), nnx.Linear(3, 2, use_bias=False, rngs=nnx.Rngs(0)))
