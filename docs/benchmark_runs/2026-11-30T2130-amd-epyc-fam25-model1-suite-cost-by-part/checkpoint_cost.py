"""orbax save and restore of the one-layer tiny train state in one process, at CPython's collector
thresholds: `python checkpoint_cost.py [prof]` from the repository root (prof adds cProfile
of 6 saves and 6 restores)."""
import os, time, cProfile, pstats, shutil, sys
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false")
import jax
from flax import nnx
import flaxformer_mini as fm
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import checkpoint as C
cfg = fm.get_preset("tiny").replace(num_layers=1)
tr = Trainer(fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0)), TrainConfig(warmup_steps=5))
state = tr.init_state()
print("arrays", len(jax.tree.leaves(C._saved(state))))
d = "/tmp/ckpt_prof_dir"; shutil.rmtree(d, ignore_errors=True)
m = C.open_manager(d)
def save(i):
    s = state.replace(step=state.step + i)
    C.save(m, s)
def restore():
    return C.restore(m, tr.state_template())
for i in range(3): save(i + 1)
restore()
N = 6
c0 = time.process_time(); w0 = time.time()
for i in range(N): save(10 + i)
c1 = time.process_time(); w1 = time.time()
for i in range(N): restore()
c2 = time.process_time(); w2 = time.time()
print(f"save cpu {(c1-c0)/N:.3f} wall {(w1-w0)/N:.3f}; restore cpu {(c2-c1)/N:.3f} wall {(w2-w1)/N:.3f}")
if len(sys.argv) > 1:
    pr = cProfile.Profile(); pr.enable()
    for i in range(N): save(20 + i)
    pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
    pr = cProfile.Profile(); pr.enable()
    for i in range(N): restore()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(30)
