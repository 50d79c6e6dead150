"""`train --ema DECAY`: the parameters' exponential moving average follows every update (its
decay warmed up as TensorFlow's ExponentialMovingAverage's), with gradient accumulation too; it
is saved in the checkpoints, so a run killed and resumed keeps it bit for bit; and it is what the
evaluation during training, `evaluate`, `generate` and `parity convert` read."""

import json
import shutil

import chex
import jax
import numpy as np
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.data import SyntheticTask
from flaxformer_mini.runs.config import TrainOptions, train_config_for
from flaxformer_mini.runs.run import Run
from flaxformer_mini.train.trainer import Trainer
from helpers import TINY_RUN, TINY_RUN_INPUTS, assert_same_training_state, cli, command_precision, latest_state

DECAY = 0.2  # reached from the third update on: (1 + n) / (10 + n) is 0.1, 0.18, then 0.25 > DECAY


def host(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(tree))


def test_the_average_moves_toward_each_updates_parameters_with_the_warmed_up_decay():
    task = SyntheticTask("reverse", vocab_size=11, min_len=1, max_len=5)
    config = fm.get_preset("tiny").replace(num_layers=1, max_len=6, source_vocab_size=11, target_vocab_size=11)
    model = fm.Transformer.from_config(config, rngs=nnx.Rngs(0))
    # TINY_RUN's optimizer (its --lr and --warmup), as the next test's run: one compiled step for both.
    trainer = Trainer(model, train_config_for(TrainOptions(preset="tiny", warmup=5, ema=DECAY), config.embed_size))
    state = trainer.init_state()
    chex.assert_trees_all_equal(state.ema, state.params)  # it starts at the initial parameters
    expected = host(state.ema)
    for n in range(4):
        batch = task.batch(0, n, 8)
        if n == 3:  # an update made of micro-batches (--accumulate) moves it the same way
            state, _ = trainer.accumulate(state, [task.batch(0, 100, 4), task.batch(0, 101, 4)])
        else:
            state, _ = trainer.step(state, batch)
        d = min(DECAY, (1 + n) / (10 + n))
        expected = jax.tree.map(lambda e, p: d * e + (1 - d) * p, expected, host(state.params))
        # float32 on the device, float64 here: XLA may fuse each multiply-add, and the two sides
        # round at other places; 1e-6 relative is float32's own few ulps.
        chex.assert_trees_all_close(host(state.ema), expected, rtol=1e-6, atol=1e-7)
    assert not np.allclose(host(state.ema)["encoder"]["embedding_layer"]["embedding"].get_value(),
                           host(state.params)["encoder"]["embedding_layer"]["embedding"].get_value())


def test_a_killed_run_resumes_its_average_bit_for_bit_and_evaluate_generate_and_export_read_it(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # DECAY: the model, optimizer and batch of the test above, whose compiled step this run reads.
    command = ["train", *TINY_RUN, "--steps", "10", "--save-every", "5", "--ema", str(DECAY)]
    result = json.loads(cli(*command, "--out", str(straight)).stdout.strip().splitlines()[-1])
    # What kill -9 leaves at step 7: the checkpoint of step 5. Resumed, the average is restored
    # from it, not started again from the parameters.
    assert cli(*command[:-4], "--steps", "7", "--save-every", "5", "--ema", str(DECAY), "--out", str(killed)).returncode == 0
    shutil.rmtree(killed / "checkpoints" / "7")
    resumed = cli(*command, "--out", str(killed))
    assert resumed.returncode == 0 and f"resuming {killed} from step 5" in resumed.stderr, resumed.stderr
    (_, a), (_, b) = latest_state(straight), latest_state(killed)
    assert_same_training_state(a, b)
    chex.assert_trees_all_equal(a.ema, b.ema)

    # The evaluation during training and `evaluate` score the average, not the parameters.
    run = Run.open(straight)
    batches = run.eval_batches()
    with command_precision():  # the evaluation during training's precision (on a GPU, TF32)
        on_average = run.trainer.evaluate(a.for_inference(), batches)["loss"]
        on_parameters = run.trainer.evaluate(a.replace(ema=None), batches)["loss"]
    assert on_average != on_parameters
    assert result["loss"] == on_average
    scored = json.loads(cli("evaluate", "--checkpoint", str(straight), "--json").stdout)
    assert scored["loss"] == on_average
    # A batch of the held-out batch's rows: generate decodes with the program the run's evaluation compiled.
    generated = cli("generate", "--checkpoint", str(straight), stdin=TINY_RUN_INPUTS)
    assert generated.returncode == 0 and generated.stdout.count("\n") == TINY_RUN_INPUTS.count("\n"), generated.stderr
    from parity.convert import state_dict_from_run

    exported, _, _ = state_dict_from_run(straight)
    np.testing.assert_array_equal(exported["encoder.embedding_layer.weight"].numpy(),
                                  np.asarray(a.ema["encoder"]["embedding_layer"]["embedding"].get_value()))
