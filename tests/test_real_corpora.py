"""Real corpora through the training product (issue #11): tokenizers saved and checked in the
run, --max-tokens batches with exact resume, --accumulate equal to one larger batch, text
metrics from `evaluate`, TensorBoard events, and the bad input around them."""

import dataclasses
import functools
import json

import chex
import jax
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.data import tokenizers
from flaxformer_mini.decode.metrics import corpus_metrics
from flaxformer_mini.runs.run import Run
from flaxformer_mini.runs.directory import RunDir
from flaxformer_mini.runs.tensorboard import read_scalars
from flaxformer_mini.train.optimizer import TrainConfig
from flaxformer_mini.train import trainer as trainer_module
from flaxformer_mini.train.trainer import Trainer
from helpers import (assert_same_training_state, cli, killed_before_its_last_checkpoint, latest_state, run_process, text_args,
                     write_corpus)

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return write_corpus(d / "train.tsv", 60), write_corpus(d / "valid.tsv", 7)


# The bpe runs' lengths rounded to 16: every pair of these corpora then pads to 16 tokens a side,
# one --max-tokens 96 batch shape, (6, 16), and one compiled train step, where the default multiple
# gives two, (12, 8) and (6, 16). A budget's batches of several shapes are the accumulating runs'.
BPE_LENGTHS = ["--length-multiple", "16"]


@pytest.fixture(scope="module")
def bpe_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe") / "run"
    args = text_args(corpus, out, "--tokenizer", "bpe", "--vocab-size", "40", "--max-tokens", "96", *BPE_LENGTHS)
    proc = cli(*args, "--steps", "8")
    assert proc.returncode == 0, proc.stderr
    return out, args


def test_a_bpe_run_saves_its_tokenizers_in_hf_format_with_recorded_checksums(bpe_run):
    out, _ = bpe_run
    recorded = RunDir(out).recorded_checksums()
    for side in ("source", "target"):
        path = out / f"tokenizer_{side}.json"
        assert recorded[path.name] == tokenizers.file_sha256(path)
        assert tokenizers.load(out, "bpe", side, sha256=recorded[path.name]).kind == "bpe"
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["tokenizer"] == "bpe" and config["data"]["tokenizer_vocab_size"] == 40
    assert config["max_tokens"] == 96


def test_evaluate_json_scores_the_hypotheses_it_writes_with_corpus_metrics(bpe_run, tmp_path):
    out, _ = bpe_run
    hypotheses_file = tmp_path / "hyp.txt"
    proc = cli("evaluate", "--checkpoint", str(out), "--json", "--output", str(hypotheses_file))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == {"loss", "token_accuracy", "exact_match", "bleu", "chrf", "wer", "cer"}
    hypotheses = hypotheses_file.read_text().splitlines()
    # References independently: the valid file's targets through the run's own target tokenizer.
    run = Run.open(out)
    targets = [line.split("\t")[1] for line in corpus_lines(bpe_run[1])]
    references = [run.codec.decode(run.dir.load_vocabularies(run.config.data)[1].encode(t)) for t in targets]
    assert len(hypotheses) == len(references) == 7
    expected = corpus_metrics(hypotheses, references)
    for key in ("bleu", "chrf", "wer", "cer"):
        assert result[key] == pytest.approx(expected[key], abs=1e-9)


def test_evaluate_of_a_valid_run_reads_no_training_file_and_its_batches_read_it_when_asked(bpe_run, tmp_path):
    import shutil

    from flaxformer_mini.data import DataError

    out = tmp_path / "run"
    shutil.copytree(bpe_run[0], out)
    broken = tmp_path / "train.tsv"
    broken.write_text("no tab on this line\n")  # the training file, changed since into no TSV at all
    config = json.loads((out / "config.json").read_text())
    config["data"]["train_path"] = str(broken)
    config["checksums"].pop("config", None)
    (out / "config.json").write_text(json.dumps(config))
    scores = [cli("evaluate", "--checkpoint", str(run), "--json") for run in (bpe_run[0], out)]
    assert [p.returncode for p in scores] == [0, 0], scores[1].stderr
    assert json.loads(scores[1].stdout) == json.loads(scores[0].stdout)
    with pytest.raises(DataError, match=f"{broken}:1"):  # read when its batches are asked for, and named
        next(Run.open(out).train_batches(0))


