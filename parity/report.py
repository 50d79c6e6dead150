"""A parity report: one row per compared tensor (an intermediate, the loss, a gradient), its
largest absolute and relative difference, and the first row beyond the tolerance.

``parity.compare`` and ``parity.gradients`` fill it; ``parity check`` prints it, writes it as
strict JSON and plots it.
"""

import dataclasses
import json
import math
import re

import numpy as np

from parity.policy import FLOAT64_ULPS

# Rows beyond the forward pass (``parity.gradients``): the loss, then one per parameter.
GRAD_PREFIX = "grad:"
LOSS_ROW = "loss"
# Friendlier names for the seed Transformer's landmarks (``compare_models`` and ``parity
# check`` give them to its rows as ``Row.alias``); every other row keeps its path, and a whole
# model's output ("", or "[i]" for a tuple's items) reads "output".
ALIASES = {
    "": "logits",
    "encoder.dropout": "encoder.embeddings",
    "decoder.dropout": "decoder.embeddings",
}
# Rows shown by default: embeddings, each block, encoder and decoder outputs, logits.
_LANDMARK = re.compile(r"^(encoder|decoder|(encoder|decoder)\.dropout|encoder\.transformer_layers\.\d+|"
                       r"decoder\.decoder_layers\.\d+|decoder\.fc|)$")


@dataclasses.dataclass
class Row:
    name: str  # module path, e.g. "encoder.transformer_layers.3.norm1" ("" is the whole model)
    shape: tuple
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""  # why a row could not be compared
    at: tuple | None = None  # index of the largest difference (the first non-finite one, if any)
    alias: str = ""  # shown instead of the module path (ALIASES)
    # With a float64 reference (parity/float64_reference.py): each float32 twin's largest
    # absolute error against the torch twin run in float64, and their root mean square; None
    # without one.
    torch_f64: float | None = None
    flax_f64: float | None = None
    torch_f64_rms: float | None = None
    flax_f64_rms: float | None = None

    @property
    def label(self):
        base, hash_, suffix = self.name.partition("#")
        if self.alias:
            base = self.alias
        elif base == "" or base.startswith("["):
            base = "output" + base  # the whole model's output, or one item of its tuple or dict
        return base + hash_ + suffix

    @property
    def landmark(self):
        return self.name == LOSS_ROW or bool(_LANDMARK.match(self.name.split("#")[0].split("[")[0]))

    @property
    def kind(self):
        """'intermediate' (a submodule's output), 'loss' or 'gradient'."""
        if self.name == LOSS_ROW:
            return "loss"
        return "gradient" if self.name.startswith(GRAD_PREFIX) else "intermediate"


class RowVerdicts:
    """The verdicts of a report whose ``rows`` each say whether they are within tolerance (``ok``)."""

    @property
    def ok(self):
        return all(r.ok for r in self.rows)

    @property
    def first_divergence(self):
        return next((r for r in self.rows if not r.ok), None)


