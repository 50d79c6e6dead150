"""The tiny twins with the output projection x300 (tests/test_parity_float64.py's scaled twins): per input seed, the gradient rows the absolute tolerance fails and the float64 judgement; then seed 2's rows beyond it."""
import torch
import flaxformer_mini as fm
from parity import check_twins, torch_to_flax
from parity.twins import transformer_pair, parity_numerics
parity_numerics()
CONFIG = fm.get_preset("tiny")
t, f = transformer_pair(CONFIG, seed=0)
with torch.no_grad():
    t.decoder.fc.weight.mul_(300.0)
torch_to_flax(t.state_dict(), f)
for seed in (0, 1, 2, 3):  # the input batch's seed; the weights are seed 0 throughout
    plain = check_twins(t, f, CONFIG, seed=seed, grads=True)
    g = [r for r in plain.rows if r.kind != "intermediate"]
    j = check_twins(t, f, CONFIG, seed=seed, grads=True, float64_reference=True)
    gj = [r for r in j.rows if r.kind != "intermediate"]
    beyond = [r.name for r in g if not r.ok]
    print(seed, "plain fails", len(beyond), beyond[:4], "judged ok", j.ok, "loss", gj[0].max_abs, gj[0].torch_f64, gj[0].flax_f64)
j = check_twins(t, f, CONFIG, seed=2, grads=True, float64_reference=True)
for r in j.rows:
    if r.kind != "intermediate" and r.max_abs > j.atol:
        print(("ok  " if r.ok else "FAIL"), r.name, f"{r.max_abs:.2e} t64 {r.torch_f64:.2e} f64 {r.flax_f64:.2e} rms {r.torch_f64_rms:.2e} {r.flax_f64_rms:.2e}")
