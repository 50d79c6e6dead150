"""What several test files share: plain functions and constants (fixtures are conftest.py's).
Test files import from here, never from one another (tests/ is on sys.path: ``from helpers
import cli``).

- the CLI as a user runs it: the tiny run's options, ``cli`` in this process, ``run_process``
  and ``start`` in processes of their own (``Lines`` reads their output as it comes), and what
  the run-lifecycle tests read back;
- text corpora for text runs, a damaged checkpoint, a disk that fills up midway;
- the import blocker of the isolation tests; the decoding tests' wide beam;
- multi-process launches: real processes on a free port, drained together.
"""

import contextlib
import errno
import io
import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import chex
import numpy as np

from simulated_devices import worker_env

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- the CLI

# The CLI as a process of its own; a multi-process run's processes share their compiled programs
# (tests/every_process_caches.py says how and why).
CLI = [sys.executable, "-m", "flaxformer_mini"]
MULTIPROCESS_CLI = [sys.executable, str(REPO / "tests" / "every_process_caches.py")]

# A run small enough for a test: the tiny preset on `copy` with short sequences, one layer on
# each side. These tests are about a run's life (its files, signals, resuming), not depth, and
# the suite is mostly XLA compilation: the tiny preset's second layer doubles it (the train
# step 1.2 s -> 2.3 s, AMD EPYC family 25). The model tests and parity keep two layers and more.
# Drawing loss.png costs about a second of CPU in a fresh process (matplotlib's import and first
# drawing; 0.3-0.7 s more in a warm one, AMD EPYC family 25 model 1): the runs that look at it
# draw it (PLOTTED_TINY_RUN), the others leave it out with --no-plot.
PLOTTED_TINY_RUN = ["--task", "copy", "--preset", "tiny", "--layers", "1", "--vocab-size", "11", "--max-len", "5",
                    "--batch-size", "8", "--warmup", "5", "--eval-sequences", "16", "--eval-every", "1000", "--log-every",
                    "5", "--no-progress"]
TINY_RUN = [*PLOTTED_TINY_RUN, "--no-plot"]
# Eight inputs for `generate` of a TINY_RUN run, as standard input: a batch of the held-out
# batch's rows (--batch-size 8), so generate decodes with the program the run's evaluations
# compiled.
TINY_RUN_INPUTS = "".join(f"{t}\n" for t in ["4 1 2", "5 3 6 2", "1", "0 0 4", "6 6", "2 6 5 1 3", "6", "3 0"])


def run_process(*args, env=None, stdin=None):
    """The CLI in a process of its own, as a user runs it (needed for signals and env)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True,
                          timeout=300, env=env, input=stdin)


def command_precision():
    """JAX's default matmul precision, the one a command runs under in a process of its own, in
    place of the parity precision the workers set on an accelerator (conftest; on a CPU they keep
    this one). A value computed in a test to be compared bit for bit with one a command wrote is
    computed under it too: on a GPU JAX's default allows TF32, and the parity precision does not."""
    import jax

    return jax.default_matmul_precision(None)


def cli(*args, stdin=""):
    """The CLI in this process: the same main(), without paying JAX's start-up and the
    compilation of every jitted function again for each call. ``stdin``: str or bytes.

    It runs under the command's precision (``command_precision``): a run trained here and one
    trained or resumed by ``start`` or ``run_process`` use the same matmul precision on every
    backend, and share their compiled programs through the suite's compilation cache, whose
    keys hold the precision."""
    from flaxformer_mini.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    # Bytes underneath, as a real standard input (generate reads sys.stdin.buffer).
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin if isinstance(stdin, bytes) else stdin.encode()), encoding="utf-8")
    try:
        with command_precision(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse errors
                code = e.code
    finally:
        sys.stdin = old_stdin
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def start(*args):
    """The CLI in a process of its own, left running (to be signalled)."""
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


LINES_TIMEOUT_S = 60


class Lines:
    """A child's output stream read line by line, failing after LINES_TIMEOUT_S: a line that
    never comes fails the test rather than hanging it. It reads the raw descriptor after select,
    so no line waits in a buffer that select cannot see."""

    def __init__(self, stream, proc):
        self.fd, self.proc, self.rest = stream.fileno(), proc, ""

    def wait_for(self, text):
        deadline = time.monotonic() + LINES_TIMEOUT_S
        while True:
            *lines, self.rest = self.rest.split("\n")
            for i, line in enumerate(lines):
                if text in line:
                    self.rest = "\n".join(lines[i + 1:] + [self.rest])
                    return line
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self.fd], [], [], left)[0], f"no {text!r} within {LINES_TIMEOUT_S} s"
            chunk = os.read(self.fd, 4096).decode()
            assert chunk, f"no {text!r}; the child exited {self.proc.wait()}"
            self.rest += chunk