@dataclasses.dataclass
class Report(RowVerdicts):
    rows: list
    atol: float
    # (name, why) of each tensor one side has and the comparison leaves out on purpose: torch
    # modules the port calls as functions (``ignore_missing``), the sublayers of a layer torch
    # computes in one call (``nn.MultiheadAttention``), parameters frozen in torch. Said, never dropped silently.
    left_out: list = dataclasses.field(default_factory=list)
    # Set by parity/float64_reference.py: a row beyond ``atol`` agrees when Flax's errors against
    # float64 have at most ``float64_factor`` times torch's root mean square and at most
    # ``float64_largest_factor`` times torch's largest. None: ``atol`` alone judges.
    float64_factor: float | None = None
    float64_largest_factor: float | None = None
    # What the reader must know to trust the rows, said above the verdict: dropout drawing
    # masks on either side (``parity.compare``), which no port can reproduce.
    notes: list = dataclasses.field(default_factory=list)
    # Both twins ran in float64 (``check_twins(..., float64=True)``), not float32.
    float64: bool = False

    @property
    def max_abs(self):
        return max((r.max_abs for r in self.rows if r.note == ""), default=0.0)

    def format_table(self, show_all=False, all_hint="show_all=True"):
        """The report as a table: landmark rows and every row beyond tolerance (``show_all``:
        every row), then what was left out and the verdict. ``all_hint`` is what the
        summary lines say shows every row (``parity check`` says ``--all``)."""
        f64 = self.float64_factor is not None
        # With a float64 reference, rows beyond atol that it let pass are shown too.
        shown = [r for r in self.rows if show_all or r.landmark or not r.ok or (f64 and r.max_abs > self.atol)]
        width = max([len(r.label) for r in shown] + [12])
        extra = f"  {'torch vs f64':>12}  {'Flax vs f64':>12}  {'RMS ratio':>9}" if f64 else ""
        verdict = f"within {self.atol:g}" + (" or as exact as torch" if f64 else "")
        lines = [f"{'intermediate':<{width}}  {'shape':<16} {'max abs diff':>12}  {'max rel diff':>12}{extra}  {verdict}"]
        for r in shown:
            status = "yes" if r.ok else "NO  " + (r.note or _where(r)).strip()
            if r.ok and f64 and r.max_abs > self.atol:
                status = "yes (float64)"
            errors = (f"  {_number(r.torch_f64):>12}  {_number(r.flax_f64):>12}  {_rms_ratio(r):>9}" if f64 else "")
            lines.append(f"{r.label:<{width}}  {str(r.shape):<16} {r.max_abs:>12.3e}  {r.max_rel:>12.3e}{errors}"
                         f"  {status}".rstrip())
        shown_ids = {id(r) for r in shown}
        hidden = [r for r in self.rows if id(r) not in shown_ids]
        hidden_outputs = sum(r.kind == "intermediate" for r in hidden)
        hidden_grads = [r for r in hidden if r.kind == "gradient"]
        if hidden_outputs:
            lines.append(f"({hidden_outputs} more submodule outputs compared, all within tolerance; {all_hint} shows them)")
        grads = [r for r in self.rows if r.kind == "gradient"]
        if hidden_grads:
            # Of the hidden rows only (all within tolerance): a shown failure is not theirs to name.
            largest = max(hidden_grads, key=lambda r: r.max_abs)
            more = " more" if len(hidden_grads) < len(grads) else ""
            lines.append(f"({len(hidden_grads)}{more} parameter gradients compared, all within tolerance, largest "
                         f"difference {largest.max_abs:.3e} in {largest.label}; {all_hint} shows them)")
        lines += _left_out_lines(self.left_out)
        lines += [f"note: {note}" for note in self.notes]
        first = self.first_divergence
        if first is None:
            n = sum(r.kind == "intermediate" for r in self.rows)
            counted = ", ".join(([f"{n} intermediates"] if n or not grads else [])
                                + ([f"the loss and {len(grads)} gradients"] if grads else []))
            by_f64 = sum(r.max_abs > self.atol for r in self.rows) if f64 else 0
            lines.append(f"all {counted} within {self.atol:g} (largest difference {self.max_abs:.3e})" if not by_f64
                         else f"all {counted} agree: {by_f64} beyond {self.atol:g} (largest difference "
                              f"{self.max_abs:.3e}) are as exact as torch against the torch twin in float64 "
                              f"({self._float64_bounds()}), the rest within {self.atol:g}")
        elif first.note:  # missing on one side, shapes differ, NaN: the note says it, no number does
            lines.append(f"first divergence: {first.label} ({first.note})")
        else:
            against = "" if not f64 or first.flax_f64 is None else self._float64_failure(first)
            lines.append(f"first divergence: {first.label} (max abs diff {first.max_abs:.3e} > {self.atol:g}"
                         f"{_where(first)}{against})")
        return "\n".join(lines)

    def _float64_bounds(self):
        return (f"Flax's RMS error at most {self.float64_factor:g}x torch's, its largest at most "
                f"{self.float64_largest_factor:g}x torch's, or every one of its elements within "
                f"{FLOAT64_ULPS:g} float32 rounding step{'s' if FLOAT64_ULPS != 1 else ''} of float64's")

    def _float64_failure(self, row):
        """'; against the torch twin in float64, ...': which of the two bounds ``row`` exceeds."""
        beyond = []
        if row.flax_f64_rms > self.float64_factor * row.torch_f64_rms:
            beyond.append(f"Flax's RMS error {row.flax_f64_rms:.3e} > {self.float64_factor:g}x torch's "
                          f"{row.torch_f64_rms:.3e}")
        if row.flax_f64 > self.float64_largest_factor * row.torch_f64:
            beyond.append(f"Flax's largest error {row.flax_f64:.3e} > {self.float64_largest_factor:g}x torch's "
                          f"{row.torch_f64:.3e}")
        if not beyond:  # a NaN compares false with either bound: the errors themselves are the finding
            beyond.append(f"an error is not a finite number (torch's largest {row.torch_f64:.3e}, Flax's "
                          f"{row.flax_f64:.3e})")
        return "; against the torch twin in float64, " + " and ".join(beyond)

    def to_dict(self):
        """The report as plain JSON values: a row's ``max_abs`` / ``max_rel`` that is not a
        finite number (a missing row's inf, a NaN output's NaN) is None, and its ``note`` says why."""
        first = self.first_divergence
        return {
            "atol": self.atol,
            **({"float64": True} if self.float64 else {}),
            **({} if self.float64_factor is None else {"float64_factor": self.float64_factor,
                                                       "float64_largest_factor": self.float64_largest_factor}),
            "ok": self.ok,
            "first_divergence": first.label if first else None,
            "rows": [_row_dict(r, self.atol) for r in self.rows],
            "left_out": [{"name": name, "why": why} for name, why in self.left_out],
            **({"notes": list(self.notes)} if self.notes else {}),
        }

    def to_json(self, **kw):
        """Strict JSON (RFC 8259: no NaN or Infinity, which strict parsers reject)."""
        return json.dumps(self.to_dict(), allow_nan=False, **kw)


def _number(value):
    return "-" if value is None else f"{value:.3e}"


