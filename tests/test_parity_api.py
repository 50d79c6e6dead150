"""The public API on a pair of models that are not ours and whose names differ.

``parity.torch_to_flax`` / ``flax_to_torch`` with a rename map (both ways, bit for bit),
``parity.compare`` (intermediates matched by path through the map, torch's order, first
divergence named), ``parity.compare_gradients`` on a user-given loss, and the bad input each
refuses: a pattern matching nothing, a key matching two patterns, inputs that differ; torch
inputs follow the torch model to its device.
"""

import re

import numpy as np
import pytest
import torch
from flax import nnx

import parity
from parity import ConversionError, flax_to_torch, torch_to_flax

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

D, F, V = 6, 10, 13


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(D, F)
        self.wo = torch.nn.Linear(F, D, bias=False)
        self.ln = torch.nn.LayerNorm(D)

    def forward(self, x):
        return self.ln(x + self.wo(torch.relu(self.wq(x))))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D)
        self.layers = torch.nn.ModuleList([TorchBlock(), TorchBlock()])

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        return x


class FlaxBlock(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(D, F, rngs=rngs)
        self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs)
        self.norm = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)  # torch's eps; Flax's default is 1e-6

    def __call__(self, x):
        return self.norm(x + self.down(nnx.relu(self.up(x))))