def test_evaluate_data_with_a_side_the_tokenizer_empties_names_its_line_and_writes_nothing(bpe_run, tmp_path):
    # U+2581 is the Metaspace word mark, which the bpe tokenizer reads as a space: a target of
    # it alone is as empty as a blank one, and every reference empty leaves WER undefined.
    data = tmp_path / "test.tsv"
    data.write_text(corpus_lines(bpe_run[1])[0] + "\n\u2581\t\u2581\n")
    hypotheses = tmp_path / "hyp.txt"
    proc = cli("evaluate", "--checkpoint", str(bpe_run[0]), "--data", str(data), "--output", str(hypotheses))
    assert proc.returncode == 2, proc.stderr
    assert f"{data}:2: empty source once the tokenizer normalises '\u2581' (it reads U+2581" in proc.stderr
    assert "Traceback" not in proc.stderr and not hypotheses.exists()


def corpus_lines(args):
    return open(args[args.index("--valid") + 1]).read().splitlines()


def test_a_subword_tokenizer_decodes_its_own_encoding_of_normalised_text(bpe_run):
    run = Run.open(bpe_run[0])
    for line in corpus_lines(bpe_run[1]):
        source = line.split("\t")[0]
        ids, unknown = run.codec.encode(source)
        assert unknown == []
        assert run.dir.load_vocabularies(run.config.data)[0].decode(ids) == tokenizers.normalize(source)


def test_training_writes_tensorboard_events_with_the_logged_metrics(bpe_run):
    out, _ = bpe_run
    scalars = read_scalars(out / "tensorboard")
    logged = [r for r in RunDir(out).read_metrics() if "loss" in r]
    assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in logged]
    # Stored as float32 by TensorBoard: equal to the log's float64 at float32 precision.
    np.testing.assert_allclose([v for _, v in scalars["train/loss"]], [r["loss"] for r in logged], rtol=1e-6)
    for tag in ("train/learning_rate", "train/grad_norm", "train/tokens_per_s", "eval/bleu", "eval/wer", "eval/cer"):
        assert tag in scalars, tag
    evals = [r for r in RunDir(out).read_metrics() if "eval_bleu" in r]
    np.testing.assert_allclose([v for _, v in scalars["eval/chrf"]], [r["eval_chrf"] for r in evals], rtol=1e-6)


def test_max_tokens_batches_respect_the_budget_and_are_a_function_of_the_step(bpe_run):
    run = Run.open(bpe_run[0])
    for step in range(6):
        (batch,) = run.train_batches(step)
        real = batch.target_out[:, 0] != 0  # rows of PAD only carry no labels
        rows = int(real.sum())
        assert rows * max(batch.source.shape[1], batch.target_in.shape[1]) <= 96
        # Padding included, the rows of PAD too: the budget is the batch's whole shape.
        assert batch.source.shape[0] * max(batch.source.shape[1], batch.target_in.shape[1]) <= 96
        (again,) = Run.open(bpe_run[0]).train_batches(step)
        for a, b in zip(batch, again, strict=True):
            np.testing.assert_array_equal(a, b)


BUDGET = 60  # --max-tokens of the accumulating runs below: characters give their micro-batches several shapes
# Lengths rounded to 16 (or the cap, 24): two shapes, (3, 16) and (2, 24), mixed in the first
# update; one compiled micro-step fewer than at the default multiple's three lengths.
LENGTH_MULTIPLE = 16


def budget_args(corpus, out, steps):
    return text_args(corpus, out, "--tokenizer", "char", "--max-tokens", str(BUDGET), "--accumulate", "2",
                     "--length-multiple", str(LENGTH_MULTIPLE), "--steps", str(steps), "--save-every", "2",
                     "--eval-every", "100")


