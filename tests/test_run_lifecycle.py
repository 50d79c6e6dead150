"""A run's lifecycle beyond the happy path: old run directories, option ranges checked before
anything is written, SIGTERM, dropped pairs, evaluation independent of the batch size, and
decoding that leaves the caller's model alone."""

import hashlib
import json
import math
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.decode import search
from flaxformer_mini.decode.search import greedy_decode, sample
from flaxformer_mini.runs.evaluate import evaluate_run
from flaxformer_mini.runs.directory import RunDir
from helpers import (TINY_RUN, assert_same_training_state, checkpoint_steps, cli, damage, latest_state, run_process, start,
                     wait_for_checkpoint)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lifecycle") / "run"
    proc = cli("train", *TINY_RUN, "--steps", "20", "--save-every", "20", "--eval-sequences", "23", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_run_trained_with_no_plot_has_its_metrics_and_no_loss_png(tiny_run):
    assert "--no-plot" in TINY_RUN
    assert [r["step"] for r in RunDir(tiny_run).read_metrics() if "loss" in r] == [5, 10, 15, 20]
    assert not (tiny_run / "loss.png").exists()


def test_evaluate_scores_the_same_sequences_at_any_batch_size(tiny_run):
    # None: the run's batch size, 8 (23 = 2 x 8 + 7); 7: a short last batch of 2; 5000: one batch.
    # 7 and 1: batch sizes the generate tests below decode at too, so each shape compiles once.
    results = [evaluate_run(tiny_run, batch_size=b) for b in (None, 1, 7, 5000)]
    for r in results[1:]:
        # Same 23 sequences: exact match is a count over them, so it is equal exactly; the loss
        # is summed in another order of float32 batch sums (~1e-7 relative apart).
        assert r["exact_match"] == results[0]["exact_match"]
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)


def test_a_short_last_evaluation_batch_is_padded_to_the_first_batchs_shape(tiny_run, monkeypatch):
    # As `generate` pads its last batch: the eval step and the decoder see one shape (one
    # compilation), and the padding rows count nowhere (the test above: the same scores at
    # any batch size).
    from flaxformer_mini.decode import evaluation
    from flaxformer_mini.runs.run import Run

    run = Run.open(tiny_run)
    batches = run.eval_batches(7)
    assert [len(b.source) for b in batches] == [7, 7, 7, 2]  # 23 sequences
    shapes, eval_step, decode = [], run.trainer.eval_step, evaluation.decode
    monkeypatch.setattr(run.trainer, "eval_step", lambda state, b: shapes.append(("eval", b.source.shape)) or eval_step(state, b))
    monkeypatch.setattr(evaluation, "decode",
                        lambda model, source, *a, **k: shapes.append(("decode", source.shape)) or decode(model, source, *a, **k))
    evaluation.evaluate(run.trainer, run.latest_state(), batches)
    S = batches[0].source.shape[1]
    assert len(shapes) == 8 and set(shapes) == {("eval", (7, S)), ("decode", (7, S))}


# The decoding tests' model: one layer a side, since sampling and a model's mode do not depend
# on depth and a second layer doubles each decoding loop's compilation (helpers.TINY_RUN).
DECODED = fm.get_preset("tiny").replace(num_layers=1)


def test_decoding_leaves_the_callers_model_in_its_mode_and_decodes_in_eval_mode():
    model = fm.Transformer.from_config(DECODED, rngs=nnx.Rngs(0))
    model.train()
    # The source and length of the sampling test's greedy decoding below: one compiled loop for both.
    source = jnp.array([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]])
    in_training = np.asarray(greedy_decode(model, source, 8))
    dropouts = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Dropout)]
    assert dropouts and all(not m.deterministic for m in dropouts)
    # The eval-mode view kept for the training structure is the one eval() makes, and decodes
    # what the model in eval mode decodes (in train mode its dropout would draw masks).
    eval_graphdef, state = search.eval_split(model)
    model.eval()
    assert search.eval_split(model)[0] == eval_graphdef == nnx.graphdef(model)
    assert jax.tree.structure(state) == jax.tree.structure(nnx.state(model))
    np.testing.assert_array_equal(in_training, np.asarray(greedy_decode(model, source, 8)))
    model.train()
    np.testing.assert_array_equal(in_training, np.asarray(greedy_decode(model, source, 8)))
    assert all(not m.deterministic for m in dropouts)