def latest_state(out):
    from flaxformer_mini.runs.run import Run

    state = Run.open(out).latest_state()
    return int(state.step), state


def assert_same_training_state(a, b):
    # Bit for bit: the same tree structure and every parameter and Adam moment identical.
    chex.assert_trees_all_equal((a.params, a.opt_state), (b.params, b.opt_state))


def wait_for_checkpoint(out, at_least, proc, timeout=240):
    deadline = time.time() + timeout
    ckpts = out / "checkpoints"
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before checkpoint {at_least}: {proc.stderr.read()}")
        steps = [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []
        if steps and max(steps) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint {at_least} within {timeout}s")


def saved_step_in(stderr):
    """The step that a run stopped by a signal says it saved ("interrupted: saved step N; ...")."""
    return int(stderr.split("interrupted: saved step ")[1].split(";")[0])


def assert_exported_state_dict_computes_the_runs_logits(out, tmp_path):
    """`parity convert` of the run in ``out`` writes a state dict that torch_ref's Transformer
    loads strictly, keyed in its own order, and that computes the run's logits (parity tolerance)."""
    import jax.numpy as jnp
    import torch

    import torch_ref
    from conftest import ATOL, assert_close
    from flaxformer_mini.runs.run import Run
    from parity import sample_batch
    from parity.cli import main as parity_main

    exported = tmp_path / "exported.pt"
    assert parity_main(["convert", str(out), str(exported)]) == 0
    run = Run.open(out)
    state = run.latest_state()
    torch_model = torch_ref.Transformer(**run.config.model.to_dict()).eval()
    state_dict = torch.load(exported, weights_only=True)
    assert list(state_dict) == list(torch_model.state_dict())
    torch_model.load_state_dict(state_dict, strict=True)
    source, target = sample_batch(run.config.model, batch=3, seed=1)
    with torch.no_grad():
        torch_logits = torch_model(torch.as_tensor(source), torch.as_tensor(target))
    assert_close(run.trainer.model(state)(jnp.asarray(source), jnp.asarray(target)), torch_logits, ATOL)
    return int(state.step)


def untrained_run(out, num_layers=1, ema_decay=None):
    """A flaxformer-mini run in ``out`` (config.json and one checkpoint, of its initial state)
    of the tiny preset on `copy` with 5 heads (and a moving average with ``ema_decay``), as
    `parity` reads a trained one, made without compiling a train step."""
    from flaxformer_mini.runs.config import DataConfig, RunConfig, model_config_for
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.train import checkpoint
    from flaxformer_mini.train.optimizer import TrainConfig

    data = DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5, eval_sequences=16)
    model = model_config_for("tiny", 11, 11, data.model_max_len).replace(num_layers=num_layers)
    run = Run.create(out, RunConfig(model=model, train=TrainConfig(ema_decay=ema_decay), data=data, batch_size=8),
                     echo=lambda m: None)
    checkpoint.save(run.checkpoints(), run.initial_state())
    run.close()
    return Path(out)


# ----------------------------------------------------------------------------- text corpora

WORDS = ["the cat", "a dog", "sat on", "the mat", "red fox", "ran far", "big sun", "old tree", "blue sky"]


