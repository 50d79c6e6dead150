"""The Flax twin computing in bfloat16 against the torch twin in float32, layer by layer.

Users train in bfloat16 on a GPU (``--dtype bfloat16``: parameters in float32, every layer
computing in bfloat16, softmax and LayerNorm statistics in float32). The float32 policy
(1e-5) cannot hold there: bfloat16 keeps 8 significant bits, so each rounding moves a value by
up to 2^-8 (0.39%) of itself. This check runs the seed Transformer's Flax twin built with
``dtype=bfloat16`` against the torch twin in float32, on the same weights and inputs, and holds
every intermediate to the bfloat16 policy (docs/design.md, "Parity policy"; parity/policy.py):

    max |Flax bfloat16 - torch float32| <= BFLOAT16_FACTOR * 2^-8 * sqrt(depth + 1) * max |torch float32|

``depth``: the number of blocks the row's value has gone through (the embeddings 0, encoder
layer i i + 1, the encoder's output L, decoder layer j L + j + 1, the projection and the
logits 2L + 1): each block's roundings add to those before it, and the measured differences
grow about as the square root of their number. Relative to the row's largest float32
magnitude, so LayerNorm outputs (values up to about 4) and logits (under 1 at initialisation)
are judged alike. A port's slip many times bfloat16's rounding still fails at its layer (a
LayerNorm epsilon of 1e-1 for 1e-5: tests/test_parity_bfloat16.py); one smaller than that is
the float32 check's to find.

``python -m parity.bfloat16 [--presets tiny seed] [--torch-device cuda] [--json OUT [--force]] [--all]``
prints each preset's rows (landmarks and any beyond tolerance; ``--all``: every row); exit 1
if a row is beyond its tolerance, 2 for unusable options. Call ``parity_numerics()`` first
(the command does): the torch twin must be exact float32, TF32 off. torch and JAX, and the
parity modules that load them, are imported inside the functions that build and run the
twins, so that importing this module (for the rule: ``depth_of``, ``tolerance``), the
command's ``--help`` and its checks of ``--batch``, ``--seed`` and ``--json`` start neither.

Shapes: as the seed Transformer's intermediates (B, S, D), (B, T, D), (B, T, V).
"""

import argparse
import dataclasses
import json
import math
import re
import sys

import numpy as np

import flaxformer_mini
from flaxformer_mini.files import check_writable, describe_os_error, refuse_existing, write_atomic
from parity.policy import BFLOAT16_FACTOR, BFLOAT16_STEP
from parity.report import Row, RowVerdicts

_ENCODER_LAYER = re.compile(r"^encoder\.transformer_layers\.(\d+)(?:\.|$)")
_DECODER_LAYER = re.compile(r"^decoder\.decoder_layers\.(\d+)(?:\.|$)")
_DECODER_INPUTS = ("decoder.embedding_layer", "decoder.positional_embedding", "decoder.dropout")


def depth_of(name, num_layers):
    """How many blocks a seed Transformer row's value has gone through (see the module)."""
    base = name.split("#")[0].split("[")[0]
    if m := _ENCODER_LAYER.match(base):
        return int(m.group(1)) + 1
    if m := _DECODER_LAYER.match(base):
        return num_layers + int(m.group(1)) + 1
    if base == "encoder":
        return num_layers
    if base.startswith("encoder.") or base in _DECODER_INPUTS:
        return 0
    return 2 * num_layers + 1  # decoder.fc, the decoder's output, the logits


def tolerance(scale, depth, factor=BFLOAT16_FACTOR):
    """The policy's bound for a row of largest float32 magnitude ``scale`` at ``depth``."""
    return factor * BFLOAT16_STEP * math.sqrt(depth + 1) * scale