def tiny_model():
    model = fm.Transformer.from_config(DECODED, rngs=nnx.Rngs(3))
    model.eval()  # NNX's eval() switches in place and returns None
    return model


def test_sampling_near_zero_temperature_is_greedy():
    model, source = tiny_model(), jnp.array([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]])
    greedy = np.asarray(greedy_decode(model, source, 8))
    for seed in range(3):
        np.testing.assert_array_equal(np.asarray(sample(model, source, 8, temperature=1e-45, seed=seed)), greedy)


def test_top_k_holds_at_infinite_temperature():
    # One new token for 60 rows of one source (each row draws its own token, as 60 seeds would,
    # in one call): an infinite temperature flattens the distribution, and top-k must still
    # restrict it to the k most likely first tokens (both of which appear).
    model, source = tiny_model(), jnp.array([[5, 6, 7, 8, 2]])
    # One compiled forward pass: run eagerly, each of its operations compiles on its own (89 programs).
    logits = nnx.jit(lambda m, s, t: m(s, t))(model, source, jnp.array([[fm.data.BOS]]))[0, 0]
    top2 = set(np.argsort(np.asarray(logits))[-2:].tolist())
    rows = jnp.repeat(source, 60, axis=0)
    drawn = set(np.asarray(sample(model, rows, 1, temperature=math.inf, top_k=2, seed=0))[:, 0].tolist())
    assert drawn == top2
    one = set(np.asarray(sample(model, rows[:5], 1, temperature=math.inf, top_k=1, seed=1))[:, 0].tolist())
    assert one == {int(np.argmax(logits))}


@pytest.mark.parametrize("option, value", [
    ("--clip-norm", "-1"), ("--clip-norm", "0"), ("--weight-decay", "-1"), ("--weight-decay", "nan"),
    ("--lr", "nan"), ("--lr", "inf"), ("--lr", "0"), ("--seed", "-1"), ("--dropout", "1"), ("--max-len", "1"),
    ("--label-smoothing", "1"), ("--steps", "0"), ("--vocab-size", "4"),
])
def test_train_option_out_of_range_is_refused_by_name_before_anything_is_written(tmp_path, option, value):
    out = tmp_path / "run"
    proc = cli("train", *TINY_RUN, "--steps", "2", "--out", str(out), option, value)
    assert proc.returncode == 2
    assert f"{option} must be" in proc.stderr and value in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("option, value", [("--max-new-tokens", "0"), ("--temperature", "0"), ("--temperature", "-1"),
                                           ("--temperature", "nan"), ("--top-k", "0"), ("--beam-size", "0")])
def test_generate_option_out_of_range_is_refused_by_name(tiny_run, option, value):
    proc = cli("generate", "--checkpoint", str(tiny_run), option, value, "1 2")
    assert proc.returncode == 2
    assert f"{option} must be" in proc.stderr, proc.stderr


