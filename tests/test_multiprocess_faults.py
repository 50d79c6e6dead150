"""Multi-process training's faults and refusals, with real processes (JAX's multi-controller
runtime over gloo, on this CPU): processes started with different options, files or devices
are refused by name before anything is written; a lost peer, an unreachable coordinator, a
port or process id in use, and signals at awkward moments end every process cleanly, never
with a hang or an abort.

The launchers and the tiny CLI run are tests/helpers.py's; tests/test_multiprocess.py holds the
equivalence runs and a run's whole life (kill, SIGTERM, resume).
"""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import chex
import jax
import numpy as np
import pytest

from helpers import (
    EVERY_STEP_TINY_RUN,
    HEARTBEAT_S,
    MULTIPROCESS_CLI,
    REPO,
    TINY_RUN,
    checkpoint_steps,
    cli,
    env_with,
    final_state,
    finish,
    free_port,
    start_processes,
    train_cli,
    wait_for,
    worker_config,
)


def test_processes_started_with_different_options_are_refused_naming_the_option(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    argv = train_cli(out, 2, port=port)
    results = finish(start_processes(lambda i: argv(i) + ["--steps", str(6 + 2 * i)], 2))
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "--steps: 6 on process 0, 8 on process 1" in err, err[-2000:]
    assert not out.exists(), "nothing is written when the processes disagree"


def test_every_process_trains_with_the_config_process_0_resolved(tmp_path, monkeypatch):
    # Resuming a run written before a setting existed, process 0 keeps the run's recorded value
    # (run_dir.start_or_resume) while the others hold the options of their own command line: here a
    # batch size and a held-out count that differ. follow_main gives every process process 0's
    # config, with its own host's data paths (the same files' contents, checked by agree_on).
    import dataclasses

    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.runs.directory import RunDir

    main = worker_config()
    mine = dataclasses.replace(main, batch_size=2 * main.batch_size,
                               data=dataclasses.replace(main.data, eval_sequences=32))
    monkeypatch.setattr(distributed, "is_multiprocess", lambda: True)
    monkeypatch.setattr(distributed, "allgather_bytes",
                        lambda payload: [json.dumps(main.to_dict()).encode(), payload])
    followed = Run(RunDir(tmp_path / "run"), mine).follow_main()
    assert followed.config == main and followed.data.eval is not None
    # Only the data paths differ (each host's copy of the same file): nothing to change.
    text_main = dataclasses.replace(main, data=dataclasses.replace(main.data, kind="tsv", task=None,
                                                                   train_path="/host0/train.tsv"))
    text_mine = dataclasses.replace(text_main, data=dataclasses.replace(text_main.data, train_path="/host1/train.tsv"))
    monkeypatch.setattr(distributed, "allgather_bytes",
                        lambda payload: [json.dumps(text_main.to_dict()).encode(), payload])
    run = Run(RunDir(tmp_path / "text"), text_mine)
    assert run.follow_main() is run


def test_every_process_trains_on_the_tokenizers_process_0_saved(tmp_path, monkeypatch):
    # Every process of a new text run trains its own tokenizers, and Hugging Face's unigram
    # trainer may number its pieces differently from one process to the next (nondeterministic
    # upstream; docs/data.md). With vocabularies of one size nothing would fail:
    # process 1 would train on other ids. Here process 0 is a real run in this process; process
    # 1's own tokenizer differs as the trainer's runs do: two pieces numbered the other way round.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.data import tokenizers
    from flaxformer_mini.runs import run_data as run_module
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.runs.directory import RunDir, comparable_tokenizer_bytes
    from tokenizers import Tokenizer as HFTokenizer

    lines = [f"{a} {b}\t{b} {a}" for a in ("red fox", "old tree", "blue sky") for b in ("ran far", "sat on")] * 4
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    with monkeypatch.context() as m:  # the run's files are written before training, and no step is looked at
        m.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
        assert cli("train", "--data", str(tmp_path / "train.tsv"), "--tokenizer", "unigram", "--vocab-size", "30",
                   "--shared-vocab", "--preset", "tiny", "--layers", "1", "--steps", "1", "--no-progress", "--no-plot",
                   "--out", str(out)).returncode == 0
    main = Run.open(out)
    (saved,) = [path for _, path in main.dir.tokenizer_files(main.config.data)]
    spec = json.loads(saved.read_text())
    pieces = spec["model"]["vocab"]  # [piece, score]; the 4 special tokens first
    pieces[4], pieces[5] = pieces[5], pieces[4]  # two frequent pieces numbered the other way round
    own = tokenizers.HFTokenizer("unigram", HFTokenizer.from_str(json.dumps(spec)))
    # Process 1 read the corpus before process 0's files were there, and trained its own.
    monkeypatch.setattr(run_module, "build_tokenizers", lambda config, pairs: (own, own))
    monkeypatch.setattr(RunDir, "has_vocabularies", lambda self, data=None: False)
    process_1 = Run(main.dir, main.config, run_module.load_data(main.config.data, main.dir))
    monkeypatch.undo()
    assert process_1.data.vocabs == (own, own)
    assert any((x != y).any() for x, y in zip(*process_1.train_batches(0), *main.train_batches(0)))

    monkeypatch.setattr(distributed, "is_multiprocess", lambda: True)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    monkeypatch.setattr(distributed, "allgather_bytes", lambda payload: [payload, payload])
    followed = process_1.follow_main()
    assert followed.config == main.config
    assert comparable_tokenizer_bytes(followed.data.vocabs[0]) == comparable_tokenizer_bytes(main.data.vocabs[0])
    for step in range(3):
        (a,), (b,) = followed.train_batches(step), main.train_batches(step)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # A process whose tokenizers are process 0's keeps its data (not encoded again).
    same = Run(main.dir, main.config, run_module.load_data(main.config.data, main.dir))
    assert same.follow_main() is same


def test_an_error_adopting_process_0s_files_stops_every_process_at_once(tmp_path, monkeypatch):
    # follow_main runs after the last start-up collective, and a process other than 0 reads
    # process 0's tokenizer files there. An error in it goes through all_started, as the
    # earlier start-up errors do: otherwise that process alone stops while process 0 waits in
    # fit's first collective until --distributed-timeout, then both abort (exit 134).
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.run import Run
    
    gathered, all_started = [], distributed.all_started

    def spy(error):
        gathered.append(error)
        return all_started(error)

    def unreadable(self):
        raise FileNotFoundError(f"{self.dir.path}/tokenizer_shared.json: the run's tokenizer is missing")

    monkeypatch.setattr(distributed, "all_started", spy)
    monkeypatch.setattr(Run, "follow_main", unreadable)
    out = tmp_path / "run"
    proc = cli("train", *TINY_RUN, "--steps", "2", "--out", str(out))
    assert proc.returncode == 2 and "tokenizer_shared.json: the run's tokenizer is missing" in proc.stderr
    assert isinstance(gathered[-1], FileNotFoundError), gathered  # every process hears of it
    monkeypatch.undo()
    monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)  # starting the run is what is asked
    assert cli("train", *TINY_RUN, "--steps", "2", "--out", str(out)).returncode == 0  # the lock was released