class FlaxNet(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.blocks = nnx.List([FlaxBlock(rngs), FlaxBlock(rngs)])

    def __call__(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return x


RENAME = {
    "tok.weight": "embed.weight",
    "layers.{}.wq.weight": "blocks.{}.up.weight",
    "layers.{}.wq.bias": "blocks.{}.up.bias",
    "layers.{}.wo.weight": "blocks.{}.down.weight",
    "layers.{}.ln.weight": "blocks.{}.norm.weight",
    "layers.{}.ln.bias": "blocks.{}.norm.bias",
}
IDS = np.array([[1, 4, 2, 0], [7, 3, 12, 5]])


@pytest.fixture
def pair():
    torch.manual_seed(0)
    t = TorchNet().eval()
    f = torch_to_flax(t.state_dict(), FlaxNet(nnx.Rngs(1)), rename=RENAME)
    return t, f


def test_rename_map_loads_and_round_trips_bit_exact(pair):
    t, f = pair
    back = flax_to_torch(f, rename=RENAME)
    assert set(back) == set(t.state_dict())
    for key, value in t.state_dict().items():
        assert torch.equal(back[key], value), key
    TorchNet().load_state_dict(back, strict=True)


def test_compare_matches_renamed_paths_in_torch_order_and_all_agree(pair):
    t, f = pair
    report = parity.compare(t, f, (torch.as_tensor(IDS),), (IDS,), atol=1e-5, rename=RENAME)
    names = [r.name for r in report.rows]
    assert all(r.note == "" for r in report.rows), report.format_table(show_all=True)
    # Torch's execution order, under the Flax names: embedding, then block 0's layers, ...
    assert names.index("embed") < names.index("blocks.0.up") < names.index("blocks.0.norm") < names.index("blocks.1.up")
    assert report.ok and report.max_abs <= 1e-5


def test_compare_names_a_planted_fault_as_the_first_divergence(pair):
    t, f = pair
    kernel = f.blocks[1].down.kernel
    kernel.set_value(kernel.get_value() * 1.01)
    report = parity.compare(t, f, (torch.as_tensor(IDS),), (IDS,), atol=1e-5, rename=RENAME)
    assert report.first_divergence.name == "blocks.1.down"
    assert "first divergence: blocks.1.down" in report.format_table()


def test_compare_gradients_on_a_user_loss_agree(pair):
    t, f = pair
    target = np.linspace(-1, 1, IDS.size * D, dtype=np.float32).reshape(*IDS.shape, D)

    def torch_loss(model, ids, y):
        return ((model(ids) - y) ** 2).mean()

    def flax_loss(model, ids, y):
        return ((model(ids) - y) ** 2).mean()

    report = parity.compare_gradients(t, f, torch_loss, flax_loss, (torch.as_tensor(IDS), torch.as_tensor(target)),
                                      (IDS, target), atol=1e-5, rename=RENAME)
    grads = [r for r in report.rows if r.kind == "gradient"]
    assert len(grads) == len(list(t.parameters()))
    assert report.ok, report.format_table(show_all=True)


def test_compare_gradients_without_the_rename_map_lists_both_sides_and_says_to_give_it(pair):
    t, f = pair
    report = parity.compare_gradients(t, f, lambda m, x: m(x).sum(), lambda m, x: m(x).sum(), (torch.as_tensor(IDS),),
                                      (IDS,), atol=1e-5)
    notes = {r.note for r in report.rows if r.kind == "gradient"}
    assert not report.ok and notes == {"no gradient on the Flax side", "no gradient on the torch side"}
    said = report.format_table()
    n = len(list(t.parameters())) + len(list(nnx.state(f, nnx.Param).flat_state()))
    assert f"{n} gradient(s) only one side has" in said and "the rename map (and rules) it gives torch_to_flax" in said


def test_rename_patterns_matching_nothing_or_twice_are_all_reported_at_once(pair):
    t, _ = pair
    bad = {**RENAME, "layers.{}.missing.weight": "blocks.{}.x.weight", "layers.{}.wq.{}": "blocks.{}.up.{}"}
    with pytest.raises(ConversionError) as info:
        torch_to_flax(t.state_dict(), FlaxNet(nnx.Rngs(0)), rename=bad)
    message = str(info.value)
    assert "pattern 'layers.{}.missing.weight' matches no key" in message
    assert "key 'layers.0.wq.weight' matches 2 patterns" in message and "key 'layers.1.wq.bias' matches 2" in message


def test_a_misspelt_pattern_is_named_by_the_side_that_matched_nothing_with_the_pattern_it_resembles(pair):
    # torch -> Flax meets the user's keys with the left side; Flax -> torch meets the plan's
    # keys with the right side: a typo on the right is that side's, not the left's.
    t, f = pair
    typo_left = {**RENAME, "layers.{}.wqq.bias": "blocks.{}.up.bias"}
    del typo_left["layers.{}.wq.bias"]
    with pytest.raises(ConversionError) as info:
        torch_to_flax(t.state_dict(), FlaxNet(nnx.Rngs(0)), rename=typo_left)
    assert "pattern 'layers.{}.wqq.bias' matches no key (did you mean 'layers.{}.wq.bias'?)" in str(info.value)
    typo_right = {**RENAME, "layers.{}.wq.bias": "blocks.{}.pu.bias"}
    with pytest.raises(ConversionError) as info:
        flax_to_torch(f, rename=typo_right)
    assert ("pattern 'layers.{}.wq.bias': its target 'blocks.{}.pu.bias' matches no key "
            "(did you mean 'blocks.{}.up.bias'?)") in str(info.value)


def test_two_keys_renamed_onto_one_name_are_reported(pair):
    t, _ = pair
    bad = {**RENAME, "layers.{}.wq.bias": "blocks.{}.up.weight"}
    with pytest.raises(ConversionError, match=re.escape("keys 'layers.0.wq.weight', 'layers.0.wq.bias' all rename to 'blocks.0.up.weight'")):
        torch_to_flax(t.state_dict(), FlaxNet(nnx.Rngs(0)), rename=bad)


def test_without_the_rename_map_every_key_is_named(pair):
    t, _ = pair
    with pytest.raises(ConversionError) as info:
        torch_to_flax(t.state_dict(), FlaxNet(nnx.Rngs(0)))
    assert len(info.value.missing) == len(info.value.unexpected) == len(t.state_dict())


@pytest.mark.parametrize("flax_ids, why", [
    (IDS[:, :3], "torch shape (2, 4), Flax shape (2, 3)"),
    (IDS.astype(np.float32), "torch dtype int64, Flax dtype float32"),
], ids=["shape", "dtype"])
def test_compare_refuses_inputs_that_differ_between_the_sides(pair, flax_ids, why):
    t, f = pair
    with pytest.raises(ValueError, match=re.escape(f"different inputs: input 0: {why}")):
        parity.compare(t, f, (torch.as_tensor(IDS),), (flax_ids,), rename=RENAME)


def test_torch_inputs_follow_the_torch_model_to_its_device():
    # Inputs made from numpy are on the CPU; a twin on a GPU gets them on the GPU. The meta
    # device stands in for one on a machine without it: only placement is checked, nothing runs.
    from parity.compare import on_device_of

    x = torch.zeros(2, 3)
    moved = on_device_of(torch.nn.Linear(3, 2, device="meta"), (x, 7))
    assert moved[0].device.type == "meta" and moved[0].shape == (2, 3) and moved[1] == 7
    assert on_device_of(torch.nn.Linear(3, 2), (x,))[0] is x  # already there: the same tensor
    assert on_device_of(torch.nn.ReLU(), (x,))[0] is x  # no parameters or buffers: left as given


# ----------------------------------------------------------------------------- nn.Sequential ports

W = 9  # the head's hidden width: distinct from D, F and V


class TorchHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(D, W), torch.nn.LayerNorm(W), torch.nn.Linear(W, V))

    def forward(self, x):
        return self.fc(x)


class FlaxListHead(nnx.Module):  # the nnx.List of the same children, applied by hand
    def __init__(self, rngs):
        self.fc = nnx.List([nnx.Linear(D, W, rngs=rngs), nnx.LayerNorm(W, epsilon=1e-5, rngs=rngs),
                            nnx.Linear(W, V, rngs=rngs)])

    def __call__(self, x):
        for layer in self.fc:
            x = layer(x)
        return x


class FlaxSequentialHead(nnx.Module):  # nnx.Sequential: records its own output, as torch's does
    def __init__(self, rngs):
        self.fc = nnx.Sequential(nnx.Linear(D, W, rngs=rngs), nnx.LayerNorm(W, epsilon=1e-5, rngs=rngs),
                                 nnx.Linear(W, V, rngs=rngs))

    def __call__(self, x):
        return self.fc(x)


# nnx.Sequential keeps its children under fc.layers.N (docs/porting.md, "nn.Sequential").
SEQUENTIAL_RENAME = {"fc.{}.{}": "fc.layers.{}.{}"}


@pytest.mark.parametrize("port, rename, rows", [
    (FlaxListHead, None, ["fc.0", "fc.1", "fc.2", ""]),
    (FlaxSequentialHead, SEQUENTIAL_RENAME, ["fc.layers.0", "fc.layers.1", "fc.layers.2", "fc", ""]),
], ids=["nnx.List", "nnx.Sequential"])
def test_a_sequential_ported_as_a_list_or_as_nnx_sequential_compares_clean_and_names_a_fault(port, rename, rows):
    torch.manual_seed(0)
    t = TorchHead().eval()
    f = torch_to_flax(t.state_dict(), port(nnx.Rngs(0)), rename=rename)
    back = flax_to_torch(f, rename=rename)
    assert all(torch.equal(back[k], v) for k, v in t.state_dict().items()) and set(back) == set(t.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 5, D)).astype(np.float32)
    inputs = ((torch.as_tensor(x),), (x,))
    report = parity.compare(t, f, *inputs, atol=1e-5, rename=rename)  # no ignore_missing
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == rows
    (f.fc.layers if isinstance(f.fc, nnx.Sequential) else f.fc)[1].epsilon = 1e-1  # a planted fault
    assert parity.compare(t, f, *inputs, atol=1e-5, rename=rename).first_divergence.name == rows[1]


