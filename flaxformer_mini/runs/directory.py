"""A run directory's files, and nothing else: where each lives and how it is written.

    OUT/config.json          the RunConfig (checked on resume)
    OUT/vocab_source.json    for text runs: the vocabularies built from the training file
    OUT/vocab_target.json    (--tokenizer word; vocab_shared.json with --shared-vocab)
    OUT/tokenizer_source.json  --tokenizer char|bpe|unigram: Hugging Face tokenizers' own
    OUT/tokenizer_target.json  format (tokenizer_shared.json with --shared-vocab)
    OUT/tensorboard/         TensorBoard event files (the metrics.jsonl values)
    OUT/metrics.jsonl        one JSON object per logged step and per evaluation
    OUT/checkpoints/<step>/  rotating orbax checkpoints
    OUT/best/<step>/         --best-metric: the best evaluation's checkpoint (one; evaluate, generate and
                             parity convert read it as OUT/best)
    OUT/loss.png             the loss curves, drawn at the end of the run
    OUT/.lock                held (flock) by the one process training the run
"""

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import socket
from pathlib import Path

from flaxformer_mini.data import Vocab, tokenizers
from flaxformer_mini.files import file_sha256, same_file, write_atomic
from flaxformer_mini.runs.config import RunConfig, RunConfigError, peak_lr
from flaxformer_mini.train.optimizer import TrainConfig


def _write_json(path, obj):
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


LOCK_NAME = ".lock"
BEST_NAME = "best"  # OUT/best: the best checkpoint's orbax directory; "RUN/best" names it to evaluate and generate


class RunLockedError(RunConfigError):
    """Another process is training the run in this directory."""


class RunLock:
    """An exclusive ``flock`` on ``OUT/.lock``, held while a process trains the run.

    The kernel drops a ``flock`` when its process dies, ``kill -9`` included, so a lock left
    by a killed run is free again: the next ``train`` takes it over with no stale-lock guessing.
    The file names the holder (process id and host) for the error a second run gets.
    """

    def __init__(self, path):
        self.path = path
        self._file = open(path, "a+")  # "a+": create if absent, never truncate another holder's note
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise RunLockedError(
                f"--out {path.parent} is being trained by {holder}; wait for it to finish (or stop it), "
                f"or use another --out. Nothing was written."
            ) from None

    def write_holder(self):
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        self._file.flush()

    def release(self):
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


