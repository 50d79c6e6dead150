"""A restore's memory peak at the seed's size: the peak resident memory of a fresh process
before and after ``checkpoint.restore`` of one checkpoint (the parameters and Adam's two
moments, 289 MiB), read through host arrays (the library's path for a state small beside the
memory free) and with orbax placing each array (its path for a large one). From the repository
root:

    python docs/benchmark_runs/2026-12-02T1125-amd-epyc-fam25-model1-checkpoint-restore/memory_peak.py [PAIRS]
"""
import subprocess
import sys
import tempfile

CHILD = r"""
import resource, sys
import jax
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train import checkpoint as C
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train.trainer import Trainer
directory, variant = sys.argv[1:3]
config = fm.get_preset("seed")
if variant == "save":
    C.save(C.open_manager(directory), Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig()).init_state())
    raise SystemExit
template = Trainer(fm.Transformer.abstract(config), TrainConfig()).state_template()
state_mib = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(C._saved(template))) / 2**20
if variant == "orbax_places":
    C.memory.host_available = lambda: 0  # every state is large beside it
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
jax.block_until_ready(C.restore(C.open_manager(directory), template).params)
rise = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
print(f"{variant}: state {state_mib:.0f} MiB, peak resident memory rose {rise:.0f} MiB ({rise / state_mib:.2f} times the state)")
"""


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    directory = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-c", CHILD, directory, "save"], check=True, capture_output=True)
    for _ in range(pairs):
        for variant in ("host_arrays", "orbax_places"):
            out = subprocess.run([sys.executable, "-c", CHILD, directory, variant], check=True, capture_output=True, text=True)
            print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
