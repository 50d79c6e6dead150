"""tools.xla_profile on the CMUdict recipe's model (D 128, 4 heads, 3 + 3 layers, F 512; vocabularies 32 and 44) at B 128, S = T = 16, dropout 0: a preset made for it here.

PYTHONPATH=. python profile_recipe_step.py [--json OUT]"""
import sys
import benchmarks.presets as p
from flaxformer_mini.model.config import ModelConfig
p.PRESETS["g2p"] = p.BenchPreset(name="g2p", model=ModelConfig(src_pad_idx=0, source_vocab_size=32, target_vocab_size=44, max_len=32, embed_size=128, heads=4, num_layers=3, dropout=0.0, ffn_dim=512), batch=128, seq_len=16, new_tokens=16)
from tools import xla_profile
xla_profile.main(["--preset", "g2p", "--steps", "5", "--top", "25"] + sys.argv[1:])
