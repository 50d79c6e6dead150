"""The parity policy's numbers, defined once (DESIGN.md, Parity policy)."""

# Max absolute difference allowed between the twins in float32 at the highest matmul
# precision: the standard of Hugging Face's PT/Flax equivalence tests.
DEFAULT_ATOL = 1e-5

# ``parity check --decode``: a decoded token the twins disagree on counts against the port
# only when torch's top-1 minus top-2 logit at that step exceeds this many tolerances (the
# test suite's MIN_MARGIN), so that rounding within the tolerance cannot have flipped the
# argmax; at or below it the step is a near-tie, a property of the data.
NEAR_TIE_FACTOR = 10