@dataclasses.dataclass
class Bfloat16Row:
    name: str
    shape: tuple
    dtype: str  # the Flax twin's dtype for this row (bfloat16 where it computed in bfloat16)
    depth: int
    max_abs: float  # max |Flax bfloat16 - torch float32|
    scale: float  # max |torch float32|
    tolerance: float
    ok: bool
    note: str = ""

    @property
    def share(self):
        """max_abs as a fraction of the tolerance (> 1: beyond it)."""
        return self.max_abs / self.tolerance if self.tolerance > 0 else (0.0 if self.max_abs == 0 else math.inf)


@dataclasses.dataclass
class Bfloat16Report(RowVerdicts):
    preset: str
    rows: list
    factor: float
    devices: str = ""  # where each twin ran

    @property
    def largest(self):
        """The row nearest its tolerance (or furthest beyond it)."""
        return max(self.rows, key=lambda r: r.share, default=None)

    def format_table(self, show_all=False):
        def landmark(r):
            return Row(r.name, r.shape, r.max_abs, 0.0, r.ok).landmark

        shown = [r for r in self.rows if show_all or not r.ok or landmark(r) or r is self.largest]
        width = max([len(r.name or "logits") for r in shown] + [12])
        where = f"; {self.devices}" if self.devices else ""
        lines = [f"{self.preset}: Flax twin in bfloat16 against torch in float32{where}",
                 f"tolerance = {self.factor:g} x 2^-8 x sqrt(depth + 1) x max |torch|",
                 f"{'intermediate':<{width}} {'depth':>5} {'dtype':<9} {'max abs diff':>12} {'max |torch|':>11} "
                 f"{'tolerance':>10} {'of tol.':>7}  ok"]
        for r in shown:
            status = "yes" if r.ok else "NO" + (f"  {r.note}" if r.note else "")
            lines.append(f"{r.name or 'logits':<{width}} {r.depth:>5} {r.dtype:<9} {r.max_abs:>12.3e} "
                         f"{r.scale:>11.3e} {r.tolerance:>10.3e} {r.share:>7.2f}  {status}")
        if len(shown) < len(self.rows):
            lines.append(f"({len(self.rows) - len(shown)} more rows compared; --all shows them)")
        first, largest = self.first_divergence, self.largest
        if first is None:
            lines.append(f"all {len(self.rows)} rows within tolerance; nearest: {largest.name or 'logits'} at "
                         f"{largest.share:.2f} of its tolerance")
        else:
            why = first.note or f"{first.share:.2f} x its tolerance"
            lines.append(f"first divergence: {first.name or 'logits'} ({why})")
        return "\n".join(lines)

    def to_dict(self):
        largest = self.largest
        return {"preset": self.preset, "devices": self.devices, "factor": self.factor, "step": BFLOAT16_STEP,
                "rule": "max |Flax bfloat16 - torch float32| <= factor * step * sqrt(depth + 1) * max |torch float32|",
                "ok": self.ok, "first_divergence": self.first_divergence.name if self.first_divergence else None,
                "largest_share_of_tolerance": largest.share if largest and math.isfinite(largest.share) else None,
                "rows": [_finite({**dataclasses.asdict(r), "shape": list(r.shape), "share": r.share})
                         for r in self.rows]}