def test_options_that_act_on_one_process_only_may_differ_between_processes():
    from flaxformer_mini.cli.parser import build_parser
    from flaxformer_mini.cli.train import _identity

    def identity(*extra):
        return _identity(build_parser().parse_args(["train", *EVERY_STEP_TINY_RUN, "--out", "run", *extra]))

    assert identity("--debug", "--keep-freed-memory", "--process-id", "1") == identity()
    assert identity("--log-every", "7") != identity()  # guard: a shared option still counts


def test_one_mesh_spelled_two_ways_is_one_option_between_processes():
    from flaxformer_mini.cli.parser import build_parser
    from flaxformer_mini.cli.train import _identity

    def identity(*extra):
        return _identity(build_parser().parse_args(["train", *EVERY_STEP_TINY_RUN, "--out", "run", *extra]))

    assert identity("--mesh", "model=2, data=2") == identity("--mesh", "data=2,model=2")
    assert identity("--mesh", "data=2") == identity("--mesh", "data=2,model=1")
    assert identity("--mesh", "data=1,model=2") != identity("--mesh", "data=2,model=1")


def test_an_open_mpi_job_is_detected_as_a_cluster_and_a_plain_shell_is_not(monkeypatch):
    # jax has no public call for it: the detection reads jax's private registry of clusters,
    # and this test fails when a jax release moves or renames it.
    from flaxformer_mini.scale import distributed

    for name in ("OMPI_MCA_orte_hnp_uri", "SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", "TPU_SKIP_MDS_QUERY"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed._batch_cluster_detected()
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1234.0;tcp://10.0.0.1:5678")  # what mpirun sets
    assert distributed._batch_cluster_detected()


@pytest.fixture
def no_cluster(monkeypatch):
    """start_runtime's environment with no JAX variable set and no cluster detected."""
    from flaxformer_mini.scale import distributed

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distributed, "_batch_cluster_detected", lambda: False)
    return distributed