@pytest.fixture(scope="module")
def accumulating_run(corpus, tmp_path_factory):
    """A `--max-tokens 60 --accumulate 2` run of 4 updates, with every batch its trainer's
    compiled steps were fed: [(step name, source shape, target shape)], and how often each of
    its accumulation steps was traced (compiled): {name: count}."""
    fed = []
    init = Trainer.__init__

    def recording(name, step):
        def call(state, *args):  # the batch is the last argument of every train step
            fed.append((name, tuple(args[-1].source.shape), tuple(args[-1].target_in.shape)))
            return step(state, *args)
        return call

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for name in ("train_step", "add_micro_batch"):
            if hasattr(self, name):
                setattr(self, name, recording(name, getattr(self, name)))

    # Traces of the steps this run jits, counted on wrappers of its own: jit's cache is shared by
    # every jit of the same function, so another test's trainer in this worker would count there.
    traces = {"add_micro_batch": 0, "apply_gradient_sums": 0}

    def traced(name, step):
        @functools.wraps(step)
        def call(*args, **kwargs):
            traces[name] += 1
            return step(*args, **kwargs)
        return call

    out = tmp_path_factory.mktemp("accumulate") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "__init__", recording_init)
        for name in traces:
            patch.setattr(f"flaxformer_mini.train.trainer.{name}", traced(name, getattr(trainer_module, name)))
        proc = cli(*budget_args(corpus, out, 4))
    assert proc.returncode == 0, proc.stderr
    return out, fed, traces


def test_max_tokens_with_accumulate_feeds_every_micro_batch_in_its_own_shape_within_the_budget(accumulating_run):
    out, fed, traces = accumulating_run
    micro = [b for step in range(4) for b in Run.open(out).train_batches(step)]
    shapes = [(b.source.shape, b.target_in.shape) for b in micro]
    assert any(len({shapes[i], shapes[i + 1]}) == 2 for i in range(0, 8, 2)), f"no update mixes shapes: {shapes}"
    # Each micro-batch reaches the compiled step as it is, PAD rows included: rows * max(S, T)
    # within the budget (stacking padded (50, 8) and (16, 24) to (2, 50, 24), 3x the budget).
    assert [(s, t) for _, s, t in fed] == shapes
    assert {name for name, _, _ in fed} == {"add_micro_batch"}
    assert all(s[0] * max(s[1], t[1]) <= BUDGET for _, s, t in fed), fed
    # One program per micro-batch shape, as a run without --accumulate compiles; one update program.
    assert traces == {"add_micro_batch": len(set(shapes)), "apply_gradient_sums": 1}


def test_accumulating_micro_batches_equals_one_step_on_their_union(accumulating_run):
    # Trainer.accumulate (what `train --accumulate` runs: each micro-batch in its own shape)
    # against one train step on the two micro-batches' union. One trainer for both, so each
    # program compiles once.
    run = Run.open(accumulating_run[0])
    a, b = next(m for m in (list(run.train_batches(step)) for step in range(4)) if m[0].source.shape != m[1].source.shape)
    # The union: both padded with PAD to the longer lengths (masked keys, labels that do not
    # count, causally after every real position) and concatenated along the rows.
    s, t = max(a.source.shape[1], b.source.shape[1]), max(a.target_in.shape[1], b.target_in.shape[1])
    union = type(a)(*(np.concatenate([np.pad(x, ((0, 0), (0, n - x.shape[1]))) for x in pair])
                      for pair, n in zip(zip(a, b), (s, t, t))))
    config = run.config.model.replace(dropout=0.0)  # with dropout the keys differ (micro-batch j's are its own)
    # eps=1: Adam's first step is ~lr * sign(g) at the paper's eps=1e-9, which turns a float32
    # rounding difference in a near-zero gradient into a full lr-sized step.
    trainer = Trainer(fm.Transformer.from_config(config, rngs=nnx.Rngs(0)), TrainConfig(warmup_steps=3, eps=1.0))
    with jax.default_matmul_precision("highest"):
        one, m1 = trainer.train_step(trainer.init_state(), union)
        many, m2 = trainer.accumulate(trainer.init_state(), [a, b])
    # 1e-6: float32 sums of the same terms in another order (two micro-batches, then their
    # sum; one reduction over the union), and PAD keys weighted exp(-1e20) = 0 exactly.
    chex.assert_trees_all_close(many.params, one.params, atol=1e-6, rtol=0)
    for key in ("loss", "tokens", "token_accuracy", "grad_norm"):
        assert float(m2[key]) == pytest.approx(float(m1[key]), abs=1e-6), key
    assert float(m2["tokens"]) == np.sum(union.target_out != 0) and int(many.step) == 1
    assert max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), many.params,
                                            trainer.init_state().params))) > 1e-3  # the update did move them