@pytest.mark.parametrize("atol", [-1, float("nan"), float("inf"), "1e-5", None.__class__])
def test_a_tolerance_that_is_not_a_finite_number_at_least_0_is_refused_by_every_comparison(pair, atol):
    # A negative or NaN tolerance fails every row, an infinite one passes every row: neither is
    # a verdict, so each is refused before anything runs, naming the call.
    t, f = pair
    ids = (torch.as_tensor(IDS),), (IDS,)
    with pytest.raises(ValueError, match=r"^compare: atol must be a finite number >= 0, got "):
        parity.compare(t, f, *ids, atol=atol, rename=RENAME)
    with pytest.raises(ValueError, match=r"^compare_gradients: atol must be a finite number >= 0"):
        parity.compare_gradients(t, f, lambda m, x: m(x).sum(), lambda m, x: m(x).sum(), *ids, atol=atol,
                                 rename=RENAME)


def test_float64_with_a_float32_sized_tolerance_is_refused_and_its_default_is_kept(pair):
    t, f = pair
    ids = (torch.as_tensor(IDS),), (IDS,)
    with pytest.raises(ValueError, match=r"atol=1e-05 with float64=True keeps a float32-sized tolerance.*leave atol "
                                         r"out \(float64's default, 1e-10\) or give at most 1e-08"):
        parity.compare(t, f, *ids, atol=1e-5, rename=RENAME, float64=True)
    report = parity.compare(t, f, *ids, rename=RENAME, float64=True)
    assert report.atol == 1e-10 and report.ok
    assert parity.compare(t, f, *ids, atol=1e-9, rename=RENAME, float64=True).atol == 1e-9


def test_inputs_given_as_a_generator_are_refused_by_name(pair):
    # The input check would use a generator up, and the model would be called with nothing.
    t, f = pair
    with pytest.raises(TypeError, match=r"compare: torch_inputs is a tuple \(or list\) of the model's positional "
                                        r"inputs, got a generator: pass tuple\(\.\.\.\) of it"):
        parity.compare(t, f, (x for x in [torch.as_tensor(IDS)]), (IDS,), rename=RENAME)
    assert parity.compare(t, f, [torch.as_tensor(IDS)], [IDS], rename=RENAME).ok  # a list is fine


