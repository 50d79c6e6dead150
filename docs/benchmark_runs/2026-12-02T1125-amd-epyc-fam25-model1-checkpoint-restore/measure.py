"""A checkpoint's restore, as a command's first restore in a fresh process: the library's
``checkpoint.restore`` (host arrays, one device_put, no metadata read when the restore fits)
against the path it replaced, reproduced here (orbax's metadata read for the shape check, then
orbax placing each array; the rest of ``restore`` is the same in both). From the repository root:

    python docs/benchmark_runs/2026-12-02T1125-amd-epyc-fam25-model1-checkpoint-restore/measure.py [PAIRS]
"""
import statistics
import subprocess
import sys
import tempfile

PRESETS = {"tiny 1+1 layers": "tiny", "seed (512 wide, 6+6 layers)": "seed"}

CHILD = r"""
import sys, time
import jax, orbax.checkpoint as ocp
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train import checkpoint as C
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
preset, directory, variant = sys.argv[1:4]
config = fm.get_preset(preset)
if preset == "tiny":
    config = config.replace(num_layers=1)
trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig())
manager = C.open_manager(directory)
if variant == "save":
    C.save(manager, trainer.init_state())
    raise SystemExit
template = trainer.state_template()
C.silence_orbax_aftermath()
if variant == "replaced":  # stored shapes from orbax's metadata, then orbax places each array
    read = {}  # the replaced path read each checkpoint's stored shapes once per process

    def replaced_read(manager, step, target, wanted):
        read.setdefault(step, C._read_stored_shapes(manager, step))
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    C._read = replaced_read
times = []
for _ in range(2):  # a command's first restore, then a second one in the same process
    t0 = time.process_time()
    jax.block_until_ready(C.restore(manager, template, 0).params)
    times.append(time.process_time() - t0)
print(*(f"{t:.4f}" for t in times))
"""


def child(*args):
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
    return [float(t) for t in out.stdout.split()]


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for label, preset in PRESETS.items():
        directory = tempfile.mkdtemp()
        child(preset, directory, "save")
        a, b = [], []
        for _ in range(pairs):  # in turn: A B A B ...
            a.append(child(preset, directory, "library"))
            b.append(child(preset, directory, "replaced"))
        for i, which in enumerate(("first", "second")):
            x, y = [t[i] for t in a], [t[i] for t in b]
            ratios = [p / q for p, q in zip(x, y)]
            print(f"{label}, {which} restore: library {min(x)*1e3:.0f}-{max(x)*1e3:.0f} ms, replaced path "
                  f"{min(y)*1e3:.0f}-{max(y)*1e3:.0f} ms of CPU; A/B median {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}), {pairs} pairs", flush=True)


if __name__ == "__main__":
    main()