def test_a_max_tokens_accumulate_run_stopped_at_a_checkpoint_resumes_bit_identical(accumulating_run, corpus, tmp_path):
    # A resumed run draws the --max-tokens batches the uninterrupted one drew at the same
    # steps, in the same order, with the same tokenizer: the end states are equal bit for bit.
    # Stopped after a checkpoint as an interrupted run is (tests/test_train_cli.py kills runs
    # with Ctrl-C, SIGTERM and SIGKILL and resumes them): what `kill -9` leaves after step 2's
    # checkpoint, not a second run trained; in this process, which compiled each batch shape
    # for the uninterrupted run. (The same without --accumulate has no test of its own: the
    # token batches and their resume are the same code; the plain step's resume is
    # test_train_cli's.)
    out = killed_before_its_last_checkpoint(accumulating_run[0], tmp_path / "stopped")
    resumed = cli(*budget_args(corpus, out, 4))
    assert resumed.returncode == 0 and f"resuming {out} from step 2" in resumed.stderr, resumed.stderr
    (s1, a), (s2, b) = latest_state(accumulating_run[0]), latest_state(out)
    assert s1 == s2 == 4
    assert_same_training_state(a, b)


def test_a_max_tokens_accumulate_run_on_two_devices_counts_updates_and_batches_by_the_budget(corpus, tmp_path):
    # --batch-size 3 sets only the evaluation's batches under --max-tokens (a note says so), so the
    # 2 devices need not divide it. That such a run's numbers equal one device's: test_multiprocess.
    from simulated_devices import worker_env

    out = tmp_path / "r"
    proc = run_process(*text_args(corpus, out, "--max-tokens", "60", "--accumulate", "2", "--batch-size", "3",
                                  "--devices", "2", "--steps", "2"), env=worker_env(2))
    assert proc.returncode == 0, proc.stderr
    assert "--max-tokens 60 wins" in proc.stderr
    assert "on 2 cpu device(s), mesh data=2, replicated sharding" in proc.stderr
    assert latest_state(out)[0] == 2  # optimizer updates, not micro-batches
    micro = list(Run.open(out).train_batches(0))
    assert len(micro) == 2 and all(b.source.shape[0] > 3 for b in micro)  # rows from the budget, not --batch-size


# ----------------------------------------------------------------------------- bad input


def test_vocab_size_smaller_than_the_alphabet_is_refused_naming_both(corpus, tmp_path):
    proc = cli(*text_args(corpus, tmp_path / "r", "--tokenizer", "char", "--vocab-size", "8", "--steps", "2"))
    assert proc.returncode == 2
    alphabet = len(set("".join(line.replace("\t", " ") for line in corpus_lines(["--valid", str(corpus[0])]))))
    assert "vocab_size=8 is smaller than" in proc.stderr and str(alphabet + 4) in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_max_tokens_smaller_than_the_longest_example_is_refused_naming_its_line(corpus, tmp_path):
    # A long pair on line 31: named by file:line and the start of its source, not in full.
    train = tmp_path / "train.tsv"
    long_source = "sun cat " * 10  # 20 words: fits --max-len 24, not --max-tokens 16
    train.write_text("".join(corpus[0].read_text().splitlines(True)[:30]) + f"{long_source.strip()}\tcat\n")
    proc = cli(*text_args((train, corpus[1]), tmp_path / "r", "--max-tokens", "16", "--steps", "2"))
    assert proc.returncode == 2
    shown = long_source[:60] + "..."
    assert (f"--max-tokens 16 is smaller than the longest example ({train}:31: the pair whose source is {shown!r}: "
            f"source 21, target 2 tokens, 24 padded); raise --max-tokens to at least 24") in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists() or not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize("changed, named", [(["--tokenizer", "unigram", "--vocab-size", "40"], "data.tokenizer (--tokenizer): 'bpe' in the run, 'unigram' now"),
                                            (["--tokenizer", "bpe", "--vocab-size", "50"], "data.tokenizer_vocab_size (--vocab-size): 40 in the run, 50 now")])
