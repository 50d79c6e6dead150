"""A one-layer tiny model's train state (147 arrays with Adam's moments),
saved 3 times and restored 3 times through flaxformer_mini.train.checkpoint, each timed by wall
and process CPU: `python checkpoint_one_save.py [DIR]` from the repository root."""
import os, sys, time, tempfile, shutil
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false")
import flaxformer_mini as fm
from flax import nnx
from flaxformer_mini.train.trainer import Trainer
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import checkpoint
cfg = fm.get_preset("tiny").replace(num_layers=1, source_vocab_size=13, target_vocab_size=13, max_len=7)
tr = Trainer(fm.Transformer.from_config(cfg, rngs=nnx.Rngs(0)), TrainConfig(warmup_steps=5))
state = tr.init_state()
d = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None)
m = checkpoint.open_manager(d)
for i in range(3):
    s = state.replace(step=state.step + i)
    c0, t0 = time.process_time(), time.perf_counter()
    checkpoint.save(m, s)
    print(f"save: wall {time.perf_counter()-t0:.3f} cpu {time.process_time()-c0:.3f}")
for i in range(3):
    c0, t0 = time.process_time(), time.perf_counter()
    checkpoint.restore(m, tr.state_template(), i)
    print(f"restore: wall {time.perf_counter()-t0:.3f} cpu {time.process_time()-c0:.3f}")
shutil.rmtree(d)
