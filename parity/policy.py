"""The parity policy's numbers, defined once (docs/design.md, Parity policy), and the check
every comparison makes of a tolerance it is given."""

import math

# Max absolute difference allowed between the twins in float32 at the highest matmul
# precision: the standard of Hugging Face's PT/Flax equivalence tests.
DEFAULT_ATOL = 1e-5

# ``parity check --decode``: a decoded token the twins disagree on counts against the port
# only when either side's logit of its own token exceeds its logit of the other side's by more
# than this many tolerances (the test suite's MIN_MARGIN), so that rounding within the
# tolerance cannot have swapped them; both within it, the step is a near-tie, a property of the data.
NEAR_TIE_FACTOR = 10

# ``parity check --float64-reference``: an output beyond the tolerance still agrees when the
# Flax twin's float32 errors against the torch twin run in float64 are those of a model as exact
# as torch: their root mean square at most FLOAT64_FACTOR times torch's, and their largest at
# most FLOAT64_LARGEST_FACTOR times torch's largest. A trained model's large activations make
# float32 rounding alone exceed 1e-5. The RMS over a row's elements measures a twin's rounding
# and varies little between equally exact twins; the largest error is one extreme among many
# and varies about twice as much, so it gets the wider bound, which one wrong element still
# passes far beyond (docs/design.md, "Parity policy", has the measured ratios).
FLOAT64_FACTOR = 2
FLOAT64_LARGEST_FACTOR = 4
# ... or when every element of Flax's is within FLOAT64_ULPS of float32's rounding steps (its
# spacing at the float64 value) of that value: as exact as float32 holds it, whatever torch's
# error. A scalar (the loss) is one rounding on each side, whose ratio says nothing: at a loss of
# some hundreds one step is 3.1e-5, and torch may land a third of a step off where Flax lands
# two thirds.
FLOAT64_ULPS = 1

# ``parity.bfloat16``: the Flax twin computing in bfloat16 against the torch twin in float32.
# Each row's max absolute difference may be BFLOAT16_FACTOR x 2^-8 (bfloat16's rounding step,
# relative: 8 significant bits) x sqrt(depth + 1) x the row's largest float32 magnitude, depth
# being the number of blocks the row's value has gone through. The factor is twice the largest
# difference measured in those units (docs/design.md, "Parity policy", has the measurements).
BFLOAT16_STEP = 2.0**-8
BFLOAT16_FACTOR = 4

# The default tolerance of a float64 comparison (``compare(..., float64=True)``, ``parity check
# --float64``): far above what the seed-size twins differ by in float64 (about 1e-14) and far
# below what a LayerNorm epsilon slip gives (about 1e-6); docs/design.md ("Parity policy") has
# the measured figures.
FLOAT64_ATOL = 1e-10

# The largest tolerance a float64 comparison takes: above it, float32's rounding is back in
# the tolerance and the slips float64 exists to show (a LayerNorm epsilon 1e-6 for 1e-5) pass.
FLOAT64_MAX_ATOL = 1e-8


def check_tolerance(atol, who, float64=False):
    """Refuse (ValueError naming ``who``) a tolerance that is not a finite number >= 0, under
    which every row would fail (negative, NaN) or pass (infinite), and with ``float64`` one
    above ``FLOAT64_MAX_ATOL``."""
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not math.isfinite(atol) or atol < 0:
        raise ValueError(f"{who}: atol must be a finite number >= 0, got {atol!r}")
    if float64 and atol > FLOAT64_MAX_ATOL:
        raise ValueError(f"{who}: atol={atol:g} with float64=True keeps a float32-sized tolerance, which passes the "
                         f"slips float64 exists to catch; leave atol out (float64's default, 1e-10) or give at most "
                         f"{FLOAT64_MAX_ATOL:g}")