def _rms_ratio(row):
    """Flax's RMS error against float64 over torch's: '-' where either is unmeasured or torch's is 0."""
    if row.flax_f64_rms is None or row.torch_f64_rms is None or row.torch_f64_rms == 0:
        return "-"
    return f"{row.flax_f64_rms / row.torch_f64_rms:.2f}"


def _where(row):
    """' at [i, j]': where a row's largest difference is (nothing for a scalar or an unknown place)."""
    return f" at [{', '.join(map(str, row.at))}]" if row.at else ""


def _left_out_lines(left_out, shown=6):
    """'(3 left out, only the torch side has them: a, b, c)', one line per reason."""
    by_why = {}
    for name, why in left_out:
        by_why.setdefault(why, []).append(name or "output")
    lines = []
    for why, names in by_why.items():
        more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
        lines.append(f"({len(names)} left out, {why}: {', '.join(names[:shown])}{more})")
    return lines


def _row_dict(row, atol):
    out = dict(dataclasses.asdict(row), label=row.label, kind=row.kind, shape=list(row.shape))
    out["at"] = None if row.at is None else list(row.at)
    del out["alias"]  # ``label`` holds it
    if row.torch_f64 is None and row.flax_f64 is None:  # no float64 reference: the row's keys as always
        del out["torch_f64"], out["flax_f64"], out["torch_f64_rms"], out["flax_f64_rms"]
    else:  # agreed by the float64 reference alone, beyond atol (the table's "yes (float64)")
        out["by_float64"] = bool(row.ok and not row.note and row.max_abs > atol)
    bad = {key: out[key] for key in ("max_abs", "max_rel") if not math.isfinite(out[key])}
    if bad and not out["note"]:  # a Row built elsewhere without one
        out["note"] = ", ".join(f"{key} is {value}" for key, value in bad.items())
    out.update(dict.fromkeys(bad, None))
    return out


def diff(a, b):
    """(max absolute, max relative) difference in float64. Relative is |a-b| / max(|a|, |b|),
    with 0/0 taken as 0, so it is symmetric and bounded by 2.

    Positions where both sides hold the same value differ by 0, equal infinities included:
    weights that overflow give the same ±inf on both twins, which is parity, not a bug (inf -
    inf alone would be NaN and blame the port). An infinity on one side only differs by inf,
    and a NaN anywhere by NaN (NaN != NaN): both beyond any tolerance."""
    d, rel = _differences(a, b)
    if d is None:
        return 0.0, 0.0
    return float(d.max()), float(rel.max())


def _differences(a, b):
    """(absolute, relative) differences elementwise, as ``diff`` defines them; (None, None) for empty arrays."""
    dtype = _compared_dtype(a, b)
    a = np.asarray(a, dtype)
    b = np.asarray(b, dtype)
    if a.size == 0 or b.size == 0:
        return None, None
    with np.errstate(invalid="ignore"):  # inf - inf, masked out below where they are equal
        d = np.where(a == b, 0.0, np.abs(a - b))
    scale = np.maximum(np.abs(a), np.abs(b))
    rel = np.divide(d, scale, out=np.zeros_like(d), where=(scale > 0) & np.isfinite(scale))
    rel = np.where(np.isfinite(d), rel, d)  # a non-finite difference is as large relatively
    return d, rel


def _compared_dtype(a, b):
    """complex128 where either side is complex (a cast to float64 would drop the imaginary
    parts, and with them any difference there), else float64."""
    return np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64


def largest_at(d):
    """The index of the largest difference in ``d`` (from ``_differences``): the first
    non-finite one if there is one, since NaN wins no ``argmax``; None for a scalar or when
    nothing differs."""
    if d is None or d.ndim == 0:
        return None
    flat = d.ravel()
    bad = ~np.isfinite(flat)
    i = int(np.argmax(bad)) if bad.any() else int(np.argmax(flat))
    if bad.any() or flat[i] > 0:
        return tuple(int(x) for x in np.unravel_index(i, d.shape))
    return None


def nonfinite_note(flax, torch_):
    """Why ``diff(flax, torch_)`` is not a finite number (NaN on a side, an infinity the other
    side does not have), or '' when it is."""
    dtype = _compared_dtype(flax, torch_)
    f, t = np.asarray(flax, dtype), np.asarray(torch_, dtype)
    parts = []
    for side, x, other, other_side in (("torch", t, f, "Flax"), ("Flax", f, t, "torch")):
        nans = int(np.isnan(x).sum())
        infs = int((np.isinf(x) & (x != other)).sum())
        if nans:
            parts.append(f"{side} has {nans} NaN")
        if infs:
            parts.append(f"{side} has {infs} infinit{'y' if infs == 1 else 'ies'} {other_side} does not")
    return "; ".join(parts)


def compared_row(name, shape, flax, torch_, atol):
    """The Row of two arrays of the same shape; a non-finite difference says why in its note."""
    d, rel = _differences(flax, torch_)
    max_abs, max_rel = (0.0, 0.0) if d is None else (float(d.max()), float(rel.max()))
    note = "" if math.isfinite(max_abs) else nonfinite_note(flax, torch_)
    return Row(name, tuple(shape), max_abs, max_rel, bool(max_abs <= atol), note, at=largest_at(d))