def test_resuming_with_another_tokenizer_or_vocab_size_is_refused_naming_both(bpe_run, changed, named):
    out, args = bpe_run
    before = (out / "config.json").read_bytes()
    at = args.index("--tokenizer")
    proc = cli(*args[:at], *changed, *args[at + 4 :], "--steps", "12")
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr
    assert (out / "config.json").read_bytes() == before


def test_a_hand_edited_tokenizer_file_is_refused_naming_it(bpe_run, tmp_path):
    import shutil

    out = tmp_path / "r"
    shutil.copytree(bpe_run[0], out)
    path = out / "tokenizer_target.json"
    edited = path.read_text().replace('"a"', '"@"', 1)
    assert edited != path.read_text()
    path.write_text(edited)
    for proc in (cli("evaluate", "--checkpoint", str(out)), cli("generate", "--checkpoint", str(out), "the cat")):
        assert proc.returncode == 2 and "tokenizer_target.json differs from the file this run wrote" in proc.stderr


def test_a_missing_tokenizer_file_is_named(bpe_run, tmp_path, capsys):
    import shutil

    out = tmp_path / "r"
    shutil.copytree(bpe_run[0], out)
    (out / "tokenizer_target.json").unlink()
    proc = cli("evaluate", "--checkpoint", str(out))
    assert proc.returncode == 2 and "tokenizer_target.json: the run's tokenizer is missing" in proc.stderr
    # Its weights still export, recording no tokenizers (and saying why).
    from parity.cli import main as parity_main
    from parity.file_kinds import read_recorded_tokenizers

    exported = tmp_path / "weights.safetensors"
    assert parity_main(["convert", str(out), str(exported)]) == 0
    assert "tokenizer_target.json: the run's tokenizer is missing" in capsys.readouterr().err
    assert exported.exists() and read_recorded_tokenizers(exported) is None


@pytest.mark.parametrize("kind, remedy", [("bpe", "or resume training with the same --data, which rebuilds it"),
                                          ("unigram", "a unigram tokenizer is seldom rebuilt identically")])
def test_a_missing_tokenizer_says_whether_resuming_rebuilds_it(tmp_path, kind, remedy):
    # Rebuilt on resume, a bpe tokenizer is byte for byte the recorded one; a unigram one seldom
    # is (docs/data.md), and resuming refuses one that differs: restoring the file is the remedy.
    from flaxformer_mini.runs.config import DataConfig

    with pytest.raises(FileNotFoundError, match=f"tokenizer_source.json: the run's tokenizer is missing; "
                                                f"restore it \\({remedy}"):
        RunDir(tmp_path).load_vocabularies(DataConfig(kind="tsv", tokenizer=kind, tokenizer_vocab_size=40))


def test_accumulate_zero_is_refused_by_name(corpus, tmp_path):
    proc = cli(*text_args(corpus, tmp_path / "r", "--accumulate", "0"))
    assert proc.returncode == 2 and "--accumulate must be >= 1" in proc.stderr


# --- fine-tuning on a new corpus with an earlier run's tokenizers: --tokenizer-from RUN ---------