def _finite(row):
    """A row as strict JSON: a difference that is not a finite number (a missing row's) is None,
    and its note says why."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def bfloat16_twin(torch_model, config, seed=0):
    """The Flax twin of ``torch_model`` (a ``torch_ref.Transformer`` of ``config``) computing in
    bfloat16, its parameters float32 as a bfloat16 training run holds them, in eval mode."""
    import jax.numpy as jnp

    from parity.twins import flax_twin

    return flax_twin(torch_model.state_dict(), config, seed, dtype=jnp.bfloat16)


def check_bfloat16(torch_model, flax_model, config, *, batch=4, seed=0, factor=BFLOAT16_FACTOR, preset=""):
    """Every intermediate of ``flax_model`` (computing in bfloat16: ``bfloat16_twin``) against
    ``torch_model`` (float32, eval mode) on ``sample_batch(config, batch, seed)``, each row
    held to its tolerance (the module's rule)."""
    from parity.compare import model_intermediates
    from parity.twins import as_inputs, sample_batch

    source, target = sample_batch(config, batch=batch, seed=seed)
    torch_inputs, flax_inputs = as_inputs(source, target)
    t, f = model_intermediates(torch_model, flax_model, torch_inputs, flax_inputs)
    rows = []
    for name in [*t, *(k for k in f if k not in t)]:
        depth = depth_of(name, config.num_layers)
        if name not in t or name not in f:
            side = "torch" if name in t else "Flax"
            rows.append(Bfloat16Row(name, tuple((t.get(name) if name in t else f[name]).shape), "-", depth,
                                    math.inf, 0.0, 0.0, False, f"only the {side} side has it"))
            continue
        ours, ref = np.asarray(f[name], np.float64), np.asarray(t[name], np.float64)
        if ours.shape != ref.shape:
            rows.append(Bfloat16Row(name, ref.shape, str(f[name].dtype), depth, math.inf, 0.0, 0.0, False,
                                    f"shape differs: Flax {ours.shape}"))
            continue
        diff = float(np.abs(ours - ref).max(initial=0.0))
        scale = float(np.abs(ref).max(initial=0.0))
        bound = tolerance(scale, depth, factor)
        finite = math.isfinite(diff)
        rows.append(Bfloat16Row(name, ref.shape, str(f[name].dtype), depth, diff, scale, bound,
                                finite and diff <= bound, "" if finite else "not a finite number"))
    return Bfloat16Report(preset, rows, factor)


def _devices(torch_model):
    import jax

    held = next(torch_model.parameters())
    device = jax.devices()[0]
    return f"torch on {held.device}, JAX on {device.platform} ({device.device_kind})"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m parity.bfloat16", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "seed"], choices=sorted(flaxformer_mini.PRESETS),
                        help="model presets to check (default: tiny seed)")
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default 0)")
    parser.add_argument("--batch", type=int, default=4, help="sequences in the batch (default 4)")
    parser.add_argument("--torch-device", default="cpu", help="where the torch twin runs: cpu (default) or cuda")
    parser.add_argument("--json", metavar="OUT", help="also write every row as JSON")
    parser.add_argument("--all", action="store_true", help="print every row, not only the landmarks")
    parser.add_argument("--force", action="store_true", help="replace an existing --json file")
    args = parser.parse_args(argv)
    if not 1 <= args.batch <= 1024:
        parser.error(f"--batch must be in [1, 1024], got {args.batch}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.force and not args.json:  # without --json it replaces nothing: most likely --json was forgotten
        parser.error("--force goes with --json: it replaces an existing --json file, and none was given")
    if args.json:
        try:
            check_writable(args.json, "--json")  # before the work, not after it
            if not args.force:
                refuse_existing(args.json, "--json")
        except ValueError as e:
            parser.error(str(e))
    import torch

    from parity.twins import parity_numerics, torch_device, transformer_pair

    try:
        device = torch_device(args.torch_device)
    except ValueError as e:
        parser.error(f"--torch-device: {e}")
    parity_numerics()
    reports = []
    with torch.device(device):
        for name in args.presets:
            config = flaxformer_mini.get_preset(name)
            torch_model, _ = transformer_pair(config, args.seed)
            report = check_bfloat16(torch_model, bfloat16_twin(torch_model, config, args.seed), config,
                                    batch=args.batch, seed=args.seed, preset=name)
            report.devices = _devices(torch_model)
            print(report.format_table(show_all=args.all) + "\n")
            reports.append(report)
    if args.json:
        text = json.dumps({"reports": [r.to_dict() for r in reports]}, indent=1, allow_nan=False)
        try:
            write_atomic(args.json, text + "\n", replace=args.force)
        except FileExistsError as e:  # made during the work, without --force: kept
            print(f"{parser.prog}: error: {describe_os_error(e)}", file=sys.stderr)
            return 2
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