def test_a_class_or_the_other_frameworks_model_given_for_a_model_is_refused_by_name(pair):
    # Unchecked, each failed deep inside Flax's traversals or torch's named_modules
    # (IndexError: tuple index out of range; 'Linear' object has no attribute 'named_modules').
    t, f = pair
    ids = (torch.as_tensor(IDS),), (IDS,)
    with pytest.raises(TypeError, match=r"^torch_to_flax: model is the Flax model, got the class FlaxNet: build it "
                                        r"first: FlaxNet\(\.\.\., rngs=nnx\.Rngs\(0\)\)$"):
        torch_to_flax(t.state_dict(), FlaxNet, rename=RENAME)
    with pytest.raises(TypeError, match=r"^flax_to_torch: model is the Flax model, got the torch module TorchNet: a "
                                        r"torch model's state dict is torch_model\.state_dict\(\)"):
        flax_to_torch(t, rename=RENAME)
    with pytest.raises(TypeError, match=r"^compare: torch_model is the torch model, got the Flax module FlaxNet: the "
                                        r"torch model comes first: compare\(torch_model, flax_model, "):
        parity.compare(f, t, *ids, rename=RENAME)
    with pytest.raises(TypeError, match=r"^compare_gradients: flax_model is the Flax model, got a str: an "
                                        r"nnx\.Module instance$"):
        parity.compare_gradients(t, "f", lambda m, x: m(x).sum(), lambda m, x: m(x).sum(), *ids)
    assert parity.compare(t, f, *ids, rename=RENAME).ok  # the same call the right way round


def test_compare_gradients_with_the_losses_after_the_inputs_says_their_order(pair):
    t, f = pair
    loss = lambda m, x: m(x).sum()  # noqa: E731
    with pytest.raises(TypeError, match=r"^compare_gradients: torch_loss is a function of the model and its inputs, "
                                        r"got a tuple: the losses come before the inputs, compare_gradients\(torch_model, "
                                        r"flax_model, torch_loss, flax_loss, torch_inputs, flax_inputs, \.\.\.\)$"):
        parity.compare_gradients(t, f, (torch.as_tensor(IDS),), (IDS,), loss, loss, rename=RENAME)


@pytest.mark.parametrize("torch_loss, got", [
    (lambda m, x: m(x).sum().item(), "a float"),
    (lambda m, x: m(x).sum(dim=-1), r"a tensor of shape \(2, 4\)"),
])
def test_a_torch_loss_that_is_not_a_one_element_tensor_is_refused_by_name(pair, torch_loss, got):
    t, f = pair
    with pytest.raises(TypeError, match=rf"^compare_gradients: torch_loss\(torch_model, \*torch_inputs\) returned "
                                        rf"{got}: it returns the loss as a one-element tensor"):
        parity.compare_gradients(t, f, torch_loss, lambda m, x: m(x).sum(), (torch.as_tensor(IDS),), (IDS,),
                                 rename=RENAME)
    assert all(p.grad is None for p in t.parameters())  # the caller's model as it was given


def test_compare_without_the_rename_map_says_to_give_it(pair):
    t, f = pair
    report = parity.compare(t, f, (torch.as_tensor(IDS),), (IDS,))
    assert not report.ok
    assert "a port whose module paths differ from torch's (blocks.* for layers.*) gives compare the rename map" \
        in report.format_table()


class TorchTiedHead(torch.nn.Module):
    """The head registered before the embedding it shares: named_parameters gives the pair under
    the head's name, which the port (holding the table once, as embed) does not have."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(D, V, bias=False)
        self.tok = torch.nn.Embedding(V, D)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        return self.head(self.tok(ids))


class FlaxTiedHead(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)

    def __call__(self, ids):
        return self.embed.attend(self.embed(ids))


def test_compare_gradients_of_a_tied_model_without_tied_says_to_give_it():
    torch.manual_seed(0)
    t = TorchTiedHead().eval()
    rename, tied = {"tok.weight": "embed.weight"}, {"head.weight": "tok.weight"}
    f = torch_to_flax(t.state_dict(), FlaxTiedHead(nnx.Rngs(0)), rename=rename, tied=tied)
    loss = lambda m, x: m(x).sum()  # noqa: E731
    ids = (torch.as_tensor(IDS),), (IDS,)
    said = parity.compare_gradients(t, f, loss, loss, *ids, rename=rename).format_table()
    assert "torch ties tok.weight to other parameters: give it the tied= it gives torch_to_flax" in said, said
    assert parity.compare_gradients(t, f, loss, loss, *ids, rename=rename, tied=tied).ok