def test_a_run_fine_tuned_from_a_runs_weights_with_tokenizer_from_numbers_tokens_as_that_run(bpe_run, tmp_path,
                                                                                               monkeypatch):
    """The new corpus alone would train other subwords, so other ids for the embedding rows the
    weights hold; --tokenizer-from takes the earlier run's files (and kind, size, sharing), and a
    resume checks RUN where it is now: moved with the same files (a note), another run's, a path
    that is not there, or no option (refused, nothing written); its own copies missing (copied
    again); RUN gone (a note)."""
    import shutil

    from parity.cli import main as parity_main

    source = tmp_path / "source"
    shutil.copytree(bpe_run[0], source)
    weights = tmp_path / "weights.safetensors"
    assert parity_main(["convert", str(source), str(weights)]) == 0
    # 7 held-out pairs, of the lengths of bpe_run's: its evaluation's compiled programs serve this run's too.
    new = write_corpus(tmp_path / "new.tsv", 30, reverse_words=False), write_corpus(tmp_path / "new_valid.tsv", 7)
    out = tmp_path / "tuned"
    args = text_args(new, out, "--max-tokens", "96", *BPE_LENGTHS, "--init-from", str(weights))
    proc = cli(*args, "--tokenizer-from", str(source), "--steps", "1")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    names = ("tokenizer_source.json", "tokenizer_target.json")
    for name in names:
        assert (out / name).read_bytes() == (source / name).read_bytes()
        assert RunDir(out).recorded_checksums()[name] == RunDir(source).recorded_checksums()[name]
    data = json.loads((out / "config.json").read_text())["data"]
    assert (data["tokenizer"], data["tokenizer_vocab_size"], data["shared_vocab"], data["tokenizer_from"]) == \
        ("bpe", 40, False, str(source))
    # The rest starts and resumes runs (or refuses to) without training: what is checked is
    # decided before the first step.
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    moved = tmp_path / "moved_source"
    shutil.copytree(source, moved)
    proc = cli(*args, "--tokenizer-from", str(moved), "--steps", "2")
    assert proc.returncode == 0 and f"--tokenizer-from {moved} holds the tokenizers the run started from" in proc.stderr
    other = tmp_path / "other"  # the new corpus's own subwords, as many: the same kind and size
    assert cli(*text_args(new, other, "--tokenizer", "bpe", "--vocab-size", "40", "--max-tokens", "96")).returncode == 0
    assert (other / names[0]).read_bytes() != (source / names[0]).read_bytes()
    before = (out / "config.json").read_bytes()
    for given, named in ((other, "its tokenizers are not the ones the run in"), (None, "data.tokenizer_from (--tokenizer-from)"),
                         (tmp_path / "typo", "typo: no such directory")):
        proc = cli(*args, *(["--tokenizer-from", str(given)] if given else []), "--steps", "4")
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr
        assert "data.tokenizer:" not in proc.stderr  # the settings that come with RUN are not listed apart
    # Only --max-len differs from the weights': the vocabularies, RUN's, are not blamed.
    proc = cli(*text_args(new, tmp_path / "longer", "--max-tokens", "96", "--init-from", str(weights), "--max-len", "30",
                          "--tokenizer-from", str(source)))
    assert proc.returncode == 2 and "max_len 30" in proc.stderr and "--max-len 24" in proc.stderr, proc.stderr
    assert "not the ones these weights were trained with" not in proc.stderr
    assert (out / "config.json").read_bytes() == before
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1  # the one real step

    (out / names[0]).unlink()
    proc = cli(*args, "--tokenizer-from", str(other), "--steps", "4")  # not to be copied in: another run's
    assert proc.returncode == 2 and "its tokenizers are not the ones the run in" in proc.stderr \
        and f"whose copies the run lacks ({names[0]})" in proc.stderr, proc.stderr
    proc = cli(*args, "--tokenizer-from", str(moved), "--steps", "4")  # copied again from the recorded place only
    assert proc.returncode == 2 and f"lacks its own copies of its tokenizers ({names[0]}), and --tokenizer-from {moved} " \
        f"is not where the run recorded that run" in proc.stderr, proc.stderr
    proc = cli(*args, "--tokenizer-from", str(source), "--steps", "4")
    assert proc.returncode == 0 and f"copied them again from --tokenizer-from {source}" in proc.stderr, proc.stderr
    assert (out / names[0]).read_bytes() == (source / names[0]).read_bytes()
    shutil.rmtree(source)
    proc = cli(*args, "--tokenizer-from", str(source), "--steps", "4")
    assert proc.returncode == 0 and f"--tokenizer-from {source} is gone; the run resumes with its own copies" in proc.stderr

    # A run that trained its own tokenizers, written with the option (data.tokenizer_from: null) or
    # before it (no such key, which the config check passes over), is not resumed with RUN's.
    older = tmp_path / "older"
    shutil.copytree(other, older)
    config = json.loads((older / "config.json").read_text())
    del config["data"]["tokenizer_from"], config["checksums"]["config"]  # a run from before config.json's checksum
    (older / "config.json").write_text(json.dumps(config))
    for run in (other, older):
        proc = cli(*text_args(new, run, "--max-tokens", "96", "--tokenizer-from", str(moved)))
        assert proc.returncode == 2 and "trained its own tokenizers on its --data" in proc.stderr, proc.stderr

    # The exported weights record the run's tokenizers; a run's are checked against them. Trained
    # again on RUN's corpus with RUN's options, they are RUN's: nothing to warn of.
    from parity.file_kinds import read_recorded_tokenizers, safetensors_header
    from safetensors.numpy import load_file, save_file

    recorded = {name: RunDir(out).recorded_checksums()[name] for name in names}
    assert read_recorded_tokenizers(weights) == recorded
    # Every later conversion carries the record on: to Flax (a file, an orbax directory), back to torch.
    from parity.init_weights import recorded_tokenizers

    for step, (source_file, target) in enumerate([(weights, tmp_path / "flax.safetensors"), (weights, tmp_path / "flax_dir"),
                                                  (tmp_path / "flax.safetensors", tmp_path / "again.safetensors")]):
        assert parity_main(["convert", str(source_file), str(target)]) == 0
        assert recorded_tokenizers(target) == recorded, (step, target)
    proc = cli(*bpe_run[1], "--init-from", str(weights), "--out", str(tmp_path / "same"), "--steps", "1")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    # Weights recording other tokenizers (a planted record): refused beside --tokenizer-from,
    # warned of beside tokenizers trained on --data.
    planted = tmp_path / "planted.safetensors"
    metadata = safetensors_header(weights)[0]
    save_file(load_file(weights), planted, metadata={**metadata, "tokenizers": json.dumps({n: "0" * 64 for n in names})})
    proc = cli(*text_args(new, tmp_path / "refused", "--max-tokens", "96", "--init-from", str(planted),
                          "--tokenizer-from", str(moved)))
    assert proc.returncode == 2 and "its weights were trained with other tokenizers than those of --tokenizer-from" \
        in proc.stderr, proc.stderr
    assert not (tmp_path / "refused").exists()
    proc = cli(*bpe_run[1], "--init-from", str(planted), "--out", str(tmp_path / "warned"), "--steps", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: --init-from {planted} records the tokenizers its weights were trained with" in proc.stderr
    # A file that records none (a .pt, or torch's own export): the warning says what cannot be checked.
    torch_file = tmp_path / "unrecorded.safetensors"
    save_file(load_file(weights), torch_file)
    proc = cli(*bpe_run[1], "--init-from", str(torch_file), "--out", str(tmp_path / "unrecorded"), "--steps", "1")
    assert proc.returncode == 0 and "warning: this run's tokenizers are trained on" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", [["--tokenizer", "unigram", "--vocab-size", "40", "--shared-vocab"], ["--tokenizer", "word"]])
def test_tokenizer_from_copies_the_runs_files_byte_for_byte(corpus, tmp_path, monkeypatch, kind):
    """A unigram file written again from memory may differ from the one read in a float's last
    digit (run_dir.comparable_tokenizer_bytes): the copies are the files themselves."""
    from flaxformer_mini.runs.directory import tokenizer_bytes

    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)  # the files are written before training
    run, new = tmp_path / "run", tmp_path / "new"
    # 30 pairs: a unigram vocabulary whose scores do not all read back exactly (of 60, they do).
    corpus = write_corpus(tmp_path / "train.tsv", 30), corpus[1]
    assert cli(*text_args(corpus, run, *kind)).returncode == 0
    proc = cli(*text_args(corpus, new, "--tokenizer-from", str(run)))
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in run.glob("*.json") if p.name != "config.json")
    if "unigram" in kind:
        assert files == ["tokenizer_shared.json"]
        # The premise: written again from what was read, the file would differ.
        assert tokenizer_bytes(tokenizers.load(run, "unigram", "shared")) != (run / files[0]).read_bytes()
    else:
        assert files == ["vocab_source.json", "vocab_target.json"]
    for name in files:
        assert (new / name).read_bytes() == (run / name).read_bytes()
        assert RunDir(new).recorded_checksums()[name] == RunDir(run).recorded_checksums()[name]