@pytest.mark.parametrize("port", [0, 70000])
def test_a_coordinator_port_outside_1_to_65535_is_refused_before_any_wait(no_cluster, port):
    # Unchecked, port 0 waits the whole timeout, then blames the other processes; 70000 trains on
    # port 4464, where getaddrinfo and jax wrap it.
    with pytest.raises(no_cluster.DistributedError, match=rf"^--coordinator '127\.0\.0\.1:{port}': port {port} is not "
                       r"in 1\.\.65535$"):
        no_cluster.start_runtime(f"127.0.0.1:{port}", 2, 1, timeout_s=1)


def test_an_empty_coordinator_is_refused_as_not_host_port(no_cluster):
    with pytest.raises(no_cluster.DistributedError, match=r"^--coordinator '' is not HOST:PORT$"):
        no_cluster.start_runtime("", 2, 1)


def test_a_process_count_or_id_without_a_coordinator_names_the_coordinator_it_needs(no_cluster, monkeypatch):
    # Unchecked: jax's "coordinator_address should be defined."
    with pytest.raises(no_cluster.DistributedError, match=r"^--num-processes 2 and --process-id 1 start a multi-process "
                       r"run, which also needs --coordinator HOST:PORT \(or JAX_COORDINATOR_ADDRESS\) on every process$"):
        no_cluster.start_runtime(None, 2, 1)
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    with pytest.raises(no_cluster.DistributedError, match=r"^JAX_PROCESS_ID 1 starts a multi-process run, which also "
                       r"needs --coordinator"):
        no_cluster.start_runtime()


def test_a_process_count_or_id_from_the_environment_is_named_as_the_variable(no_cluster, monkeypatch):
    # Unchecked: "--process-id 5 is out of range for --num-processes 2", neither option given.
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "5")
    with pytest.raises(no_cluster.DistributedError, match=r"^JAX_PROCESS_ID 5 is out of range for JAX_NUM_PROCESSES 2 "
                       r"\(0 to 1\)$"):
        no_cluster.start_runtime()
    with pytest.raises(no_cluster.DistributedError, match=r"^--process-id 5 is out of range for JAX_NUM_PROCESSES 2"):
        no_cluster.start_runtime(process_id=5)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "0")
    with pytest.raises(no_cluster.DistributedError, match=r"^JAX_NUM_PROCESSES must be >= 1, got 0$"):
        no_cluster.start_runtime()


