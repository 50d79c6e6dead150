"""What both file modules share, torch-free: the suffixes, the error for an unusable file, and
the first look at a file given as input."""

from pathlib import Path

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"


class CheckpointError(ValueError):
    """A checkpoint file cannot be used: unknown type, unsafe, truncated or corrupt."""


def readable_file(path, what="checkpoint file"):
    """``path`` as a Path, once it is known to be a file this process can open: CheckpointError
    for nothing there or a directory; the OSError of ``open`` (no permission...), which names
    the file, otherwise. Checked first, so that a reader's own error for these (torch's
    "truncated or corrupt?" guess) never hides the plain cause."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a {what}")
    open(path, "rb").close()
    return path