@pytest.mark.parametrize("extra, named", [
    (["--tokenizer", "bpe"], "--tokenizer cannot go with --tokenizer-from"),
    (["--vocab-size", "40", "--shared-vocab"], "--vocab-size and --shared-vocab cannot go with --tokenizer-from"),
])
def test_tokenizer_options_beside_tokenizer_from_are_refused_by_name(corpus, tmp_path, extra, named):
    proc = cli(*text_args(corpus, tmp_path / "r", "--tokenizer-from", str(tmp_path), *extra))
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_tokenizer_from_a_directory_without_a_text_runs_tokenizers_is_refused_by_name(corpus, bpe_run, tmp_path,
                                                                                      monkeypatch):
    synthetic = tmp_path / "synthetic"
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)  # its config.json is all that is needed
    assert cli("train", "--task", "copy", "--preset", "tiny", "--steps", "1", "--out", str(synthetic)).returncode == 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.pt").write_bytes(b"")
    for run, named in ((tmp_path / "nowhere", "no such directory"), (tmp_path / "empty", "not a run directory"),
                       (tmp_path / "weights.pt", "a file, not a run's directory"),
                       (bpe_run[0] / "checkpoints", f"not a run directory (no config.json); it is part of the run {bpe_run[0]}: give that"),
                       (synthetic, "a synthetic run (--task copy) has no tokenizers")):
        proc = cli(*text_args(corpus, tmp_path / "r", "--tokenizer-from", str(run), "--steps", "1"))
        assert proc.returncode == 2 and f"--tokenizer-from {run}: {named}" in proc.stderr, proc.stderr
        assert not (tmp_path / "r").exists()
    proc = cli("train", "--task", "copy", "--tokenizer-from", str(synthetic), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "--tokenizer-from goes with --data" in proc.stderr


def test_valid_naming_the_training_file_is_warned_of_and_allowed(corpus, tmp_path, monkeypatch):
    # Allowed (a check that the model can fit the data at all), but never silently: its scores
    # are on pairs it trains on. Another spelling of the path is the same file. The warning and
    # the run's start come before its first step: no step is taken here.
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    train, _ = corpus
    other_spelling = f"{train.parent}/./{train.name}"  # a str: pathlib would drop the "."
    proc = cli(*text_args((train, other_spelling), tmp_path / "r", "--steps", "1"))
    assert proc.returncode == 0, proc.stderr
    assert (f"warning: --valid {other_spelling} is the --data file: the held-out scores are on pairs it trains on"
            in proc.stderr)


@pytest.mark.parametrize(("kind", "shared"), [("unigram", False), ("bpe", True), ("word", False)])
def test_a_tokenizer_that_learns_fewer_tokens_than_asked_is_said_with_the_sizes(corpus, tmp_path, kind, shared):
    from flaxformer_mini.runs.config import DataConfig, TrainOptions

    train, _ = corpus
    notes = []
    data = DataConfig(kind="tsv", max_len=23, train_path=str(train), tokenizer=kind, tokenizer_vocab_size=500,
                      shared_vocab=shared)
    run = Run.start(tmp_path / "run", TrainOptions(preset="tiny"), data, echo=notes.append)
    run.close()
    sizes = [len(v) for v in run.data.vocabs][: 1 if shared else 2]
    assert max(sizes) < 500  # nine short phrases: far fewer tokens than asked
    sides = ["shared"] if shared else ["source", "target"]
    said = ", ".join(f"{n} ({side})" for n, side in zip(sizes, sides))
    assert (f"note: --vocab-size 500 asked for, the {kind} tokenizer learnt {said}: all the training text gave it; "
            f"the model's vocabulary is that size") in notes
    assert run.config.model.source_vocab_size == sizes[0]
    # A run taking those tokenizers with --tokenizer-from trains none and was asked no size: no note.
    taken = dataclasses.replace(data, tokenizer_from=str(tmp_path / "run"))
    notes.clear()
    Run.start(tmp_path / "taken", TrainOptions(preset="tiny"), taken, echo=notes.append).close()
    assert not [note for note in notes if "asked for" in note], notes