def test_clip_norm_none_turns_clipping_off(tmp_path, monkeypatch):
    # What the run records, written before its first step: no step is taken (an unclipped
    # optimizer's steps are test_training_parity's).
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    proc = cli("train", *TINY_RUN, "--steps", "2", "--clip-norm", "none", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert RunDir(tmp_path / "run").load_config().train.clip_norm is None


def test_pairs_longer_than_max_len_are_reported_and_add_no_words(tmp_path, monkeypatch):
    # The report and the vocabularies are written as the run starts, before its first step: no
    # step is taken (the text runs below train on the same vocabularies).
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    train = tmp_path / "train.tsv"
    long_source = " ".join(f"w{i}" for i in range(30))
    train.write_text(TEXT_PAIRS + f"{long_source}\tlongtarget\n")
    out = tmp_path / "run"
    proc = cli(*text_args(train, out), "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert ("1 training pair(s) longer than --max-len 8 allows (7 tokens plus EOS) were dropped (the longest had 30 "
            "tokens)") in proc.stderr
    source_words = json.loads((out / "vocab_source.json").read_text())["tokens"][4:]
    target_words = json.loads((out / "vocab_target.json").read_text())["tokens"][4:]
    assert sorted(source_words) == ["a", "b", "c"] and sorted(target_words) == ["x", "y", "z"]


def test_a_run_written_by_version_1_resumes_evaluates_and_generates(text_run):
    # Version 1 stored a text run's max_len as the model's (tokens + EOS); version 2 stores the
    # longest side in tokens. A version-1 run must go on as it was.
    out, args = text_run
    config = json.loads((out / "config.json").read_text())
    assert config["version"] == 2 and config["data"]["max_len"] == 7
    config["version"], config["data"]["max_len"] = 1, 8  # as version 1 wrote it
    # An rsqrt run's file shows the --lr it was made from (the default 3e-3), not the constant
    # schedule's learning_rate, which it never used. Files written before held the latter.
    assert config["train"]["peak_learning_rate"] == 3e-3 and "learning_rate" not in config["train"]
    del config["train"]["peak_learning_rate"]
    config["train"]["learning_rate"] = 1e-3
    # A text run's file leaves out the synthetic task's settings; files written before held
    # their defaults, which a text run never used.
    assert not {"task", "vocab_size", "min_len", "eval_sequences"} & set(config["data"])
    config["data"].update(task=None, vocab_size=16, min_len=1, eval_sequences=512)
    del config["checksums"]["config"]  # no version-1 file holds one
    (out / "config.json").write_text(json.dumps(config))
    resumed = cli(*args, "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and latest_state(out)[0] == 6
    assert cli("evaluate", "--checkpoint", str(out), "--json").returncode == 0
    gen = cli("generate", "--checkpoint", str(out), stdin=TEXT_INPUTS)
    assert gen.returncode == 0 and len(gen.stdout.splitlines()) == 4
    assert set(gen.stdout.split()) <= {"x", "y", "z", "<unk>"}


def test_a_second_train_into_the_same_out_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    args = [*TINY_RUN, "--steps", "100000", "--save-every", "5"]
    proc = start("train", *args, "--out", str(out))
    try:
        wait_for_checkpoint(out, 5, proc)
        # Paused, still holding its lock: it takes no core from the second train, and whatever
        # changes in the run's files from here is the second train's doing.
        proc.send_signal(signal.SIGSTOP)
        before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
        second = cli("train", *args, "--out", str(out))
        assert second.returncode == 2
        assert f"is being trained by process {proc.pid}" in second.stderr, second.stderr
        after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
        assert set(after) == set(before) and after[out / "config.json"] == before[out / "config.json"]
    finally:
        proc.kill()  # kill -9: the kernel releases its lock
        proc.wait()
    resumed = cli("train", *[a if a != "100000" else "12" for a in args], "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr


def test_generate_streams_many_inputs_in_input_order_with_bounded_batches(tiny_run, tmp_path):
    rng = np.random.default_rng(0)
    texts = [" ".join(map(str, rng.integers(0, 7, size=rng.integers(1, 6)))) for _ in range(300)]
    stdin = "".join(t + "\n" for t in texts)
    small = cli("generate", "--checkpoint", str(tiny_run), "--batch-size", "7", stdin=stdin)
    # 7: three chunks (of 112 lines at most); 50: one chunk, at the next test's batch size (one compiled decoder).
    large = cli("generate", "--checkpoint", str(tiny_run), "--batch-size", "50", stdin=stdin)
    assert small.returncode == 0 and large.returncode == 0, small.stderr + large.stderr
    assert small.stdout.splitlines() == large.stdout.splitlines()
    assert len(small.stdout.splitlines()) == 300
    # Each output is its own input's: decoding a few alone gives the same lines.
    for i in (0, 17, 299):
        alone = cli("generate", "--checkpoint", str(tiny_run), texts[i])
        assert alone.stdout.splitlines() == [small.stdout.splitlines()[i]]


def test_generate_holds_at_most_one_chunk_and_decodes_batch_size_rows(tiny_run, monkeypatch):
    # 5,000 inputs through the library: the decoder never sees more than batch_size rows, and
    # the input is consumed lazily, a chunk at a time (what bounds memory for 100k lines).
    from flaxformer_mini.decode import generation
    from flaxformer_mini.runs.generate import generate

    shapes, consumed = [], []
    real = generation.decode
    monkeypatch.setattr(generation, "decode", lambda model, source, *a, **k: shapes.append(source.shape) or real(model, source, *a, **k))

    def lines():
        for i in range(5000):
            consumed.append(i)
            yield "1 2 3"

    outputs = generate(tiny_run, lines(), batch_size=50)
    first = next(outputs)
    assert len(consumed) == generation.CHUNK_BATCHES * 50  # one chunk read, not the whole input
    rest = list(outputs)
    assert len(rest) + 1 == 5000 and all(o.text == first.text for o in rest)
    assert {s[0] for s in shapes} == {50} and len(shapes) == 100


def test_size_options_override_the_preset(tmp_path, monkeypatch):
    # The model the run records (and builds from), written before its first step: no step is taken.
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
    out = tmp_path / "run"
    proc = cli("train", *TINY_RUN, "--preset", "medium", "--embed-size", "24", "--heads", "3", "--layers", "1",
               "--ffn-dim", "40", "--steps", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    model = RunDir(out).load_config().model
    medium = fm.get_preset("medium")
    assert (model.embed_size, model.heads, model.num_layers, model.ffn_dim) == (24, 3, 1, 40)
    assert model.dropout == medium.dropout and medium.embed_size != 24


# The text runs of this file share one vocabulary (a b c -> x y z), batch size and --max-len
# (batches pad to it), so their train step, eval step and decoder compile once for all of them.
TEXT_PAIRS = "a b c\tx y z\nb c\ty z\nc a\tz x\na\tx\n" * 2
# Four lines for generate: one batch of the shape the runs evaluate (4 rows, --batch-size 4), one decoder.
TEXT_INPUTS = "a b\nb c\nc a\na\n"


def text_args(train, out, *extra):
    # One layer on each side and no loss.png, as tests/helpers.py's TINY_RUN (which says why).
    return ["train", "--data", str(train), "--out", str(out), "--preset", "tiny", "--layers", "1", "--batch-size", "4",
            "--max-len", "8", "--save-every", "3", "--eval-every", "3", "--no-progress", "--no-plot", *extra]


@pytest.fixture(scope="module")
def trained_text_run(tmp_path_factory):
    """DIR holding train.tsv (TEXT_PAIRS) and DIR/mt, its run of 3 steps: trained once for the
    file's text-run tests, each of which changes a copy of its own (``text_run``)."""
    d = tmp_path_factory.mktemp("text_run")
    train = d / "train.tsv"
    train.write_text(TEXT_PAIRS)
    proc = cli(*text_args(train, d / "mt"), "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.fixture
def text_run(trained_text_run, tmp_path):
    """(tmp_path/mt, its `train` arguments): the files training it there makes, tmp_path/train.tsv
    and the run reading it: a copy of ``trained_text_run`` with its config.json's data.train_path
    (outside the file's checksum) the copy's train.tsv, as the same command trains them."""
    train, out = tmp_path / "train.tsv", tmp_path / "mt"
    shutil.copy(trained_text_run / "train.tsv", train)
    shutil.copytree(trained_text_run / "mt", out)
    config = out / "config.json"
    text = config.read_text()
    recorded = json.dumps(str(trained_text_run / "train.tsv"))
    assert text.count(recorded) == 1, text
    config.write_text(text.replace(recorded, json.dumps(str(train))))
    assert json.loads(config.read_text())["data"]["train_path"] == str(train)
    return out, text_args(train, out)


def test_a_hand_edited_vocabulary_is_refused_naming_the_file(text_run):
    out, args = text_run
    vocab = json.loads((out / "vocab_target.json").read_text())
    vocab["tokens"][4], vocab["tokens"][5] = vocab["tokens"][5], vocab["tokens"][4]  # two words swapped
    (out / "vocab_target.json").write_text(json.dumps(vocab))
    for proc in (cli("generate", "--checkpoint", str(out), "a b"), cli("evaluate", "--checkpoint", str(out)),
                 cli(*args, "--steps", "6")):
        assert proc.returncode == 2
        assert "vocab_target.json differs from the file this run wrote" in proc.stderr, proc.stderr


def test_a_deleted_vocabulary_is_named_and_rebuilt_identically_on_resume(text_run):
    out, args = text_run
    original = (out / "vocab_source.json").read_bytes()
    (out / "vocab_source.json").unlink()
    gen = cli("generate", "--checkpoint", str(out), "a b")
    assert gen.returncode == 2 and "vocab_source.json: the run's vocabulary is missing" in gen.stderr
    resumed = cli(*args, "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert "rebuilt them from" in resumed.stderr and "identical to the recorded ones" in resumed.stderr
    assert (out / "vocab_source.json").read_bytes() == original
    assert cli("generate", "--checkpoint", str(out), stdin=TEXT_INPUTS).returncode == 0


def test_a_torn_metrics_line_is_dropped_with_a_warning_on_resume(text_run):
    out, args = text_run
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # a write cut short by a full disk
    resumed = cli(*args, "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert "metrics.jsonl" in resumed.stderr and "unreadable line dropped" in resumed.stderr
    text = (out / "metrics.jsonl").read_text()
    assert '"lo\n' not in text and '{"step": 4, "lo{' not in text  # the fragment is gone, not glued to a record
    assert all(isinstance(json.loads(line), dict) for line in text.splitlines())
    assert [r["step"] for r in RunDir(out).read_metrics() if "loss" in r][-1] == 6  # logging went on to the end


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    straight, out = tmp_path / "straight", tmp_path / "run"
    args = [*TINY_RUN, "--steps", "10", "--save-every", "5"]
    assert cli("train", *args, "--out", str(straight)).returncode == 0
    # A copy of it, not a second training: the resume from its step 5 must give its step 10 again.
    shutil.copytree(straight, out)
    damage(out / "checkpoints" / "10")
    evaluated = cli("evaluate", "--checkpoint", str(out), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "checkpoint 10 cannot be read" in evaluated.stderr and "using step 5" in evaluated.stderr
    assert "Traceback" not in evaluated.stderr and len(evaluated.stderr.splitlines()) == 1
    resumed = cli("train", *args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "moved to" in resumed.stderr and "resuming from step 5" in resumed.stderr
    assert [p.name.split(".")[0] for p in (out / "damaged_checkpoints").iterdir()] == ["10"]
    (s1, a), (s2, b) = latest_state(straight), latest_state(out)
    assert s1 == s2 == 10
    assert_same_training_state(a, b)
    # A step missing its item directory altogether: orbax, left to infer the item from the step
    # it reads, then turned to several items and read no step at all (the older one included).
    gone = tmp_path / "gone"
    shutil.copytree(straight, gone)
    shutil.rmtree(gone / "checkpoints" / "10" / "default")
    evaluated = cli("evaluate", "--checkpoint", str(gone), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "checkpoint 10 cannot be read" in evaluated.stderr and "using step 5" in evaluated.stderr


def test_every_checkpoint_damaged_is_one_clear_error(tiny_run, tmp_path):
    # A copy of the file's run, whose one checkpoint (step 20) is then damaged.
    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    assert checkpoint_steps(out) == [20]
    damage(out / "checkpoints" / "20")
    proc = cli("evaluate", "--checkpoint", str(out))
    assert proc.returncode == 2
    assert "can be read (step 20:" in proc.stderr and "Traceback" not in proc.stderr


def test_without_valid_a_fixed_part_of_the_training_file_is_held_out(tmp_path):
    # 200 distinct pairs in TEXT_PAIRS' words: the 5-word sequences over a b c, mapped to x y z.
    import itertools

    sources = [" ".join(words) for words in itertools.islice(itertools.product("abc", repeat=5), 200)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{s}\t{s.translate(str.maketrans('abc', 'xyz'))}\n" for s in sources))
    out = tmp_path / "run"
    proc = cli(*text_args(train, out), "--steps", "2", "--valid-size", "15")
    assert proc.returncode == 0, proc.stderr
    assert "evaluating on 15 of 15 held-out pairs from 15 training pairs held out (no --valid)" in proc.stderr
    from flaxformer_mini.runs.run import Run

    run = Run.open(out)
    assert len(run.data.train) == 185 and len(run.data.eval) == 15
    held = {tuple(row) for b in run.eval_batches(4) for row in b.source.tolist()}
    trained = {tuple(row) for b in [run.data.train.batch(0, s, 185) for s in range(1)] for row in b.source.tolist()}
    assert not held & trained  # no held-out pair is trained on


def test_a_run_records_absolute_data_paths_and_evaluates_from_anywhere_without_its_training_file(tmp_path,
                                                                                                  monkeypatch):
    # Started with relative paths; evaluated from another directory after the training file
    # moved: a --valid run's evaluation reads its vocabularies and the --valid file alone. A
    # held-out pair too long for --max-len is not decodable: it is left out, and said so.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "train.tsv").write_text(TEXT_PAIRS)
    # Four pairs that fit: one batch of --batch-size 4, the shape the other text runs here evaluate and decode.
    (work / "valid.tsv").write_text("a b\tx y\nc a\tz x\nb c\ty z\na\tx\n" + " ".join("abcabcabc") + "\tx\n")
    assert cli(*text_args("train.tsv", "run", "--valid", "valid.tsv"), "--steps", "3").returncode == 0
    data = json.loads((work / "run" / "config.json").read_text())["data"]
    assert (data["train_path"], data["valid_path"]) == (str(work / "train.tsv"), str(work / "valid.tsv"))

    (work / "train.tsv").rename(work / "moved.tsv")
    monkeypatch.chdir(tmp_path)
    hypotheses = tmp_path / "hyp.txt"
    proc = cli("evaluate", "--checkpoint", str(work / "run"), "--output", str(hypotheses))
    assert proc.returncode == 0, proc.stderr
    assert ("note: 1 of 5 held-out pairs are longer than the run's --max-len 8 allows and are not evaluated; "
            f"{hypotheses} holds a line for each of the 4 others, in order") in proc.stderr
    assert len(hypotheses.read_text().splitlines()) == 4


def test_a_run_that_recorded_relative_paths_resumes_from_its_directory(text_run, tmp_path, monkeypatch):
    # Runs written before paths were recorded absolute hold them as typed: the same command
    # from the same directory resumes, as it did.
    monkeypatch.chdir(tmp_path)
    out, args = text_run
    config = json.loads((out / "config.json").read_text())
    config["data"]["train_path"] = "train.tsv"
    (out / "config.json").write_text(json.dumps(config))
    resumed = cli(*text_args("train.tsv", out), "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert latest_state(out)[0] == 6


def test_a_training_file_changed_since_the_run_started_is_refused_on_resume(text_run, tmp_path):
    # Without --valid the held-out pairs come from the training file's lines: a shuffled or
    # edited file would resume silently, training on pairs it had held out.
    out, args = text_run
    recorded = json.loads((out / "config.json").read_text())["checksums"]["data.train_path"]
    train = tmp_path / "train.tsv"
    assert recorded == hashlib.sha256(train.read_bytes()).hexdigest()
    train.write_text("".join(reversed(TEXT_PAIRS.splitlines(keepends=True))))  # the same pairs, shuffled
    before = latest_state(out)
    proc = cli(*args, "--steps", "6")
    assert proc.returncode == 2, proc.stderr
    assert (f"error: {train} (data.train_path) has changed since the run in {out} started (sha256 "
            f"{hashlib.sha256(train.read_bytes()).hexdigest()[:12]}..., recorded {recorded[:12]}...): the held-out "
            f"pairs and every step's batch come from its lines.") in proc.stderr
    assert latest_state(out)[0] == before[0] == 3


def test_a_training_file_moved_with_the_same_contents_resumes_from_its_new_path(text_run, tmp_path):
    out, args = text_run
    moved = tmp_path / "elsewhere" / "pairs.tsv"
    moved.parent.mkdir()
    (tmp_path / "train.tsv").rename(moved)
    proc = cli(*text_args(moved, out), "--steps", "6")
    assert proc.returncode == 0, proc.stderr
    assert (f"note: the run's training file moved from {tmp_path / 'train.tsv'} to {moved} (the same contents, "
            f"by sha256); the run reads it there from now on") in proc.stderr
    assert json.loads((out / "config.json").read_text())["data"]["train_path"] == str(moved)
    assert latest_state(out)[0] == 6
    # A file of other contents at another path is another run's data: refused.
    moved.write_text(TEXT_PAIRS + "a\tx\n")
    other = tmp_path / "other.tsv"
    moved.rename(other)
    proc = cli(*text_args(other, out), "--steps", "8")
    assert proc.returncode == 2 and f"data.train_path: '{moved}' in the run, '{other}' now" in proc.stderr


def test_with_too_few_pairs_to_hold_out_the_run_says_it_evaluates_on_its_training_pairs(tmp_path):
    train = tmp_path / "train.tsv"
    # A tenth of 4 pairs is none; 4 pairs are one batch of --batch-size 4, the other text runs' shape.
    train.write_text("a b\tx y\nc a\tz x\nb c\ty z\na\tx\n")
    proc = cli(*text_args(train, tmp_path / "run"), "--steps", "1")
    assert proc.returncode == 0, proc.stderr
    assert ("evaluating on 4 of 4 training pairs themselves (no --valid, and too few pairs to hold a tenth out); "
            "--valid gives held-out pairs") in proc.stderr


def test_evaluation_during_training_reads_at_most_valid_size_pairs(tmp_path):
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train.write_text(TEXT_PAIRS)
    valid.write_text("a b\tx y\n" * 100)
    proc = cli(*text_args(train, tmp_path / "run"), "--valid", str(valid), "--steps", "2", "--valid-size", "10")
    assert proc.returncode == 0, proc.stderr
    assert "evaluating on 10 of 100 held-out pairs from --valid" in proc.stderr
    from flaxformer_mini.runs.run import Run

    run = Run.open(tmp_path / "run")
    assert sum(len(b.source) for b in run.eval_batches(limit=10)) == 10
    assert sum(len(b.source) for b in run.eval_batches()) == 100  # `evaluate` reads them all


def test_a_full_disk_during_a_checkpoint_save_keeps_the_previous_one(tmp_path, monkeypatch):
    # orbax reports a full disk as TensorStore's RESOURCE_EXHAUSTED; the second save fails so.
    import orbax.checkpoint as ocp

    real_save, saves = ocp.CheckpointManager.save, []

    def save(self, step, *args, **kwargs):
        saves.append(step)
        if len(saves) == 2:
            (self.directory / f"{step}.orbax-checkpoint-tmp").mkdir()  # what a cut-short save leaves
            raise ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device [os_error_code='28']")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    out = tmp_path / "run"
    proc = cli("train", *TINY_RUN, "--steps", "20", "--save-every", "5", "--out", str(out))
    assert proc.returncode == 1
    assert "no space left on the device" in proc.stderr and "last complete checkpoint is kept" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["5"]  # the half-written one is gone
    assert latest_state(out)[0] == 5
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    assert cli("train", *TINY_RUN, "--steps", "20", "--save-every", "5", "--out", str(out)).returncode == 0


def test_after_a_save_only_orbaxs_disk_full_aftermath_is_silenced(tmp_path, monkeypatch, caplog):
    # A full disk makes orbax's threads report it again and again, each with a traceback:
    # through the "absl" and "asyncio" loggers, sys.excepthook (TensorStore's threads calling
    # into a closed event loop), sys.unraisablehook (collected futures) and threading.excepthook.
    # Every other record and error must still come through.
    import logging
    import sys
    import threading

    from flaxformer_mini.train import checkpoint
    from flaxformer_mini.train.optimizer import TrainConfig
    from flaxformer_mini.train.trainer import Trainer

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(("except", str(value))))
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(("unraisable", str(info.exc_value))))
    for name in ("absl", "asyncio"):  # the filters added below go when the test ends
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    manager = checkpoint.open_manager(tmp_path / "ckpt")
    trainer = Trainer(fm.Transformer.from_config(fm.get_preset("tiny"), rngs=nnx.Rngs(0)), TrainConfig())
    checkpoint.save(manager, trainer.init_state())
    closed, other = RuntimeError("Event loop is closed"), RuntimeError("something else")
    for error in (closed, other):
        sys.excepthook(RuntimeError, error, None)
        sys.unraisablehook(type("Info", (), {"exc_value": error})())
    assert seen == [("except", "something else"), ("unraisable", "something else")]

    full = ValueError("RESOURCE_EXHAUSTED: Failed to write: No space left on device [os_error_code='28']")
    # A damaged file's abandoned reads, collected after the caller reported the failure (seen
    # after test_parity_faults' one-line error); another task's lost exception still shows.
    read = ValueError("OUT_OF_RANGE: Error opening \"zarr\" driver: ... [tensorstore_spec='{}']")
    with caplog.at_level(logging.ERROR):
        logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=(ValueError, full, None))
        logging.getLogger("absl").error("_SignalingThread.run() raised an exception: %s", full)
        logging.getLogger("asyncio").error("another failure", exc_info=(RuntimeError, other, None))
        logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task>",
                                           exc_info=(ValueError, read, None))
        logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task>",
                                           exc_info=(RuntimeError, other, None))
    assert [r.getMessage() for r in caplog.records] == ["another failure",
                                                         "Task exception was never retrieved\nfuture: <Task>"]
    assert caplog.records[1].exc_info[1] is other

    # The half-written checkpoint a full disk left is removed (_remove_partial) while orbax's
    # signalling threads still write into it: their FileNotFoundError, logged or raised in
    # the thread, is that removal's echo (a 54-line traceback, seen in 1 of 8 full-disk runs).
    caplog.clear()
    gone = FileNotFoundError(2, "No such file or directory", "/r/checkpoints/4.orbax-checkpoint-tmp-17/_METADATA")
    elsewhere = FileNotFoundError(2, "No such file or directory", "/r/metrics.jsonl")
    with caplog.at_level(logging.ERROR):
        logging.getLogger("absl").error("_SignalingThread.run() raised an exception: %s", gone, exc_info=(
            FileNotFoundError, gone, None))
        logging.getLogger("absl").error("_SignalingThread.run() raised an exception: %s", elsewhere, exc_info=(
            FileNotFoundError, elsewhere, None))
    assert [r.exc_info[1] for r in caplog.records] == [elsewhere]
    threads = []
    monkeypatch.setattr(threading, "excepthook", lambda args: threads.append(args.exc_value))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    del sys.unraisablehook._flaxformer_mini  # let the silencer install again over the recording hook
    checkpoint.silence_orbax_aftermath()
    for error in (gone, full, elsewhere):
        threading.excepthook(threading.ExceptHookArgs((type(error), error, None, None)))
    assert threads == [elsewhere]


def test_closed_loop_reports_while_a_damaged_checkpoints_error_propagates_are_silenced(tmp_path, monkeypatch):
    # TensorStore's threads report a damaged file's failed reads into orbax's closed event loop
    # (sys.unraisablehook) while the error is still on its way up, before any `except` runs:
    # the silencer must be in place before the first read. Installed only in the `except`, it
    # would let such reports through now and then under load (28 tracebacks after the one-line error).
    import sys

    from flaxformer_mini.train import checkpoint

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(str(info.exc_value)))
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(str(value)))

    def damaged_read(manager, template, step=None):
        report = type("Info", (), {"exc_value": RuntimeError("Event loop is closed")})()
        sys.unraisablehook(report)  # as a TensorStore thread does, mid-failure
        sys.excepthook(RuntimeError, report.exc_value, None)
        raise ValueError("OUT_OF_RANGE: Requested byte range [0, 7123) is not valid for value of size 50")

    monkeypatch.setattr(checkpoint, "restore", damaged_read)
    manager = type("Manager", (), {"directory": tmp_path, "all_steps": lambda self: [3]})()
    with pytest.raises(checkpoint.CheckpointError, match=r"step 3: OUT_OF_RANGE"):
        checkpoint.restore_latest_intact(manager, None)
    assert seen == []
    sys.unraisablehook(type("Info", (), {"exc_value": RuntimeError("something else")})())
    assert seen == ["something else"]  # every other report still comes through


def test_a_real_full_disk_ends_the_run_with_one_line_and_the_previous_checkpoint(tmp_path):
    # A 700 kB tmpfs holds one checkpoint of TINY_RUN's model (about 400 kB), not two. Mounting
    # needs root (as here and in CI); elsewhere the simulated test above covers the same path.
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        out = disk / "run"
        # TINY_RUN as the other runs here: this process reads its compiled steps from the cache
        # of the suite's subprocesses (tests/conftest.py).
        proc = run_process("train", *TINY_RUN, "--steps", "20", "--save-every", "5", "--out", str(out))
        assert proc.returncode == 1, proc.stderr
        assert "no space left on the device" in proc.stderr and "Traceback" not in proc.stderr
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["5"]
        assert cli("evaluate", "--checkpoint", str(out)).returncode == 0
    finally:
        subprocess.run(["umount", str(disk)], check=True)
