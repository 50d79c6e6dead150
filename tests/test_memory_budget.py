"""Sizes a user can type are checked against what the machine holds before anything is
allocated: the estimates behind the checks, what only needs clamping, and XLA's own
out-of-memory error as one line. The command-line cases (exit code, message, nothing written)
are rows of tests/test_bad_input_matrix.py."""

import jax
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.cli.errors import EXIT_FAILED, explain
from flaxformer_mini.data import TextPairs, Vocab, tokenizers
from flaxformer_mini.model import memory


@pytest.mark.parametrize("preset", ["tiny", "small", "seed", "medium"])
def test_the_parameter_count_is_the_models(preset):
    config = fm.get_preset(preset)
    model = nnx.eval_shape(lambda: fm.Transformer.from_config(config, rngs=nnx.Rngs(0)))
    assert memory.param_count(config) == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_the_training_estimate_counts_the_state_logits_and_attention_weights():
    # Worked by hand for the tiny preset (D 30, H 5, 2 + 2 layers, V 19): a batch of 3 rows,
    # S 4, T 2. State: 4 x 33,229 parameters. Logits and their gradient: 2 x 3 x 2 x 19.
    # Attention weights: 2 layers x 3 rows x 5 heads x (16 + 4 + 8).
    config = fm.get_preset("tiny")
    parts = memory.training_bytes(config, rows=3, source_len=4, target_len=2)
    assert parts == {"model": 4 * 4 * 33_229, "batch": 4 * (2 * 3 * 2 * 19 + 2 * 3 * 5 * 28)}
    remat = memory.training_bytes(config, rows=3, source_len=4, target_len=2, remat=True)
    assert remat["batch"] == 4 * (2 * 3 * 2 * 19 + 1 * 3 * 5 * 28)  # one layer's weights at a time


def test_the_decoding_estimate_counts_both_caches_and_a_beams_gathered_copy():
    config = fm.get_preset("tiny")  # D 30, 2 decoder layers, V 19
    greedy = memory.decoding_bytes(config, rows=2, new_tokens=5, source_len=3)
    assert greedy == 4 * (33_229 + 2 * 2 * 2 * 30 * 5 + 2 * 2 * 2 * 30 * 3 + 2 * 19)
    beams = memory.decoding_bytes(config, rows=2, new_tokens=5, source_len=3, beams=4)
    assert beams == 4 * (33_229 + 2 * (2 * 2 * 8 * 30 * 5) + 2 * 2 * 8 * 30 * 3 + 8 * 19)


def test_free_memory_is_read_and_a_size_beyond_it_falls_short():
    free, where = memory.free_bytes()
    assert free > 2**20 and where
    assert memory.shortfall(free * 1000) is not None and memory.shortfall(1) is None


def test_a_token_budget_beyond_the_corpus_pads_no_more_rows_than_the_corpus_holds():
    words = Vocab.build(["a b c", "x y z"])
    pairs = TextPairs([("a b", "x"), ("c", "y z"), ("a", "z")], words, words, max_len=8, length_multiple=4)
    batch = pairs.batch_of_rows([0, 1], max_tokens=10**11)
    assert batch.source.shape == (3, 4)  # 10**11 // 4 rows asked, the corpus's 3 given
    assert pairs.batch_of_rows([0, 1], max_tokens=8).source.shape == (2, 4)  # a budget within it: the rows it holds


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_subword_vocabulary_size_beyond_the_text_trains_what_the_text_gives(kind):
    # The trainers allocate for the size asked: a Rust panic (bpe) or an OverflowError
    # (unigram) at 10**11. Capped at the text's characters, they learn what there is.
    texts = ["the cat sat", "on the mat", "a cat"]
    tokenizer = tokenizers.train(kind, texts, vocab_size=10**11)
    assert 4 < len(tokenizer) <= 4 + sum(map(len, texts)) + len(set("".join(texts)))
    assert tokenizer.requested_vocab_size == 10**11  # the note and a resume compare with what was typed
    assert tokenizer.decode(tokenizer.encode("the cat")) == "the cat"


def test_xlas_out_of_memory_error_is_one_line_with_exit_code_1():
    error = jax.errors.JaxRuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating 34978001072 bytes.")
    code, message = explain(error)
    assert code == EXIT_FAILED
    assert message.startswith("out of memory: INTERNAL: Error dispatching computation: Out of memory allocating "
                              "34978001072 bytes. The sizes fit the check")
    assert explain(jax.errors.JaxRuntimeError("INTERNAL: something else")) == (None, None)  # a bug keeps its traceback


def test_an_accumulated_update_asked_to_stop_leaves_the_state_as_it_was():
    from flaxformer_mini.data import SyntheticTask
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    # One layer a side: the stop falls between micro-batches, whatever the depth, and a second
    # layer doubles the compilations (tests/helpers.py's TINY_RUN).
    config = fm.get_preset("tiny").replace(dropout=0.0, num_layers=1)
    trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig(warmup_steps=2))
    task = SyntheticTask("copy", config.target_vocab_size, 1, 5)
    drawn = []

    def micro_batches():
        for j in range(10**9):  # never exhausted by itself
            drawn.append(j)
            yield task.batch(0, j, 4)

    state = trainer.init_state()
    before = jax.device_get(state.params)
    asked = iter([False, False, True])
    assert trainer.accumulate(state, micro_batches(), stop=lambda: next(asked)) is None
    assert drawn == [0, 1, 2, 3]  # the third answer came after micro-batch 2; 3 was drawn to see it was not the last
    assert int(state.step) == 0
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), before)
    # A stop answered after the last micro-batch changes nothing: the update is whole.
    update = trainer.accumulate(state, [task.batch(0, 0, 4)], stop=lambda: True)
    assert update is not None and int(update[0].step) == 1


def test_an_evaluation_asked_to_stop_returns_none_between_batches():
    from flaxformer_mini.data import SyntheticTask
    from flaxformer_mini.decode.evaluation import evaluate
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    config = fm.get_preset("tiny").replace(num_layers=1)  # the stop falls between batches, whatever the depth
    trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig())
    task = SyntheticTask("copy", config.target_vocab_size, 1, 5)
    batches = [task.batch(0, j, 4) for j in range(3)]
    state = trainer.init_state()
    asked = []
    assert evaluate(trainer, state, batches, stop=lambda: asked.append(1) or len(asked) > 4) is None
    assert len(asked) == 5  # 3 teacher-forced batches, then the decoded ones until it said stop
    full = evaluate(trainer, state, batches, stop=lambda: False)
    assert set(full) >= {"loss", "token_accuracy", "exact_match"}