def write_corpus(path, n, reverse_words=True):
    """``n`` pairs: a phrase -> its words reversed (a task with an exact answer)."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(n):
        source = " ".join(WORDS[i] for i in rng.choice(len(WORDS), size=rng.integers(1, 3)))
        target = " ".join(source.split()[::-1]) if reverse_words else source
        lines.append(f"{source}\t{target}\n")
    path.write_text("".join(lines))
    return path


def text_args(corpus, out, *extra):
    """`train` of a (train, valid) corpus, as tests/test_real_corpora.py's runs: one layer on
    each side and no loss.png, as TINY_RUN (which says why)."""
    train, valid = corpus
    return ["train", "--data", str(train), "--valid", str(valid), "--out", str(out), "--preset", "tiny",
            "--layers", "1", "--max-len", "24", "--warmup", "5", "--log-every", "2", "--eval-every", "4", "--save-every", "4",
            "--no-progress", "--no-plot", *extra]


# ----------------------------------------------------------------------------- runs several files share

# name -> the `train` arguments of a run, given the directory to make it and its data files in:
# conftest.py's trained_run trains each once per pytest run, for every worker and file that
# asks (its run in DIR/run).
SHARED_RUNS = {
    # Trained until no short input of its 0..6 decodes to an empty line (tests/test_generate_lines.py).
    "copy_60_steps": lambda d: ["train", *TINY_RUN, "--steps", "60", "--lr", "1e-2", "--save-every", "60",
                                "--out", str(d / "run")],
    # A briefly trained character-level run of the 60-pair corpus: its hypotheses run long (few EOS
    # learnt yet), which truncation at the references' length would hide (tests/test_evaluate_cli.py).
    "char_4_steps": lambda d: [*text_args((write_corpus(d / "train.tsv", 60), write_corpus(d / "valid.tsv", 7)),
                                          d / "run", "--tokenizer", "char"), "--steps", "4"],
    # A word-level run of two steps at --max-len 6 (5 words and EOS), with two held-out pairs: its
    # outputs run to the limit, no EOS learnt yet (tests/test_generate_lines.py's notes and
    # warnings); tests/test_exported_run_in_torch.py exports it.
    "word_2_steps": lambda d: text_args((write_corpus(d / "train.tsv", 40), write_corpus(d / "valid.tsv", 2)),
                                        d / "run", "--max-len", "6", "--steps", "2"),
}


# ----------------------------------------------------------------------------- damaged files


def damage(step_dir):
    """Cut every array file of a checkpoint to 10 bytes, as a half-finished copy would."""
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files
    for p in files:
        p.write_bytes(p.read_bytes()[:10])


class DiskFullAfterHalf:
    """A file whose write stores the first half of the bytes, then fails as a full disk would."""

    def __init__(self, file, sizes):
        self.file, self.sizes = file, sizes

    def write(self, data):
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        self.sizes.append(os.fstat(self.file.fileno()).st_size)  # bytes really on disk, under the temp name
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __getattr__(self, name):
        return getattr(self.file, name)


# ----------------------------------------------------------------------------- import isolation

BLOCKER = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.partition(".")[0] in BLOCKED:  # as Python says of a package not installed
                raise ModuleNotFoundError(f"No module named {{fullname!r}} (blocked by test_import_isolation)",
                                          name=fullname)
            return None

    sys.meta_path.insert(0, Block())
    assert not BLOCKED & set(sys.modules), "imported before the block: " + repr(BLOCKED & set(sys.modules))

    # The block works: each blocked package really fails to import.
    for name in sorted(BLOCKED):
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"block failed: import {{name}} succeeded")
    """
)

AFTER = textwrap.dedent(
    """
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not leaked, f"blocked modules were imported anyway: {leaked}"
    print("OK")
    """
)


