"""What both file modules share, torch-free: the suffixes and the error for an unusable file."""

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: unknown type, unsafe, truncated or corrupt."""