class RunDir:
    def __init__(self, path):
        self.path = Path(path)
        self.config_path = self.path / "config.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoints = self.path / "checkpoints"
        self.best = self.path / BEST_NAME
        self.plot_path = self.path / "loss.png"
        self.vocab_paths = (self.path / "vocab_source.json", self.path / "vocab_target.json")
        self.tensorboard = self.path / "tensorboard"
        self.lock_path = self.path / LOCK_NAME
        self.moved_data = []  # (key, recorded path, path now) of data files found elsewhere on resume

    def exists(self):
        return self.config_path.is_file()

    def own_file(self, path):
        """What ``path`` is among the files this run keeps (config.json, metrics, plot, lock,
        vocabularies or tokenizers) or reads (a text run's training and --valid files), in
        words (``"config.json"``, ``"--valid file (data.valid_path in RUN/config.json)"``), or
        lies under (checkpoints, best, TensorBoard events); None for any other path, and where
        no run is here. Under any name: another spelling (``d/../x``), a symlink, a hard link.
        For the commands that refuse to write an output over a run's files, even with --force."""
        if not self.exists():
            return None
        named = [(self.config_path, "config.json"), (self.metrics_path, "metrics.jsonl"),
                 (self.plot_path, "loss plot"), (self.lock_path, "lock file"),
                 *((vocab, "vocabulary") for vocab in self.vocab_paths)]
        try:
            data = self.load_config().data
        except (OSError, ValueError):  # an unreadable config.json: the command reading the run names it
            data = None
        if data is not None:
            named += [(tokenizer, "tokenizer") for _, tokenizer in self.tokenizer_files(data)]
            named += [(Path(getattr(data, key)), f"{_DATA_FILE_WORDS[key]} (data.{key} in {self.config_path})")
                      for key in DATA_FILES if getattr(data, key, None)]
        target = Path(path).resolve()
        for file, what in named:
            if target == file.resolve() or same_file(path, file):
                return what
        for directory in (self.checkpoints, self.best, self.tensorboard):
            if target.is_relative_to(directory.resolve()) or _hard_linked_under(path, directory):
                return f"a file under {directory.name}/"
        return None

    def load_config(self) -> RunConfig:
        if not self.exists():
            give = "give a run's directory (the --out of `train`)"
            if not self.path.exists():  # most often a mistyped run name
                raise RunConfigError(f"{self.path}: no such directory; {give}")
            if not self.path.is_dir():
                raise RunConfigError(f"{self.path}: is a file; {give}")
            raise RunConfigError(f"{self.path}: no run here (config.json is missing)")
        try:
            d = json.loads(self.config_path.read_text())
        except json.JSONDecodeError as e:
            raise RunConfigError(f"{self.config_path}: not valid JSON: {e}") from None
        config = RunConfig.from_dict(d, source=str(self.config_path))  # first: a malformed setting by name
        check_config_sha256(d, self.config_path)
        return config

    def start_or_resume(self, config: RunConfig, checksums=None):
        """Write ``config`` for a new run, or check that it matches the run already here, and
        take the run's lock. Returns (resuming, the lock, the run's config): release the lock
        when training ends.
        ``checksums`` ({file name: sha256}) of the run's vocabulary or tokenizer files go into a
        new run's config.json, so a file changed later is caught. Nothing is written (and no
        lock kept) when the directory cannot be used."""
        if self.path.exists() and not self.path.is_dir():
            raise RunConfigError(f"--out {self.path}: is a file; give a directory for the run (a new or empty one, "
                                 f"or a run's to resume it)")
        if not self.exists() and self.path.exists() and any(p.name != LOCK_NAME for p in self.path.iterdir()):
            raise RunConfigError(f"--out {self.path} exists and is not a flaxformer-mini run; choose an empty or new directory")
        self.path.mkdir(parents=True, exist_ok=True)
        lock = RunLock(self.lock_path)  # before reading the config: another run may be writing it
        try:
            resuming = self.exists()
            if resuming:
                old = self.load_config()  # first: a damaged config.json is an error naming it
                if old.averaged is not None:
                    raise RunConfigError(
                        f"--out {self.path} holds an average of checkpoints of {old.averaged.run} (`flaxformer-mini "
                        f"average`), which evaluate and generate read; it does not train. Give another --out (or "
                        f"{old.averaged.run} to continue that run). Nothing was overwritten.")
                stored = json.loads(self.config_path.read_text())
                old_dict, new_dict = _absolute_data_paths(old.to_dict()), config.to_dict()
                new_data, moved = self._identify_data_files(old_dict["data"], new_dict["data"])
                # Settings added after the run was written are absent from its file: it keeps
                # their defaults (its old behaviour), whatever the command's options say.
                new_dict = {**new_dict, "data": new_data}
                diffs = [line for line in _differences(old_dict, new_dict, present=stored)
                         if not line.startswith("init_from")]
                was, now = old.model.tie_embeddings, config.model.tie_embeddings
                if "tie_embeddings" not in stored.get("model", {}) and was != now:
                    # Compared though the file lacks it (an untied run's config.json holds no key,
                    # as one written before the setting): which tables are one is the model's
                    # parameters, not a behaviour an older run could keep by default.
                    diffs.append(f"model.tie_embeddings ({_SET_BY['model.tie_embeddings']}): {was!r} in the run, "
                                 f"{now!r} now")
                self._refuse_differences(_init_from_differences(stored.get("init_from"), new_dict.get("init_from"))
                                         + _in_option_words(diffs, old_dict, new_dict))
                config = old
                if moved:  # the run reads its data where it is now, and says so in its config
                    config = dataclasses.replace(old, data=dataclasses.replace(
                        old.data, **{key: now for key, _, now in moved}))
                    stored["data"].update({key: now for key, _, now in moved})
                    _write_json(self.config_path, stored)
                self.moved_data = moved
            else:
                stored = {**config.to_dict(), "checksums": dict(checksums or {})}
                stored["checksums"][CONFIG_CHECKSUM] = config_sha256(stored)
                _write_json(self.config_path, stored)
        except BaseException:
            lock.release()
            raise
        lock.write_holder()
        return resuming, lock, config

    def check_data(self, data):
        """Before a resumed run loads (and maybe trains tokenizers for) its data: refuse a
        DataConfig that differs from the run's, e.g. another --tokenizer or --vocab-size."""
        if self.exists():
            old = self.load_config().to_dict()  # first: a damaged config.json is an error naming it
            stored = json.loads(self.config_path.read_text())
            old_data = _absolute_data_paths(old)["data"]
            new_data, _ = self._identify_data_files(old_data, data.to_dict())
            diffs = _differences(old_data, new_data, "data.", present=stored.get("data", {}))
            if any(_setting(line) == "data.tokenizer_from" for line in diffs):
                # The tokenizer settings come with --tokenizer-from's run (or its absence, the
                # defaults no one typed): its own line says what differs.
                diffs = [line for line in diffs if _setting(line) not in _SET_WITH_TOKENIZER_FROM]
            self._refuse_differences(diffs)

    def _identify_data_files(self, old, new):
        """Data files are the same when their contents are: ``(new data dict, moves)``, where a
        file found at another path with the sha256 the run recorded takes the run's path (so
        it is no difference) and each such move is ``(key, recorded path, path now)``.

        A file at the run's own path whose contents changed since the run started is refused:
        without --valid the held-out pairs are drawn from the training file's lines, and every
        step's batch from its examples, so a resumed run would train on pairs it once held out
        and score on others, silently. A run that recorded no checksums is checked by path
        alone."""
        recorded, new, moves = self.recorded_checksums(), dict(new), []
        for key in DATA_FILES:
            was, now, digest = old.get(key), new.get(key), recorded.get(f"data.{key}")
            if was is None or now is None or digest is None or not os.path.isfile(now):
                continue  # a missing file is an error naming it when the data are read
            found = data_file_sha256(now)
            if found == digest and now != was:
                moves.append((key, was, now))
                new[key] = was
            elif found != digest and now == was:
                why = ("the held-out pairs and every step's batch come from its lines" if key == "train_path"
                       else "the held-out scores would not compare with the earlier ones")
                raise RunConfigError(
                    f"{now} (data.{key}) has changed since the run in {self.path} started (sha256 {found[:12]}..., "
                    f"recorded {digest[:12]}...): {why}. Restore the file, or train a new run with another --out. "
                    f"Nothing was overwritten.")
        return new, moves

    def _refuse_differences(self, diffs):
        if diffs:
            raise RunConfigError(
                f"--out {self.path} holds another run whose config differs: {'; '.join(diffs)}. "
                f"Use another --out, or the same options to resume it. Nothing was overwritten."
            )

    # --- vocabularies and tokenizers (text runs)

    def tokenizer_files(self, data=None):
        """[(side, path)] of the run's tokenizer files for ``data`` (a DataConfig; None: word,
        separate): sides "source" and "target", or "shared" alone."""
        kind = getattr(data, "tokenizer", "word")
        sides = ("shared",) if getattr(data, "shared_vocab", False) else ("source", "target")
        return [(side, tokenizers.tokenizer_path(self.path, kind, side)) for side in sides]

    def has_vocabularies(self, data=None):
        return all(path.exists() for _, path in self.tokenizer_files(data))

    def recorded_checksums(self):
        """{file name: sha256} that config.json recorded (empty for runs written before)."""
        try:
            return dict(json.loads(self.config_path.read_text()).get("checksums") or {})
        except (OSError, ValueError):
            return {}

    def verify(self, path, data: bytes):
        """Raise naming ``path`` when its bytes are not the ones the run recorded."""
        expected = self.recorded_checksums().get(path.name)
        if expected is not None and sha256(data) != expected:
            raise RunConfigError(
                f"{path} differs from the file this run wrote (sha256 {sha256(data)[:12]}..., recorded "
                f"{expected[:12]}...): token ids would silently change meaning. Restore the original file, "
                f"or train a new run."
            )

    def load_vocabularies(self, data=None):
        """(source, target) tokenizers: ``data.Vocab`` for word (its vocab_*.json files), a
        ``tokenizers.HFTokenizer`` for the others; the same object twice when shared."""
        kind = getattr(data, "tokenizer", "word")
        loaded = []
        for side, path in self.tokenizer_files(data):
            if not path.exists():
                rebuild = (f"or resume training with the same --tokenizer-from {data.tokenizer_from}, which "
                           f"copies it again" if getattr(data, "tokenizer_from", None) else
                           "a unigram tokenizer is seldom rebuilt identically: Hugging Face's unigram trainer "
                           "gives other pieces from one process to the next, and resuming refuses a tokenizer "
                           "other than the recorded one" if kind == "unigram" else
                           "or resume training with the same --data, which rebuilds it")
                raise FileNotFoundError(f"{path}: the run's {'vocabulary' if kind == 'word' else 'tokenizer'} "
                                        f"is missing; restore it ({rebuild})")
            self.verify(path, path.read_bytes())
            loaded.append(Vocab.load(path) if kind == "word" else tokenizers.load(self.path, kind, side))
        return (loaded[0], loaded[0]) if len(loaded) == 1 else tuple(loaded)

    def save_vocabularies(self, vocabs, data=None):
        for (_, path), vocab in zip(self.tokenizer_files(data), vocabs):
            content = tokenizer_bytes(vocab)
            self.verify(path, content)  # a rebuilt vocabulary must be the one recorded
            write_atomic(path, content)

    def vocabulary_checksums(self, vocabs, data=None):
        return {path.name: sha256(tokenizer_bytes(vocab)) for (_, path), vocab in zip(self.tokenizer_files(data), vocabs)}

    # --- the metrics log

    def truncate_metrics(self, step, echo=None):
        """Drop log lines past ``step`` (the restored checkpoint), so a resumed run's log has
        each step once, and any torn line (a write cut short by a kill or a full disk)."""
        if not self.metrics_path.exists():
            return
        kept = [line for record, line in self._metric_lines(echo) if record.get("step", 0) <= step]
        write_atomic(self.metrics_path, "".join(line + "\n" for line in kept))

    def log(self, record):
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self, echo=None):
        if not self.metrics_path.exists():
            return []
        return [record for record, _ in self._metric_lines(echo)]

    def _metric_lines(self, echo):
        """(record, line) for each readable line; a torn or garbled line is skipped, and said."""
        out = []
        for number, line in enumerate(self.metrics_path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError:
                if echo is not None:
                    echo(f"warning: {self.metrics_path}:{number}: unreadable line dropped (a write cut short?)")
                continue
            out.append((record, line))
        return out


def tokenizer_bytes(vocab):
    """The bytes of a saved vocabulary or tokenizer file: ``Vocab.to_bytes``, or what
    ``tokenizers.Tokenizer.save`` (pretty JSON) writes for the Hugging Face kinds; for one
    taken from another run (``tokenizer_from.load``), the bytes of that run's file."""
    if getattr(vocab, "file_bytes", None) is not None:
        return vocab.file_bytes
    if isinstance(vocab, Vocab):
        return vocab.to_bytes()
    return vocab.hf.to_str(pretty=True).encode("utf-8")


def comparable_tokenizer_bytes(vocab):
    """``tokenizer_bytes`` for comparing a tokenizer in memory with one loaded from its file.
    Hugging Face's JSON does not read a float back exactly (tokenizers 0.23: a unigram score
    written as -3.7611312505172005 reads back as -3.761131250517201), so equal tokenizers
    would compare unequal; read back once, the bytes are a fixed point (checked on unigram
    vocabularies of 25 to 600 pieces), so both sides are compared after one reading."""
    if isinstance(vocab, Vocab):
        return tokenizer_bytes(vocab)
    from tokenizers import Tokenizer  # late: Hugging Face's, loaded only for a char or subword tokenizer (data/tokenizers.py)

    return Tokenizer.from_str(vocab.hf.to_str()).to_str(pretty=True).encode("utf-8")


def sha256(data: bytes):
    return hashlib.sha256(data).hexdigest()


# A text run's data files, as DataConfig names them; config.json records each one's sha256
# under "data.<name>" in its checksums.
DATA_FILES = ("train_path", "valid_path")
_DATA_FILE_WORDS = {"train_path": "training file", "valid_path": "--valid file"}


def _hard_linked_under(path, directory):
    """Whether the file ``path`` has another name somewhere under ``directory``: a hard link's
    names are all alike, so the file's identity (device and inode) is looked for there; only
    for a file with more than one name."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_nlink < 2 or not os.path.isfile(path):
        return False
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                other = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


_DATA_SHA256 = {}  # (path, size, mtime_ns) -> sha256: one read of a corpus per process, not one per check


# config.json's own checksum, checksums["config"]: the sha256 of the settings as written, the
# data files' paths left out (a data file found elsewhere with its recorded contents is
# written back with its new path). The model is rebuilt from this file, and with `heads`
# edited a checkpoint loads into arrays of the same shapes and runs as another model,
# silently. Files written before it carry none and are read as they were.
CONFIG_CHECKSUM = "config"


def config_sha256(stored):
    """The sha256 of a config.json's settings (its parsed JSON ``stored``), as recorded in it:
    of their values, not of how the file spells them (key order, spaces, and a float with an
    integer's value, which `jq` writes as `0` where Python wrote `0.0`, count for nothing)."""
    settings = {key: value for key, value in stored.items() if key != "checksums"}
    settings["data"] = {key: value for key, value in (settings.get("data") or {}).items() if key not in DATA_FILES}
    return sha256(json.dumps(_canonical(settings), sort_keys=True, separators=(",", ":")).encode())


def _canonical(value):
    if isinstance(value, dict):
        return {key: _canonical(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def check_config_sha256(stored, path):
    """Refuse the parsed config.json ``stored`` (read from ``path``) if its settings differ from
    the checksum it recorded; a file without one (written before it was recorded) passes."""
    checksums = stored.get("checksums")
    recorded = checksums.get(CONFIG_CHECKSUM) if isinstance(checksums, dict) else checksums  # mangled: refused
    if recorded is None:
        return
    found = config_sha256(stored)
    if found != recorded:
        raise RunConfigError(
            f"{path}: edited since the run wrote it (sha256 of its settings {found[:12]}..., recorded "
            f"{str(recorded)[:12]}...): the checkpoints belong to the settings it held, and an edited one (heads, for "
            f"one) would load them into another model without an error. Put the file back as it was; then, for "
            f"other settings, train a new run from these weights (parity convert {Path(path).parent} "
            f"weights.safetensors, then train --init-from weights.safetensors).")


def data_file_sha256(path):
    """``files.file_sha256`` of a data file, read once per process: a resumed run checks its
    files before loading them (``check_data``), when writing the config and when resuming."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _DATA_SHA256:
        _DATA_SHA256[key] = file_sha256(path)
    return _DATA_SHA256[key]


def data_file_checksums(data):
    """{"data.train_path": sha256, ...} of a text run's data files (a DataConfig), for config.json."""
    return {f"data.{key}": data_file_sha256(getattr(data, key)) for key in DATA_FILES
            if getattr(data, key, None) and os.path.isfile(getattr(data, key))}


def _absolute_data_paths(config):
    """A run config dict with its data files' paths absolute. Runs record absolute paths; one
    written before recorded them as typed, relative to the directory it was started from,
    taken to be the current one (as it always was)."""
    data = dict(config["data"])
    for key in ("train_path", "valid_path"):
        if data.get(key) is not None:
            data[key] = os.path.abspath(data[key])
    return {**config, "data": data}


def _differences(old, new, prefix="", present=None):
    """'key: old in the run, new now' for each setting that differs; with ``present`` (the
    stored file's dict), only the settings the file holds (format and version aside)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if present is not None and (key not in present or key in ("format", "version", "checksums")):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.", present[key] if present is not None else None)
        elif a != b:
            why = _SET_BY.get(f"{prefix}{key}")
            if f"{prefix}{key}" == "data.max_len" and old.get("kind") == "tsv" and None not in (a, b):
                a, b = a + 1, b + 1  # a text run stores --max-len less its EOS: said as typed
            out.append(f"{prefix}{key}{f' ({why})' if why else ''}: {a!r} in the run, {b!r} now")
    return out


def _in_option_words(diffs, old, new):
    """``diffs`` with the rsqrt schedule's factor said as the --lr the user typed: the run
    records ``train.lr_factor`` (--lr x sqrt(width x --warmup)), whose numbers no one typed.
    A factor that differs only because the width or --warmup did is left to those lines."""
    out = []
    for line in diffs:
        if line.startswith("train.peak_learning_rate"):
            continue  # derived from lr_factor, said below; runs written before it lack it
        if old["train"]["schedule"] != new["train"]["schedule"] and line.startswith(_SCHEDULE_SETTINGS):
            continue  # the schedule's own line says it; each schedule ignores the other's settings
        if line.startswith("train.lr_factor") and old["train"]["schedule"] == new["train"]["schedule"] == "rsqrt":
            # Both are whole config dicts (RunConfig.to_dict): an rsqrt run's has both fields.
            was, now = (peak_lr(TrainConfig(lr_factor=c["train"]["lr_factor"], warmup_steps=c["train"]["warmup_steps"]),
                                c["model"]["embed_size"]) for c in (old, new))
            if not math.isclose(was, now, rel_tol=1e-9):
                out.append(f"--lr (the schedule's peak): {was:.6g} in the run, {now:.6g} now")
            continue
        out.append(line)
    return out


def _init_from_differences(was, now):
    """``--init-from`` as it differs between the run (config.json's ``init_from``: absent for
    a run from a random init, runs before the option included) and the options now. A resume
    takes its parameters from the checkpoints, but only of the run the command describes."""
    if was == now:
        return []
    if was is None:
        return [f"--init-from: the run started from a random init, not from {now['path']} (a run's first step "
                f"is its only chance to take weights; start a new run with another --out)"]
    if now is None:
        return [f"--init-from: the run started from {was['path']} (sha256 {was['sha256'][:12]}...); give the same "
                f"--init-from to resume it"]
    if was["path"] != now["path"]:
        return [f"--init-from: {was['path']} in the run, {now['path']} now"]
    return [f"--init-from {now['path']}: the file changed since the run started from it (sha256 "
            f"{now['sha256'][:12]}..., recorded {was['sha256'][:12]}...)"]


_SCHEDULE_SETTINGS = ("train.lr_factor", "train.warmup_steps", "train.learning_rate", "train.decay_steps")

# Settings of the run's config that no option names directly: what sets them.
_SET_BY = {
    "train.lr_factor": "set by --lr: --lr x sqrt(width x --warmup), the rsqrt schedule's factor",
    "train.learning_rate": "--lr",
    "train.schedule": "--schedule",
    "train.warmup_steps": "--warmup",
    "train.decay_steps": "--steps of a --schedule cosine run, where its learning rate reaches 0",
    "data.length_multiple": "--length-multiple",
    "data.columns": "--columns",
    "data.tokenizer_from": "--tokenizer-from",
    "data.max_len": "--max-len",
    "model.tie_embeddings": "--tie-embeddings",
    "train.ema_decay": "--ema",
    "evaluation.best_metric": "--best-metric",
    "evaluation.beam_size": "--eval-beam-size",
    "evaluation.length_penalty": "--eval-length-penalty",
    "batch_size": "--batch-size",
    "accumulate": "--accumulate",
    "max_tokens": "--max-tokens",
    "dtype": "--dtype",
    "scan_layers": "--scan-layers",
    "remat": "--remat",
    "train.seed": "--seed",
    "train.label_smoothing": "--label-smoothing",
    "train.clip_norm": "--clip-norm",
    "train.weight_decay": "--weight-decay",
    "model.dropout": "--dropout, or --preset's",
    "model.embed_size": "--embed-size, or --preset's",
    "model.heads": "--heads, or --preset's",
    "model.num_layers": "--layers, or --preset's",
    "model.ffn_dim": "--ffn-dim, or --preset's",
    "data.task": "--task",
    "data.vocab_size": "--vocab-size",
    "data.min_len": "--min-len",
    "data.eval_sequences": "--eval-sequences",
    "data.eval_decode_lines": "--eval-decode-lines",
    "data.eval_pairs": "--valid-size",
    "data.holdout": "--valid-size, held out of --data when no --valid is given",
    "data.tokenizer": "--tokenizer",
    "data.tokenizer_vocab_size": "--vocab-size",
    "data.shared_vocab": "--shared-vocab",
}

# The data settings --tokenizer-from's run sets; `_differences` lines start "KEY: " or "KEY (why): ".
_SET_WITH_TOKENIZER_FROM = ("data.tokenizer", "data.tokenizer_vocab_size", "data.shared_vocab")


def _setting(line):
    return line.split(":", 1)[0].split(" (", 1)[0]


def run_holding(path):
    """The training run whose checkpoints ``path`` is (runs/r for runs/r/checkpoints/3, for
    runs/r/checkpoints itself, or for an item of a checkpoint, runs/r/checkpoints/3/default),
    as the user wrote it; None for any other path, and for one that does not exist (a mistyped
    step is no checkpoint). For the errors that tell a user who gave a checkpoint to give its run
    (generate, evaluate, parity)."""
    path = Path(path)
    if not path.exists():
        return None
    for run in (path.parent, path.parent.parent, path.parent.parent.parent):
        if RunDir(run).exists():
            checkpoints = RunDir(run).checkpoints.absolute()
            if checkpoints in (path.absolute(), path.absolute().parent, path.absolute().parent.parent):
                return run
            # One checkpoint of OUT/best (or an item of it): OUT/best itself is what to give.
            if RunDir(run).best.absolute() in (path.absolute().parent, path.absolute().parent.parent):
                return run / BEST_NAME
    return None


def best_of(path):
    """The run (as the user wrote it) whose best checkpoint ``path`` names: runs/r for runs/r/best
    (``train --best-metric``'s OUT/best); None for any other path, a run itself included."""
    path = Path(path)
    if path.name == BEST_NAME and not RunDir(path).exists() and RunDir(path.parent).exists():
        return path.parent
    return None


WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
_CONVERT = "`python -m parity convert` converts weights between torch and Flax (README, 'Proving the port')"


def not_a_run(path):
    """What ``path`` (a Path) is, when it is no run a user meant to give ``evaluate`` or
    ``generate``, in words with what to give instead; None when it is nothing known."""
    if path.is_file() and path.suffix in WEIGHT_SUFFIXES:
        return (f"a weights file (torch or Flax), not a run directory: generate and evaluate read a run made by "
                f"`flaxformer-mini train` (its config.json, tokenizers and checkpoints); {_CONVERT}")
    run = run_holding(path)
    if run is not None:
        if run.name == BEST_NAME and best_of(run) is not None:
            return f"this is the best checkpoint's step directory of a training run; give {run}"
        what = "the checkpoints directory" if path.parent == run else "one checkpoint"
        return f"this is {what} of a training run; give the run directory ({run})"
    if path.is_dir() and (path / "params").is_dir() and (path / "config").is_dir():
        return (f"Flax parameters (an orbax directory, as `parity convert` writes), not a run made by "
                f"`flaxformer-mini train`; {_CONVERT}")
    return None