def run_blocking(blocked, body):
    """Run ``body`` in a fresh Python whose imports of the ``blocked`` packages fail; it must
    print OK and leave none of them imported."""
    script = BLOCKER.format(blocked=set(blocked)) + body + AFTER
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), (
        f"subprocess failed (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    )


# ----------------------------------------------------------------------------- decoding


def eos_biased_pair(config, seed, eos_bias):
    """(torch model, Flax twin) with the same weights; ``eos_bias`` added to the EOS bias."""
    import torch

    from flaxformer_mini.data import EOS
    from parity import torch_to_flax, transformer_pair

    torch_model, flax_model = transformer_pair(config, seed)
    with torch.no_grad():
        torch_model.decoder.fc.bias[EOS] += eos_bias
    torch_to_flax(torch_model.state_dict(), flax_model)
    return torch_model, flax_model


def _wide_beam():
    import flaxformer_mini as fm

    return dict(config=fm.get_preset("tiny").replace(target_vocab_size=4), max_new_tokens=8, beam_size=16, alpha=10.0)


# A beam (16) wider than the target vocabulary (4): the decoding tests' and the torch decoder's.
WIDE_BEAM = _wide_beam()


def wide_beam_case(seed):
    """(torch model, Flax model, source (3, 7)) of the WIDE_BEAM config."""
    from parity import sample_batch

    config = WIDE_BEAM["config"]
    torch_model, flax_model = eos_biased_pair(config, seed=seed, eos_bias=0.0)
    return torch_model, flax_model, sample_batch(config, batch=3, seed=1, source_len=7)[0]


# ----------------------------------------------------------------------------- multi-process launches

LAUNCH_TIMEOUT_S = 300
HEARTBEAT_S = 30  # --distributed-timeout of the CLI tests: start-up skew under load, and how long a lost process may go unnoticed
STEPS = 6  # the equivalence runs' steps
BATCH_SIZE = 8
# Adam's epsilon and learning rate of the equivalence runs: tests/test_sharding.py explains
# why 1e-9 turns round-off in the attention key biases' (exactly zero) gradients into ~lr-sized
# steps whose sign depends on summation order. 1e-4 damps that; the real updates keep their size.
ADAM_EPS = 1e-4
LEARNING_RATE = 1e-2

# The CLI's tiny run (TINY_RUN above), logging every step: the multi-process runs'.
EVERY_STEP_TINY_RUN = [*TINY_RUN, "--log-every", "1"]  # argparse: the last --log-every wins


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_with(devices_per_process=1):
    return dict(worker_env(devices_per_process), PYTHONUNBUFFERED="1")


def start_processes(argv_for, n, devices_per_process=1):
    """``n`` processes, process i running ``argv_for(i)``; stdout/stderr kept per process."""
    return [subprocess.Popen(argv_for(i), env=env_with(devices_per_process), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(n)]


def finish(procs, timeout=LAUNCH_TIMEOUT_S):
    """[(returncode, stdout, stderr)] once every process has ended; kills them all on a timeout.

    Every process's pipes are drained at once (a thread each): reading them one process after
    another lets a later process fill its pipe (64 KiB) and block on a write while the earlier
    one waits for it in a collective, a deadlock that only the timeout ends."""
    outputs = [None] * len(procs)

    def drain(i):
        outputs[i] = procs[i].communicate()

    threads = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    for t in threads:
        t.start()
    deadline = time.time() + timeout
    try:
        for t in threads:
            t.join(max(0.0, deadline - time.time()))
        if any(t.is_alive() for t in threads):
            raise subprocess.TimeoutExpired([p.args for p in procs], timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in threads:
            t.join(10)
    return [(p.returncode, *out) for p, out in zip(procs, outputs)]


def train_cli(out, n, *extra, port=None, timeout_s=HEARTBEAT_S, plot=False):
    """``argv(i)``: process i's `train` command of an ``n``-process run of EVERY_STEP_TINY_RUN."""
    port = port or free_port()
    run = EVERY_STEP_TINY_RUN if not plot else [a for a in EVERY_STEP_TINY_RUN if a != "--no-plot"]

    def argv(i):
        dist = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(i)] if n > 1 else []
        return [*(MULTIPROCESS_CLI if n > 1 else CLI), "train", *run, "--out", str(out), *dist,
                "--distributed-timeout", str(timeout_s), *extra]

    return argv


def assert_all_ok(results):
    for i, (code, _, err) in enumerate(results):
        assert code == 0, f"process {i} exited {code}:\n{err[-3000:]}"


def wait_for(predicate, procs, what, timeout=LAUNCH_TIMEOUT_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a process ended before {what}: " + "".join(p.stderr.read()[-2000:] for p in procs))
        time.sleep(0.05)
    raise AssertionError(f"not {what} within {timeout}s")


def checkpoint_steps(out):
    ckpts = out / "checkpoints"
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.exists() else []


def killed_before_its_last_checkpoint(run, out):
    """``out``: what `kill -9` leaves of ``run`` killed after its last step, before that step's
    checkpoint was written (metrics are logged before a checkpoint): a copy of ``run`` without its
    newest checkpoint. A real kill -9 and its resume are tests/test_train_cli.py's."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / str(checkpoint_steps(out)[-1]))
    return out


def final_state(out):
    from flaxformer_mini.runs.run import Run

    return Run.open(out).latest_state()


def worker_config(text=None):
    """The equivalence runs' config: the copy task, or with ``text`` ({'train', 'valid',
    'max_tokens', 'accumulate'}) a word-vocabulary run of those files (built the same in every
    process) with token-budget batches and accumulation."""
    from flaxformer_mini.runs.config import DataConfig, RunConfig, model_config_for
    from flaxformer_mini.runs.directory import RunDir
    from flaxformer_mini.runs.run_data import load_data
    from flaxformer_mini.train.optimizer import TrainConfig

    budget = {}
    if text is None:
        data = DataConfig(kind="synthetic", task="copy", vocab_size=11, max_len=5, eval_sequences=16)
        sizes = (11, 11)
    else:
        data = DataConfig(kind="tsv", max_len=23, train_path=text["train"], valid_path=text["valid"])
        # The vocabularies' sizes, built from the file (a RunDir that holds none; nothing is written).
        sizes = load_data(data, RunDir(text["train"] + ".no-run")).vocab_sizes
        budget = dict(max_tokens=text["max_tokens"], accumulate=text["accumulate"])
    # tiny's width 30 has no factor 4: width 40 gives FSDP on 4 devices an axis to split in
    # every kernel, and 4 heads (K = 10) give tensor parallelism over 2 devices heads to split.
    # One layer on each side, as the CLI tests (TINY_RUN says why).
    model = model_config_for("tiny", *sizes, data.model_max_len).replace(embed_size=40, heads=4, num_layers=1)
    return RunConfig(model=model,
                     train=TrainConfig(schedule="constant", learning_rate=LEARNING_RATE, eps=ADAM_EPS, seed=0),
                     data=data, batch_size=BATCH_SIZE, **budget)