def test_an_out_directory_not_shared_by_the_processes_is_refused_before_training(tmp_path):
    # Each process in a directory of its own with a relative --out: two run directories, as on
    # hosts without a shared file system. Unchecked, both train to the first save, where orbax
    # waits 10 minutes for the other process's files, then every process aborts.
    homes = [tmp_path / f"host{i}" for i in range(2)]
    for home in homes:
        home.mkdir()
    argv = train_cli("run", 2)
    procs = [subprocess.Popen(argv(i) + ["--steps", "3", "--save-every", "1"], env=env_with(), cwd=homes[i],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = finish(procs, timeout=120)
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "--out run: process(es) 1 do not see the run directory that process 0 writes" in err, err[-2000:]
    assert not (homes[0] / "run" / "checkpoints").exists() and not (homes[1] / "run").exists()
    from flaxformer_mini.scale.distributed import SHARED_CHECK_NAME

    assert not (homes[0] / "run" / SHARED_CHECK_NAME).exists()  # the probe is removed


@pytest.mark.parametrize("missing", ["--data", "--tokenizer-from"])
def test_a_data_file_missing_on_one_host_stops_every_process_at_once(tmp_path, missing, monkeypatch):
    # The same relative --data (or --tokenizer-from run) on two hosts, only on the first. Unchecked,
    # process 1 ends with its error while process 0 waits for it in the options check until the
    # timeout, and both then abort (exit -6).
    homes = [tmp_path / f"host{i}" for i in range(2)]
    for home in homes[: 2 if missing == "--tokenizer-from" else 1]:
        home.mkdir(exist_ok=True)
        (home / "train.tsv").write_text("".join(f"a{i} b\tx{i} y\n" for i in range(20)))
    homes[1].mkdir(exist_ok=True)
    extra, named = [], "train.tsv"
    if missing == "--tokenizer-from":  # a text run's directory (its tokenizers are written before training)
        monkeypatch.setattr("flaxformer_mini.cli.train.fit", lambda *a, **k: None)
        assert cli("train", "--data", str(homes[0] / "train.tsv"), "--preset", "tiny",
                   "--out", str(homes[0] / "prev")).returncode == 0
        extra, named = ["--tokenizer-from", "prev"], "--tokenizer-from prev: no such directory"
    port = free_port()
    argv = [*MULTIPROCESS_CLI, "train", "--data", "train.tsv", "--preset", "tiny", *extra,
            "--out", str(tmp_path / "run"), "--steps", "2", "--no-progress", "--no-plot", "--distributed-timeout", str(HEARTBEAT_S),
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    t0 = time.time()
    procs = [subprocess.Popen(argv + ["--process-id", str(i)], env=env_with(), cwd=homes[i], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    (code0, _, err0), (code1, _, err1) = finish(procs, timeout=120)
    assert code1 == 2 and named in err1, err1[-2000:]
    assert code0 == 2 and "process(es) 1 could not start the run" in err0, err0[-2000:]
    assert time.time() - t0 < HEARTBEAT_S  # at once, not after the timeout
    assert not (tmp_path / "run").exists()


def test_processes_holding_different_initial_values_are_refused_naming_the_first_array(monkeypatch):
    # shard_state's one-digest-per-array check (in place of jax.device_put's collective per
    # array), in this process: process 1's digests are this process's with two arrays changed.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.model.paths import path_name

    state = {"step": np.zeros((), np.int32), "params": {"a": np.ones((2, 3), np.float32), "b": np.arange(4.0)}}
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    gathered = []

    def allgather(payload):
        other = bytearray(payload)
        for k in (0, 1):  # params/a and params/b differ on process 1
            other[32 * k] ^= 1
        gathered.append(payload)
        return [payload, bytes(other)]

    monkeypatch.setattr(distributed, "is_multiprocess", lambda: True)
    monkeypatch.setattr(distributed, "allgather_bytes", allgather)
    with pytest.raises(distributed.DistributedError) as e:
        distributed.agree_on_values(state, "the initial training state")
    assert [path_name(p) for p, _ in leaves] == ["params/a", "params/b", "step"]
    assert str(e.value).startswith("the initial training state differs between process 0 and process 1, first at "
                                   "params/a (2 array(s) differ)")
    assert len(gathered) == 1 and len(gathered[0]) == 32 * len(leaves)  # one gather, one digest per array
    monkeypatch.setattr(distributed, "allgather_bytes", lambda payload: [payload, payload])
    distributed.agree_on_values(state, "the initial training state")  # equal everywhere: no error


def as_process_0_of_two(process_1):
    """``distributed.allgather_bytes`` as process 0 of two sees it in ``Run.restore_or_init``:
    process 1 reports ``process_1`` (its checkpoint steps, restored step, skipped steps)."""
    def allgather(payload):
        assert "restored" in json.loads(payload)  # the one gather of restore_or_init
        return [payload, json.dumps(process_1).encode()]

    return allgather


def fake_two_processes(monkeypatch, process_1):
    from flaxformer_mini.scale import distributed

    monkeypatch.setattr(distributed, "is_multiprocess", lambda: True)
    monkeypatch.setattr(distributed, "allgather_bytes", as_process_0_of_two(process_1))
    monkeypatch.setattr(distributed, "barrier", lambda name: None)


def test_a_checkpoint_only_one_process_could_read_is_skipped_by_every_process(tmp_path, monkeypatch):
    # With FSDP each process reads only its own shards, so process 1 may find checkpoint 6
    # damaged while process 0 restored it. Every process then resumes from step 3, and process 0
    # moves 6 aside. In this process, as process 0: process 1's report is made up, the rest real.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.run import Run
    
    out = tmp_path / "run"
    assert cli("train", *TINY_RUN, "--steps", "6", "--save-every", "3", "--out", str(out)).returncode == 0
    fake_two_processes(monkeypatch, {"steps": [3, 6], "restored": 3, "skipped": {"6": "a shard file cut short"}})
    run, said = Run.open(out), []
    manager = run.checkpoints()
    state = run.restore_or_init(manager, echo=said.append)
    assert int(state.step) == 3
    assert said and "checkpoint 6 cannot be read (process 1: a shard file cut short)" in said[0], said
    assert "resuming from step 3" in said[0]
    assert [p.name.split(".")[0] for p in (out / "damaged_checkpoints").iterdir()] == ["6"]
    assert list(manager.all_steps()) == [3]  # reread: saving step 6 again will not collide
    monkeypatch.setattr(distributed, "is_multiprocess", lambda: False)
    chex.assert_trees_all_equal(state.params, run.latest_state().params)  # step 3's own parameters


def test_processes_seeing_different_checkpoint_steps_are_refused_naming_them(tmp_path, monkeypatch):
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.run import Run
    
    out = tmp_path / "run"
    assert cli("train", *TINY_RUN, "--steps", "3", "--save-every", "3", "--out", str(out)).returncode == 0
    fake_two_processes(monkeypatch, {"steps": [], "restored": 0, "skipped": {}})  # a directory of its own
    run = Run.open(out)
    with pytest.raises(distributed.DistributedError, match=r"the processes see different checkpoints: checkpoint "
                       r"steps in the run directory: \[3\] on process 0, \[\] on process 1"):
        run.restore_or_init(run.checkpoints(), echo=lambda m: None)


def refused_in_this_process(argv, monkeypatch):
    """``(returncode, stdout, stderr)`` of a launcher's ``train`` command run by ``cli`` in this
    process, for a refusal that comes before JAX's runtime starts (``distributed.start_runtime``'s
    checks): the same main() and message as in a process of its own. The host's process-id lock
    is not taken, so that this process holds none for a later launch that draws the same port."""
    from flaxformer_mini.scale import host_guards

    assert argv[:len(MULTIPROCESS_CLI)] == MULTIPROCESS_CLI
    monkeypatch.setattr(host_guards, "hold_process_slot", lambda *a: None)
    proc = cli(*argv[len(MULTIPROCESS_CLI):])
    return proc.returncode, proc.stdout, proc.stderr


def test_an_unreachable_coordinator_is_an_error_naming_it_within_the_timeout(tmp_path, monkeypatch):
    # Process 1 waits for the coordinator in Python (distributed._wait_for_coordinator), before
    # JAX's runtime starts: in this process.
    port = free_port()  # nobody listens there
    t0 = time.time()
    code, _, err = refused_in_this_process(train_cli(tmp_path / "run", 2, port=port, timeout_s=1)(1) + ["--steps", "2"],
                                           monkeypatch)
    assert code == 2, err[-2000:]
    assert f"127.0.0.1:{port}" in err and "within 1s" in err, err[-2000:]
    assert time.time() - t0 < 60


def test_processes_whose_peers_never_connect_stop_with_a_message_naming_the_coordinator_not_an_abort(tmp_path):
    # Two of three processes come; the third never does. Left to jax, its C++ client ends both
    # after its initialization timeout with SIGABRT (returncode -6) and a C++ stack trace, no message.
    port, out = free_port(), tmp_path / "run"
    t0 = time.time()
    # Process 1 reaches the coordinator only once process 0, started beside it, has imported
    # its libraries and listens: 5 s leaves room for process 0 starting seconds later on a
    # loaded machine (with 1 s process 1 sometimes gives up first, naming no coordinator).
    results = finish(start_processes(lambda i: train_cli(out, 3, port=port, timeout_s=5)(i) + ["--steps", "2"], 2),
                     timeout=120)
    for i, (code, _, err) in enumerate(results):
        assert code == 2, err[-2000:]
        assert (f"flaxformer-mini train: error: the run's 3 processes did not all connect to the coordinator "
                f"127.0.0.1:{port} within 5s (--distributed-timeout) (this is process {i}).") in err, err[-2000:]
        assert "Check failure" not in err and "Traceback" not in err, err[-2000:]
    assert time.time() - t0 < 60  # 5 s, not jax's own timeout (5 + JAX_INIT_GRACE_S, then its abort)
    assert not out.exists()
    # The watchdog ends each process at once (os._exit, no atexit handler), its process-id lock removed first.
    from flaxformer_mini.scale.host_guards import _slot_path

    assert not any(_slot_path(f"127.0.0.1:{port}", i).exists() for i in range(2))


def test_a_process_id_out_of_range_is_refused():
    proc = cli("train", *EVERY_STEP_TINY_RUN, "--out", "unused", "--coordinator", "127.0.0.1:1", "--num-processes", "2",
               "--process-id", "2")
    assert proc.returncode == 2
    assert "--process-id 2 is out of range for --num-processes 2" in proc.stderr


def test_a_coordinator_port_already_in_use_refuses_process_0_at_once_naming_it(tmp_path, monkeypatch):
    # jax's coordinator binds with SO_REUSEPORT: a second run on a port in use binds it too, and
    # its other processes then join the first run's service, which aborts the first run
    # (SIGABRT, steps lost). Here a plain program holds the port; unchecked, process 0 blames a
    # timeout ("within 300s") after 2 s and does not say the port is taken.
    out = tmp_path / "run"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.time()
        # Process 0's port check comes before JAX's runtime starts: in this process.
        code, _, err = refused_in_this_process(train_cli(out, 2, port=port)(0) + ["--steps", "2"], monkeypatch)
    assert code == 2, err[-2000:]
    assert (f"error: --coordinator 127.0.0.1:{port}: port {port} is already in use on this host: another run or "
            f"program holds it. Choose another --coordinator port") in err, err[-2000:]
    assert "within" not in err and time.time() - t0 < 60 and not out.exists()


def test_the_port_check_sees_a_port_shared_listener_and_lets_a_restarted_runs_time_wait_pass():
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.scale import host_guards

    def listener(*options):
        s = socket.socket()
        for option in options:
            s.setsockopt(socket.SOL_SOCKET, option, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        return s

    # What jax's gRPC coordinator does: SO_REUSEADDR and SO_REUSEPORT, which a second one passes.
    with listener(socket.SO_REUSEADDR, socket.SO_REUSEPORT) as grpc_like:
        with pytest.raises(distributed.DistributedError, match="is already in use on this host"):
            host_guards.check_port_free(f"127.0.0.1:{grpc_like.getsockname()[1]}")
    # A finished run's coordinator leaves its closed connections in TIME_WAIT: the same command,
    # run again at once, must still start.
    with listener(socket.SO_REUSEADDR) as old:
        port = old.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = old.accept()
            accepted.close()  # the server side closes first: its end stays in TIME_WAIT
    host_guards.check_port_free(f"127.0.0.1:{port}")


def test_a_second_process_with_an_id_in_use_on_this_host_is_refused_naming_the_holder(tmp_path):
    # Unchecked, it registers with the run's coordinator as that task restarted, and jax's
    # coordination service aborts every process of the run (exit 134, steps lost).
    import fcntl
    import os

    from flaxformer_mini.scale import host_guards

    port, out = free_port(), tmp_path / "run"
    path = host_guards._slot_path(f"127.0.0.1:{port}", 1)
    with open(path, "w") as holder:  # what the running process 1 holds
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write(f"{os.getpid()}\n")
        holder.flush()
        t0 = time.time()
        (code, _, err), = finish(start_processes(lambda i: train_cli(out, 2, port=port)(1) + ["--steps", "2"], 1),
                                 timeout=120)
    path.unlink()
    assert code == 2, err[-2000:]
    assert (f"error: a process with --process-id 1 and --coordinator 127.0.0.1:{port} is already running on this "
            f"host (pid {os.getpid()})") in err, err[-2000:]
    assert time.time() - t0 < 60 and not out.exists()  # at once, not after --distributed-timeout


def test_the_process_id_lock_is_taken_once_per_process_and_removed_at_exit_only_if_still_ours(tmp_path, monkeypatch):
    import tempfile

    from flaxformer_mini.scale import host_guards

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    address = f"127.0.0.1:{free_port()}"
    host_guards.hold_process_slot(address, 3)
    host_guards.hold_process_slot(address, 3)  # a start-up retried in this process: not its own duplicate
    path = host_guards._slot_path(address, 3)
    fd = host_guards._SLOTS[path]
    path.unlink()  # a temp cleaner took it, and another process made its own
    path.write_text("12345\n")
    host_guards._release_slot(path, fd)
    assert path.read_text() == "12345\n" and path not in host_guards._SLOTS
    # Still ours at exit: removed.
    host_guards.hold_process_slot(address, 4)
    ours = host_guards._slot_path(address, 4)
    assert ours.exists()
    host_guards._release_slot(ours, host_guards._SLOTS[ours])
    assert not ours.exists() and ours not in host_guards._SLOTS


def test_a_coordinator_from_the_environment_is_named_with_the_variables_it_needs(monkeypatch):
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.scale import host_guards

    port = free_port()  # nobody listens there
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    monkeypatch.setattr(distributed, "_batch_cluster_detected", lambda: False)
    # Unchecked: jax's own "Number of processes must be defined."
    with pytest.raises(distributed.DistributedError, match=r"JAX_COORDINATOR_ADDRESS 127\.0\.0\.1:\d+ starts a "
                       r"multi-process run, which also needs --num-processes \(or JAX_NUM_PROCESSES\) and "
                       r"--process-id \(or JAX_PROCESS_ID\) on every process"):
        distributed.start_runtime()
    # Unchecked for reachability: "did not all connect ... Start every process with the same
    # --coordinator" after the whole timeout.
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    monkeypatch.setattr(host_guards, "hold_process_slot", lambda *a: None)  # no lock left in this process
    with pytest.raises(distributed.DistributedError, match=rf"the coordinator 127\.0\.0\.1:{port} "
                       r"\(JAX_COORDINATOR_ADDRESS\) could not be reached within 1s"):
        distributed.start_runtime(timeout_s=1)


def test_train_writes_only_its_result_on_stdout_even_what_native_code_prints_there():
    # gloo (C++) prints "[Gloo] Rank 0 is connected ..." on file descriptor 1: there, it would
    # break `train | jq`.
    code = ("import os, sys\n"
            "from flaxformer_mini.scale.distributed import stdout_for_results\n"
            "with stdout_for_results() as results:\n"
            "    os.write(1, b'[Gloo] native noise\\n')\n"
            "    print('python noise')\n"
            "    print('{\"loss\": 1.0}', file=results)\n"
            "print('after')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env_with())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == '{"loss": 1.0}\nafter\n'
    assert "[Gloo] native noise" in proc.stderr and "python noise" in proc.stderr


def test_processes_with_different_device_counts_are_refused_naming_the_counts_before_anything_is_written(tmp_path):
    # Unchecked, the first start-up collective (jax's process_allgather) fails on every process
    # with "cannot reshape array of size 3 into shape (2,2)".
    out, argv = tmp_path / "run", train_cli(tmp_path / "run", 2)
    procs = [subprocess.Popen(argv(i), env=env_with(devices_per_process=2 - i), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for code, _, err in finish(procs):
        assert code == 2, err[-2000:]
        assert ("error: the processes have different numbers of cpu devices (process 0: 2, process 1: 1); every "
                "process needs as many (set by XLA_FLAGS=--xla_force_host_platform_device_count=N)") in err, err[-2000:]
    assert not out.exists()


def test_a_batch_size_not_divisible_by_the_global_device_count_is_refused(tmp_path):
    out = tmp_path / "run"
    argv = train_cli(out, 2)
    results = finish(start_processes(lambda i: argv(i) + ["--steps", "2", "--batch-size", "7"], 2))
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "--batch-size 7 is not divisible by 2 devices" in err
    assert not out.exists()


def handles_sigterm(pid):
    """Whether process ``pid`` has a SIGTERM handler installed (Linux: the SigCgt mask in
    /proc/PID/status), so a test signals at a known point rather than after a sleep."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc (Linux)")
def test_a_sigterm_before_the_first_step_stops_every_process_with_130_and_saves_nothing(tmp_path):
    # Issue #12: a SIGTERM before `train`'s loop is neither lost nor takes the run down.
    # Deterministic: process 1 starts alone and waits for the coordinator (process 0, not yet
    # started) with its handler installed; it gets the SIGTERM there. Then process 0 starts:
    # both agree before the first step, and stop, with nothing compiled or saved.
    out, port = tmp_path / "run", free_port()
    argv = train_cli(out, 2, port=port)
    env = env_with()
    p1 = subprocess.Popen(argv(1) + ["--steps", "5"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    wait_for(lambda: handles_sigterm(p1.pid), [p1], "process 1's SIGTERM handler", timeout=60)
    p1.send_signal(signal.SIGTERM)
    p0 = subprocess.Popen(argv(0) + ["--steps", "5"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    results = finish([p0, p1], timeout=120)
    for code, _, err in results:  # process 0's log and process 1's (the one signalled) alike
        assert code == 130, err[-2000:]
        assert "interrupted before the first step: nothing new to save" in err, err[-2000:]
    assert checkpoint_steps(out) == []
    assert time.time() - t0 < 60  # at once, as the other refusals here: not at finish's timeout


def vote_during_which_a_signal_arrives(stop, seen, at=2):
    """``distributed.any_process_later`` in one process, the signal landing during vote ``at``."""
    def vote(flag, devices=None):  # devices: the run's (one process: none to agree with)
        seen.append(flag)
        if len(seen) == at:
            stop.requested = True  # what the handler does when the signal lands mid-call
        return lambda: bool(flag)

    return vote


def test_a_signal_handled_during_a_step_boundary_vote_stops_the_run_one_boundary_later(tmp_path, monkeypatch):
    # Issue #12's lost SIGTERM: were the all-reduce's result written back over the stop flag, a
    # signal handled while the all-reduce runs (where a multi-process run waits) would be erased.
    # Deterministic, in one process: the signal arrives during step 2's vote. Step 3's boundary
    # queues a vote that sees it; step 4's boundary reads that vote (votes are read one boundary
    # late, so the host never waits for the devices there), saves step 4 and stops.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.fit import fit
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.train.stop import StopRequests, Stopped

    stop, seen = StopRequests(), []
    monkeypatch.setattr(distributed, "any_process_later", vote_during_which_a_signal_arrives(stop, seen))
    run = Run.create(tmp_path / "run", worker_config(), echo=lambda m: None)
    with pytest.raises(Stopped, match="run the same command to resume"):  # the coordinated stop, not StopNow
        fit(run, 10, log_every=1, eval_every=100, save_every=100, progress=False, echo=lambda m: None, stop=stop, plot=False)
    assert seen == [False, False, True, True]  # steps 1-4's votes; step 3's is read at step 4
    assert int(final_state(tmp_path / "run").step) == 4


def test_evaluation_during_training_gathers_the_parameters_not_the_optimizer_state(tmp_path, monkeypatch):
    # The whole TrainState gathered for each evaluation would be, with FSDP, Adam's two moments
    # included, three times the bytes evaluation reads (its parameters, through state.model()).
    import flaxformer_mini.runs.fit as fit_module

    gathered, evaluated = [], []
    monkeypatch.setattr(fit_module, "to_local", lambda tree: gathered.append(tree) or tree)
    monkeypatch.setattr(fit_module, "evaluate", lambda trainer, state, batches, **kw: evaluated.append(state) or {
        "loss": 0.0, "token_accuracy": 0.0, "exact_match": 0.0})
    run = _new_run(tmp_path / "run")
    fit_module.fit(run, 1, log_every=1, eval_every=1, save_every=100, progress=False, echo=lambda m: None, plot=False)
    assert len(gathered) == 1 and gathered[0].opt_state is None and evaluated == gathered
    assert jax.tree.leaves(gathered[0].params) and int(gathered[0].step) == 1


def _new_run(out):
    from flaxformer_mini.runs.run import Run

    return Run.create(out, worker_config(), echo=lambda m: None)


def test_a_second_ctrl_c_stops_now_and_the_process_exits_without_pythons_shutdown():
    # The first Ctrl-C asks for the coordinated stop; the second raises StopNow at once, and
    # the CLI then ends the process without Python's shutdown: in a multi-process run that
    # shutdown runs jax's exit barrier, which waits for the peers (every process aborts after
    # the timeout), and in any run it waits for an XLA compilation still going on.
    from flaxformer_mini.cli import errors
    from flaxformer_mini.train.stop import REPEAT_S, StopNow, Stopped, StopRequests

    with StopRequests() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        time.sleep(REPEAT_S)  # a second press, not the first delivered twice (stop.py's REPEAT_S)
        with pytest.raises(StopNow):
            signal.raise_signal(signal.SIGINT)
    assert issubclass(StopNow, KeyboardInterrupt)  # caught where any Ctrl-C is: exit code 130
    assert errors.exits_at_once(StopNow()) and not errors.exits_at_once(KeyboardInterrupt())
    assert not errors.exits_at_once(Stopped("saved step 4"))  # the coordinated stop exits normally


def test_a_second_ctrl_c_mid_run_leaves_the_logged_steps_in_the_tensorboard_events(tmp_path, monkeypatch):
    # The CLI ends the process without Python's shutdown after a StopNow (cli.errors.exits_at_once),
    # and tensorboardX writes its events every 30 s or at close: fit closes the writer first.
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.fit import fit
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.train.stop import StopNow, StopRequests
    from flaxformer_mini.runs.tensorboard import read_scalars

    def vote(flag, devices=None):
        if vote.calls == 3:
            raise StopNow  # the second Ctrl-C, landing in step 4's boundary
        vote.calls += 1
        return lambda: False

    vote.calls = 0
    monkeypatch.setattr(distributed, "any_process_later", vote)
    run = Run.create(tmp_path / "run", worker_config(), echo=lambda m: None)
    with pytest.raises(StopNow):
        fit(run, 10, log_every=1, eval_every=100, save_every=100, progress=False, echo=lambda m: None,
            stop=StopRequests(), plot=False)
    # Steps 1-3: a logged line is written at the next step's push (the host never waits for the
    # devices), and an interrupted run writes no extra one.
    assert [step for step, _ in read_scalars(run.dir.tensorboard)["train/loss"]] == [1, 2, 3]


def test_a_stop_read_at_the_last_step_ends_the_run_as_finished(tmp_path, monkeypatch):
    # The same signal with --steps 4: the stop is read at the run's last step, which saves and
    # evaluates anyway. The run ends as finished (its result, exit 0), not "interrupted".
    from flaxformer_mini.scale import distributed
    from flaxformer_mini.runs.fit import fit
    from flaxformer_mini.runs.run import Run
    from flaxformer_mini.train.stop import StopRequests

    stop, seen = StopRequests(), []
    monkeypatch.setattr(distributed, "any_process_later", vote_during_which_a_signal_arrives(stop, seen))
    run = Run.create(tmp_path / "run", worker_config(), echo=lambda m: None)
    result = fit(run, 4, log_every=1, eval_every=100, save_every=100, progress=False, echo=lambda m: None, stop=stop, plot=False)
    assert seen == [False, False, True, True] and result["step"] == 4 and "loss" in result
    assert int(final_state(tmp_path / "run").step) == 4


