"""``parity.compare`` on a porter's own models: NNX classes that inherit ``__call__``, models
with ``nnx.RNN`` or a scanned layer stack inside, dropout left on, inputs in the other layout.

Weights are copied by hand (a kernel is a Linear weight transposed), so these tests check the
comparison alone, whatever the converter's rules.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import parity

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

D, HID, OUT, N, L = 4, 5, 3, 2, 6  # every size distinct, so a wrong axis cannot pass


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _copy_linear(flax_linear, torch_linear):
    flax_linear.kernel.set_value(jnp.asarray(torch_linear.weight.detach().cpu().numpy().T))
    flax_linear.bias.set_value(jnp.asarray(torch_linear.bias.detach().cpu().numpy()))


# ------------------------------------------------------------------ a __call__ from a base class


class _TorchDoubled(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(D, D), torch.nn.Linear(D, D), _TorchDoubled(D, OUT)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


class _Inherited(nnx.Linear):  # nnx.Linear's __call__, inherited
    pass


class _Doubled(nnx.Linear):  # its own __call__, which calls nnx.Linear's
    def __call__(self, x):
        return super().__call__(x) * 2


class _FlaxNet(nnx.Module):
    def __init__(self, rngs):
        self.a, self.b, self.c = _Inherited(D, D, rngs=rngs), nnx.Linear(D, D, rngs=rngs), _Doubled(D, OUT, rngs=rngs)

    def __call__(self, x):
        return self.c(self.b(self.a(x)))


class _FlaxNetSubclass(_FlaxNet):  # the whole model's __call__, inherited
    pass


@pytest.mark.parametrize("port", [_FlaxNet, _FlaxNetSubclass])
def test_every_module_is_recorded_once_whether_its_call_is_inherited_or_calls_super(port):
    # Were nnx.capture to wrap only the __call__ a class defines itself, the subclass model would
    # lose its whole-model row ("output ... missing on the Flax side"; _Inherited's "a" would be
    # recorded only because an nnx.Linear in the tree got nnx.Linear's wrapped), and _Doubled,
    # wrapped and then through super() in nnx.Linear's wrapper, would be recorded twice (c#0, c#1).
    torch.manual_seed(0)
    t = _TorchNet().eval()
    f = port(nnx.Rngs(0))
    for name in "abc":
        _copy_linear(getattr(f, name), getattr(t, name))
    x = _rand(N, D)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.ok, report.format_table(show_all=True)
    assert [(r.name, r.shape) for r in report.rows] == [("a", (N, D)), ("b", (N, D)), ("c", (N, OUT)), ("", (N, OUT))]
    assert report.rows[-1].label == "output" and report.rows[-1].max_abs <= 1e-6
    assert type(f).__call__ is _FlaxNet.__call__ and "__call__" not in vars(_Inherited)  # classes as they were


# ------------------------------------------------------------------------------ nnx.RNN (a scan)


class _TorchLSTMNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.lstm = torch.nn.LSTM(D, HID, batch_first=True)
        self.head = torch.nn.Linear(HID, OUT)

    def forward(self, x):  # (N, L, D)
        out, _ = self.lstm(self.proj(x))
        return self.head(out[:, -1])


class _FlaxLSTMNet(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, D, rngs=rngs)
        self.lstm = nnx.RNN(nnx.LSTMCell(D, HID, rngs=rngs))  # nnx.scan over the cell
        self.head = nnx.Linear(HID, OUT, rngs=rngs)

    def __call__(self, x):
        return self.head(self.lstm(self.proj(x))[:, -1])


def _lstm_pair():
    torch.manual_seed(0)
    t = _TorchLSTMNet().eval()
    f = _FlaxLSTMNet(nnx.Rngs(0))
    _copy_linear(f.proj, t.proj)
    _copy_linear(f.head, t.head)
    # torch stacks the gates i, f, g, o; nnx.LSTMCell has a Linear per gate, biased on h only.
    w_ih, w_hh = (t.lstm.weight_ih_l0.detach().cpu().numpy(), t.lstm.weight_hh_l0.detach().cpu().numpy())
    bias = (t.lstm.bias_ih_l0 + t.lstm.bias_hh_l0).detach().cpu().numpy()
    cell = f.lstm.cell
    for k, gate in enumerate("ifgo"):
        rows = slice(k * HID, (k + 1) * HID)
        getattr(cell, f"i{gate}" if gate != "f" else "if_").kernel.set_value(jnp.asarray(w_ih[rows].T))
        getattr(cell, f"h{gate}").kernel.set_value(jnp.asarray(w_hh[rows].T))
        getattr(cell, f"h{gate}").bias.set_value(jnp.asarray(bias[rows]))
    return t, f


def test_a_model_with_nnx_rnn_compares_the_layers_around_the_scan_and_says_what_ran_inside_it():
    # nnx.capture recording inside nnx.RNN's scan would fail with JAX's "scan body function carry
    # input and carry output must have the same pytree structure ... ['__captures__']".
    t, f = _lstm_pair()
    x = _rand(N, L, D)
    inputs = ((torch.as_tensor(x),), (x,))
    # ignore_missing: torch's LSTM also returns (h, c), which nnx.RNN does not.
    report = parity.compare(t, f, *inputs, atol=1e-5, ignore_missing=True)
    assert report.ok, report.format_table(show_all=True)
    assert [(r.name, r.shape) for r in report.rows] == [
        ("proj", (N, L, D)), ("lstm[0]", (N, L, HID)), ("head", (N, OUT)), ("", (N, OUT))]
    assert ("lstm[1][0]", "only torch has them, by ignore_missing") in report.left_out
    (why,) = [why for name, why in report.left_out if name == "lstm.cell"]
    assert why.startswith("run under a JAX transform") and "Python loop" in why
    assert "(1 left out, run under a JAX transform" in report.format_table()
    # The rows are real comparisons: a fault in the cell shows at the RNN's output, not before.
    kernel = f.lstm.cell.hg.kernel
    kernel.set_value(kernel.get_value() * 1.01)
    assert parity.compare(t, f, *inputs, atol=1e-5, ignore_missing=True).first_divergence.name == "lstm[0]"


class _TorchStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(D, D) for _ in range(2)])
        self.head = torch.nn.Linear(D, OUT)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


class _FlaxScannedStack(nnx.Module):
    def __init__(self, rngs):
        @nnx.split_rngs(splits=2)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return nnx.Linear(D, D, rngs=rngs)

        self.layers = make(rngs)  # one Linear, its kernel (2, D, D)
        self.head = nnx.Linear(D, OUT, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def step(x, layer):
            return jnp.tanh(layer(x))

        return self.head(step(x, self.layers))


def test_torch_rows_inside_a_scanned_layer_stack_are_left_out_saying_why_not_failed_as_missing():
    torch.manual_seed(0)
    t = _TorchStack().eval()
    f = _FlaxScannedStack(nnx.Rngs(0))
    f.layers.kernel.set_value(jnp.stack([jnp.asarray(m.weight.detach().cpu().numpy().T) for m in t.layers]))
    f.layers.bias.set_value(jnp.stack([jnp.asarray(m.bias.detach().cpu().numpy()) for m in t.layers]))
    _copy_linear(f.head, t.head)
    x = _rand(N, D)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)  # no ignore_missing
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == ["head", ""] and report.rows[-1].max_abs <= 1e-6
    names = [name for name, _ in report.left_out]
    assert names == ["layers.0", "layers.1", "layers"]
    assert report.left_out[0][1].startswith("at or inside layers, which the Flax model runs under a JAX transform")


# ------------------------------------------------------------------------------------- dropout


class _TorchDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, OUT)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


class _FlaxDropout(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(D, OUT, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.lin(x))


def _dropout_pair():
    torch.manual_seed(0)
    t, f = _TorchDropout().eval(), _FlaxDropout(nnx.Rngs(0))
    f.eval()
    _copy_linear(f.lin, t.lin)
    return t, f


def _compare_recording_warnings(t, f, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    return report, [str(w.message) for w in caught if str(w.message).startswith("parity: ")]


def test_active_dropout_on_either_side_is_said_in_the_report_and_warned_and_eval_mode_is_quiet():
    t, f = _dropout_pair()
    x = _rand(8, D)  # 24 outputs: p=0.5 drops some on either side
    report, warned = _compare_recording_warnings(t, f, x)
    assert report.ok and report.notes == [] and warned == [] and "note:" not in report.format_table()

    t.train()  # torch draws masks; the first divergence is the dropout, not a porting error
    report, warned = _compare_recording_warnings(t, f, x)
    assert report.first_divergence.name == "drop"
    (note,) = report.notes
    assert note.startswith("the torch model is in training mode, with dropout active in drop: each side draws its "
                           "own random masks") and "torch_model.eval(), flax_model.eval()" in note
    assert warned == [f"parity: {note}"]
    assert f"note: {note}\nfirst divergence: drop" in report.format_table()
    assert report.to_dict()["notes"] == [note]

    t.eval()
    f.train()
    report, warned = _compare_recording_warnings(t, f, x)
    assert report.first_divergence.name == "drop"
    (note,) = report.notes
    assert note.startswith("nnx.Dropout is active (deterministic=False) in the Flax model at drop: each side draws "
                           "its own random masks")
    assert warned == [f"parity: {note}"]


def test_a_torch_model_in_training_mode_without_dropout_modules_is_noted_not_warned():
    # It may call F.dropout itself, or mean a train-mode comparison (BatchNorm on batch statistics).
    t, f = _dropout_pair()
    t.drop = torch.nn.Identity()
    t.train()
    report, warned = _compare_recording_warnings(t, f, _rand(8, D))
    (note,) = report.notes
    assert note.startswith("the torch model is in training mode (model.train(), a torch module's default): if it "
                           "calls dropout as a function")
    assert warned == [] and f"note: {note}" in report.format_table()


def test_compare_gradients_says_active_dropout_too():
    t, f = _dropout_pair()
    t.train()
    x = _rand(8, D)
    with pytest.warns(UserWarning, match="dropout active in drop"):
        report = parity.compare_gradients(t, f, lambda m, x: m(x).sum(), lambda m, x: m(x).sum(),
                                          (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.notes and report.notes[0].startswith("the torch model is in training mode, with dropout active")


# ------------------------------------------------------------------------- inputs in the other layout


@pytest.mark.parametrize("who", ["compare", "compare_gradients"])
def test_inputs_differing_by_the_channel_axis_suggest_channels_last(who):
    t, f = _TorchDropout().eval(), _FlaxDropout(nnx.Rngs(0))
    x = _rand(N, D, L)  # torch's (N, C, L); the Flax model given (N, L, C) as a channels-last port takes it
    loss = lambda m, x: m(x).sum()  # noqa: E731 - never runs: the inputs are refused first
    args = (loss, loss) if who == "compare_gradients" else ()
    with pytest.raises(ValueError) as info:
        getattr(parity, who)(t, f, *args, (torch.as_tensor(x),), (x.transpose(0, 2, 1),))
    message = str(info.value)
    assert message.startswith(f"{who}: the two sides get different inputs: input 0: torch shape (2, 4, 6), "
                              "Flax shape (2, 6, 4) (torch's with its channel axis 1 moved last: pass "
                              "channels_last=True if the Flax model is channels-last")
    assert ("channels_last=[module-path prefixes]" in message) == (who == "compare")
    # Shapes that differ otherwise get no such hint.
    with pytest.raises(ValueError, match=re.escape("Flax shape (2, 6, 5)")) as info:
        getattr(parity, who)(t, f, *args, (torch.as_tensor(x),), (_rand(N, L, 5),))
    assert "channels_last" not in str(info.value)


@pytest.mark.parametrize("who", ["compare", "compare_gradients"])
def test_one_array_for_the_inputs_is_refused_saying_to_pass_a_tuple(who):
    # Iterated, an array is its first axis's rows: "1 torch inputs but 2 Flax inputs" once.
    t, f = _TorchDropout().eval(), _FlaxDropout(nnx.Rngs(0))
    x = _rand(N, L, D)
    loss = lambda m, x: m(x).sum()  # noqa: E731 - never runs: the inputs are refused first
    args = (loss, loss) if who == "compare_gradients" else ()
    with pytest.raises(TypeError, match=re.escape(f"{who}: flax_inputs is a tuple of the model's positional inputs, "
                                                  f"got one array of shape (2, 6, 4): pass (x,)")):
        getattr(parity, who)(t, f, *args, (torch.as_tensor(x),), x)
    with pytest.raises(TypeError, match=re.escape(f"{who}: torch_inputs is a tuple")):
        getattr(parity, who)(t, f, *args, torch.as_tensor(x), (x,))


# ------------------------------------------------------------- an embedding's padding row, tied


V, PAD_ID = 7, 0


class _TorchPadded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(V, D, padding_idx=PAD_ID)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight  # tied: one Parameter, two state-dict keys

    def forward(self, ids):
        return self.head(self.tok(ids))


class _FlaxPadded(nnx.Module):
    def __init__(self, rngs, stop_pad=False):
        self.tok, self.stop_pad = nnx.Embed(V, D, rngs=rngs), stop_pad

    def __call__(self, ids):
        x = self.tok(ids)
        if self.stop_pad:  # as torch's padding_idx: no gradient reaches the pad row
            x = jnp.where((ids == PAD_ID)[..., None], jax.lax.stop_gradient(x), x)
        return self.tok.attend(x)


def test_an_embedding_gradient_differing_in_its_padding_row_alone_is_said_and_the_fix_passes():
    torch.manual_seed(0)
    t = _TorchPadded().eval()
    ids = np.array([[1, 4, PAD_ID, 6], [PAD_ID, 2, 3, 5]])
    # Not (logits ** 2): the pad row starts at zero (padding_idx), so its logits and their
    # gradient would be zero at the pad positions, and no gradient would reach the lookups.
    loss = lambda m, ids: ((m(ids) - 0.5) ** 2).mean()  # noqa: E731
    tied = {"head.weight": "tok.weight"}
    for stop_pad in (False, True):
        f = parity.torch_to_flax(t.state_dict(), _FlaxPadded(nnx.Rngs(0), stop_pad), tied=tied)
        report = parity.compare_gradients(t, f, loss, loss, (torch.as_tensor(ids),), (jnp.asarray(ids),), tied=tied)
        assert [r.name for r in report.rows] == ["loss", "grad:tok.weight"]
        assert report.ok == stop_pad, report.format_table()
        if stop_pad:
            assert report.notes == []
        else:
            assert report.first_divergence.name == "grad:tok.weight" and report.first_divergence.at[0] == PAD_ID
            assert report.notes == [
                "grad:tok.weight differs only in row 0, the padding row of torch's nn.Embedding(padding_idx=0), "
                "which torch gives no gradient and nnx.Embed does: a port that must train as torch does stops it "
                "after the lookup, x = jnp.where((ids == 0)[..., None], jax.lax.stop_gradient(x), x)"]


# --------------------------------------------------------------------- torch's parametrizations


class _TorchWeightNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(D, OUT))

    def forward(self, x):
        return torch.tanh(self.proj(x))


class _FlaxPlain(nnx.Module):  # the weight g * v / ||v|| as one kernel: the same activations
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, OUT, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.proj(x))


def test_a_weight_normed_layers_parametrization_modules_are_weights_not_rows():
    # Read as an activation, the output of torch's _WeightNorm module (the weight itself) would be
    # the first divergence: "proj.parametrizations.weight.0 (missing on the Flax side)".
    torch.manual_seed(0)
    t, f = _TorchWeightNormed().eval(), _FlaxPlain(nnx.Rngs(0))
    assert any(".parametrizations." in name for name, _ in t.named_modules())
    f.proj.kernel.set_value(jnp.asarray(t.proj.weight.detach().cpu().numpy().T))  # weight_norm's computed weight
    f.proj.bias.set_value(jnp.asarray(t.proj.bias.detach().cpu().numpy()))
    x = _rand(N, D)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == ["proj", ""] and report.left_out == []


# --------------------------------------------------------------- channels_last=True on a sequence


class _TorchPatches(torch.nn.Module):  # a ViT's stem: a strided conv to patches, then (N, P, C) rows
    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv1d(D, HID, 2, stride=2)
        self.norm = torch.nn.LayerNorm(HID)

    def forward(self, x):  # (N, D, L)
        return self.norm(self.patch(x).transpose(1, 2))


class _FlaxPatches(nnx.Module):
    def __init__(self, rngs):
        self.patch = nnx.Conv(D, HID, (2,), strides=2, padding="VALID", rngs=rngs)
        self.norm = nnx.LayerNorm(HID, epsilon=1e-5, rngs=rngs)

    def __call__(self, x):  # (N, L, D)
        return self.norm(self.patch(x))


def test_a_row_in_torchs_own_layout_moved_by_channels_last_true_says_so_and_the_list_form_compares_it():
    torch.manual_seed(0)
    t, f = _TorchPatches().eval(), _FlaxPatches(nnx.Rngs(0))
    parity.torch_to_flax({"patch." + k: v for k, v in t.patch.state_dict().items()} |
                         {"norm." + k: v for k, v in t.norm.state_dict().items()}, f)
    x = _rand(N, D, L)
    inputs = ((torch.as_tensor(x),), (x.transpose(0, 2, 1),))
    report = parity.compare(t, f, *inputs, atol=1e-5, channels_last=True)
    norm = {r.name: r for r in report.rows}["norm"]
    assert not norm.ok and norm.shape == (N, L // 2, HID)
    assert norm.note == (f"shape differs only as channels_last moved it: the port's own is torch's {(N, L // 2, HID)}; "
                         "channels_last=[module-path prefixes] moves the channels-last layers' rows alone")
    report = parity.compare(t, f, *inputs, atol=1e-5, channels_last=["patch"])
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == ["patch", "norm", ""]


# ------------------------------------------------------------------ a wrapped torch model


@pytest.mark.parametrize("wrap, attribute", [(torch.nn.DataParallel, "module"), (torch.compile, "_orig_mod")],
                         ids=["DataParallel", "torch.compile"])
def test_a_torch_model_in_a_wrapper_is_refused_naming_the_attribute_that_holds_the_model(wrap, attribute):
    # Every torch row of a wrapped model carries the wrapper's prefix ('module.fc'): unrefused, the
    # table would fail every row as missing on both sides, without naming the wrapper.
    torch.manual_seed(0)
    t = torch.nn.Sequential()
    t.fc = torch.nn.Linear(D, OUT)
    t.eval()

    class Port(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(D, OUT, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.fc(x)

    f = Port()
    _copy_linear(f.fc, t.fc)
    x = _rand(N, D)
    inputs = ((torch.as_tensor(x),), (x,))
    with pytest.raises(TypeError, match=rf"compare: the torch model is a .*wrapper, whose paths all start with "
                                        rf"'{attribute}\.': pass torch_model\.{attribute}, the model it wraps"):
        parity.compare(wrap(t), f, *inputs)
    report = parity.compare(getattr(wrap(t), attribute), f, *inputs)
    assert report.ok and [r.name for r in report.rows] == ["fc", ""]
    # compare_gradients reads the same parameter names, so it refuses the wrapper the same way.
    with pytest.raises(TypeError, match=rf"compare_gradients: the torch model is a .*wrapper, whose paths all start "
                                        rf"with '{attribute}\.': pass torch_model\.{attribute}"):
        parity.compare_gradients(wrap(t), f, lambda m, x: m(x).sum(), lambda m, x: m(x).sum(), *inputs)


# ------------------------------------------------------------------- an in-place op after a row


class _TorchNormRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.act = torch.nn.Linear(D, HID), torch.nn.LayerNorm(HID), torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.norm(self.proj(x)))


class _Relu(nnx.Module):
    def __call__(self, x):
        return jax.nn.relu(x)


class _FlaxNormRelu(nnx.Module):
    def __init__(self, rngs):
        self.proj, self.norm, self.act = nnx.Linear(D, HID, rngs=rngs), nnx.LayerNorm(HID, epsilon=1e-5, rngs=rngs), _Relu()

    def __call__(self, x):
        return self.act(self.norm(self.proj(x)))


def test_a_row_overwritten_by_a_later_in_place_op_is_compared_as_it_was_computed():
    # ReLU(inplace=True) writes into the LayerNorm's output tensor: a row kept by reference would
    # read the ReLU's output as the norm's and fail a correct port at "norm".
    torch.manual_seed(0)
    t, f = _TorchNormRelu().eval(), _FlaxNormRelu(nnx.Rngs(0))
    _copy_linear(f.proj, t.proj)
    x = _rand(N, D)
    report = parity.compare(t, f, (torch.as_tensor(x),), (x,), atol=1e-5)
    assert report.ok, report.format_table(show_all=True)
    assert [r.name for r in report.rows] == ["proj", "norm", "act", ""]
    _, rows = parity.torch_intermediates(t, torch.as_tensor(x))
    assert (rows["norm"] < 0).any() and (rows["act"] >= 0).all()  # the norm's own negatives kept


# ------------------------------------------------------------------------------- a 0-d parameter


class _TorchScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.scale = torch.nn.Linear(D, OUT), torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.proj(x) * self.scale


class _FlaxScaled(nnx.Module):
    def __init__(self, rngs):
        self.proj, self.scale = nnx.Linear(D, OUT, rngs=rngs), nnx.Param(jnp.asarray(0.0))

    def __call__(self, x):
        return self.proj(x) * self.scale[...]


_SCALED_RULES = dict(parity.RULES)
parity.register_rule(_FlaxScaled, parity.Rule("scale", "scale"), table=_SCALED_RULES)


def test_a_scalar_parameter_converts_both_ways_and_its_gradient_compares():
    # np.ascontiguousarray makes a 0-d array 1-d: the scalar would come back as shape (1,), which
    # torch's load_state_dict refuses and the gradient comparison fails as a shape mismatch.
    torch.manual_seed(0)
    t = _TorchScaled().eval()
    f = parity.torch_to_flax(t.state_dict(), _FlaxScaled(nnx.Rngs(0)), rules=_SCALED_RULES)
    back = parity.flax_to_torch(f, rules=_SCALED_RULES)
    assert back["scale"].shape == () and float(back["scale"]) == 1.5
    t.load_state_dict(back)
    x = _rand(N, D)
    report = parity.compare_gradients(t, f, lambda m, x: m(x).sum(), lambda m, x: m(x).sum(),
                                      (torch.as_tensor(x),), (x,), atol=1e-5, rules=_SCALED_RULES)
    assert report.ok, report.format_table(show_all=True)
    assert {r.name: r.shape for r in report.rows}["grad:scale"] == ()
