"""The parity policy's numbers, defined once (DESIGN.md, Parity policy)."""

# Max absolute difference allowed between the twins in float32 at the highest matmul
# precision: the standard of Hugging Face's PT/Flax equivalence tests.
DEFAULT_ATOL = 1e-5

# ``parity check --decode``: a decoded token the twins disagree on counts against the port
# only when either side's logit of its own token exceeds its logit of the other side's by more
# than this many tolerances (the test suite's MIN_MARGIN), so that rounding within the
# tolerance cannot have swapped them; both within it, the step is a near-tie, a property of the data.
NEAR_TIE_FACTOR = 10

# ``parity check --float64-reference``: an output beyond the tolerance still agrees when the
# Flax twin's float32 error against the torch twin run in float64 is at most this many times
# torch's own float32 error there. A trained model's large activations make float32 rounding
# alone exceed 1e-5 (the README's main job: logits up to 31.6, torch float32 against float64
# 1.9e-5, Flax float32 against float64 2.5e-5, a ratio of 1.3; one measurement, on an AMD
# EPYC CPU, not yet on a GPU, whose summation orders differ); a port's bug is many times
# torch's rounding.
FLOAT64_FACTOR = 2

# ``parity.bfloat16``: the Flax twin computing in bfloat16 against the torch twin in float32.
# Each row's max absolute difference may be BFLOAT16_FACTOR x 2^-8 (bfloat16's rounding step,
# relative: 8 significant bits) x sqrt(depth + 1) x the row's largest float32 magnitude, depth
# being the number of blocks the row's value has gone through. The factor is twice the largest
# difference measured in those units (docs/design.md, "Parity policy", has the measurements).
BFLOAT16_STEP = 2.0**-8
BFLOAT16_FACTOR = 4
