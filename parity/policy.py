"""The parity policy's numbers, defined once (DESIGN.md, Parity policy)."""

# Max absolute difference allowed between the twins in float32 at the highest matmul
# precision: the standard of Hugging Face's PT/Flax equivalence tests.
DEFAULT_ATOL = 1e-5
