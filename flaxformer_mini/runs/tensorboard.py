"""TensorBoard event files for a run: ``open_writer(logdir).scalars(step, {...})``.

Written with tensorboardX (a small pure-Python writer of TensorBoard's own protobuf event
format; no TensorFlow), so ``tensorboard --logdir runs/`` shows the runs. The run imports
this module only when it writes events, and this module imports tensorboardX only inside
``open_writer`` / ``read_scalars``.

tensorboardX imports torch at import time if torch is installed, only to accept
``torch.Tensor`` values. ``flaxformer_mini`` never imports torch (docs/design.md) and we pass
plain floats, so the import below hides torch from it (as if torch were not installed, the
case tensorboardX supports) unless torch is already loaded. That also saves the second or
two importing torch costs.
"""

import contextlib
import struct
import sys
from pathlib import Path


@contextlib.contextmanager
def _torch_hidden():
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # ``import torch`` now raises ImportError
    try:
        yield
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def _tensorboardx():
    with _torch_hidden():
        import tensorboardX
        from tensorboardX.proto import event_pb2
    return tensorboardX, event_pb2


class ScalarWriter:
    """Scalars to one event file in ``logdir``. Use ``scalars`` then ``close`` (or ``with``)."""

    def __init__(self, logdir):
        tensorboardX, _ = _tensorboardx()
        self.logdir = Path(logdir)
        # flush_secs: events reach the disk at least this often while training runs.
        self._writer = tensorboardX.SummaryWriter(logdir=str(self.logdir), flush_secs=30)

    def scalars(self, step, values):
        """Write ``{tag: number}`` at ``step`` (tags like ``"train/loss"``, ``"eval/bleu"``).

        Non-finite values are written too (TensorBoard shows NaN/inf), since a NaN loss is
        exactly what one wants to see; non-numbers are a ``TypeError`` naming the tag.
        """
        step = int(step)
        for tag, value in values.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"TensorBoard scalar {tag!r} must be a number, got {value!r}") from None
            self._writer.add_scalar(tag, value, global_step=step)

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_writer(logdir):
    """A ``ScalarWriter`` writing TensorBoard events into ``logdir`` (created if needed)."""
    return ScalarWriter(logdir)


def read_scalars(logdir):
    """``{tag: [(step, value), ...]}`` from every event file in ``logdir``, in write order.

    A reader for tests and quick checks, so they need not install ``tensorboard``: event
    files are TFRecord files (per record: uint64 length, uint32 CRC, payload, uint32 CRC) of
    ``Event`` protobufs. CRCs are not checked. Values come back as float32, as stored.
    """
    _, event_pb2 = _tensorboardx()
    out = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            payload = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


__all__ = ["open_writer", "ScalarWriter", "read_scalars"]
