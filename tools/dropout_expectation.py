"""Do the twins' dropouts agree in distribution? The mean train-mode loss over many dropout draws.

``python -m tools.dropout_expectation [--draws 6000] [--dropout 0.3] [--train-steps 400]``

torch's ``nn.Dropout`` and Flax's ``nnx.Dropout`` draw their masks from different generators,
so two training runs with dropout are compared as statistics (``benchmarks/train_parity.py``).
That comparison assumes the two dropouts are the same random function: the same layers, the
same keep probability and scaling, masks independent from layer to layer and step to step. A
twin that reused one mask in every layer, or dropped at another rate, would train on another
objective, and its curve would sit apart from torch's however many seeds were run.

This checks it directly: the torch twin is trained without dropout on the ``reverse`` task
(``--train-steps``; a trained model's loss moves more under dropout than an initial one's),
both twins get its weights with ``--dropout``, and each computes the train-mode loss of one
fixed batch ``--draws`` times: torch from its global generator, Flax from the train step's
keys (``fold_in(key(seed), i)``, reseeded as ``train.step.reseed_dropout`` does). Printed: each
mean with its standard error, and their difference in standard errors.
"""

import argparse
import math
import sys

import jax
import numpy as np
import torch
from flax import nnx

import flaxformer_mini as fm
import torch_ref
from benchmarks import machine
from benchmarks.code_version import code_version, describe
from flaxformer_mini.data import SyntheticTask
from flaxformer_mini.train.loss import token_cross_entropy as flax_loss
from flaxformer_mini.train.step import reseed_dropout
from parity.twins import flax_twin, transformer_pair
from torch_ref.training import make_optimizer, token_cross_entropy, train_step


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.dropout_expectation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(fm.PRESETS))
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--draws", type=int, default=6000)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.dropout < 1 or args.draws < 2 or args.train_steps < 0 or args.batch_size < 1:
        parser.error("--dropout must be in (0, 1), --draws >= 2, --train-steps >= 0, --batch-size >= 1")
    torch.set_num_threads(1)
    config = fm.get_preset(args.preset).replace(dropout=0.0)
    task = SyntheticTask("reverse", config.target_vocab_size, 2, config.max_len - 1)
    torch_model, _ = transformer_pair(config, args.seed)
    torch_model.train()
    optimizer, scheduler = make_optimizer(torch_model, schedule="constant", learning_rate=3e-3)
    for step in range(args.train_steps):
        train_step(torch_model, optimizer, scheduler, task.batch(args.seed + 1, step, 32))

    config = config.replace(dropout=args.dropout)
    torch_model_p = torch_ref.Transformer(**config.to_dict())
    torch_model_p.load_state_dict(torch_model.state_dict())
    torch_model_p.train()
    flax_model = flax_twin(torch_model_p.state_dict(), config, args.seed)
    flax_model.train()
    batch = task.batch(args.seed + 2, 0, args.batch_size)
    source, target_in, target_out = (torch.as_tensor(x, dtype=torch.int64) for x in batch)
    torch.manual_seed(args.seed)
    with torch.no_grad():
        torch_losses = [token_cross_entropy(torch_model_p(source, target_in), target_out).item()
                        for _ in range(args.draws)]
    graphdef, state = nnx.split(flax_model)

    @jax.jit
    def loss_with(state, key):
        model = nnx.merge(graphdef, state)
        reseed_dropout(model, key)
        return flax_loss(model(batch.source, batch.target_in), batch.target_out)[0]

    key = jax.random.key(args.seed)
    flax_losses = [float(loss_with(state, jax.random.fold_in(key, i))) for i in range(args.draws)]
    torch_model_p.eval()
    with torch.no_grad():
        eval_loss = token_cross_entropy(torch_model_p(source, target_in), target_out).item()

    print(f"{machine.one_line(machine.describe())}\n{machine.date_utc()}, {describe(code_version())}")
    print(f"{args.preset}, dropout {args.dropout}, trained {args.train_steps} steps without dropout; eval-mode loss "
          f"{eval_loss:.4f}; train-mode loss over {args.draws} draws:")
    stats = {}
    for name, losses in (("torch", torch_losses), ("flax", flax_losses)):
        x = np.asarray(losses)
        stats[name] = (x.mean(), x.std(ddof=1) / math.sqrt(len(x)))
        print(f"  {name:5s} mean {x.mean():.4f} +- {stats[name][1]:.4f} (standard error), std {x.std(ddof=1):.4f}")
    diff = stats["flax"][0] - stats["torch"][0]
    se = math.hypot(stats["flax"][1], stats["torch"][1])
    print(f"  flax - torch: {diff:+.4f} +- {se:.4f} ({diff / se:+.1f} standard errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
