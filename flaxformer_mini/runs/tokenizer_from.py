"""``flaxformer-mini train --data FILE --tokenizer-from RUN``: a text run that numbers its
tokens as the earlier run RUN did, instead of training tokenizers on its own --data.

Fine-tuning needs it. Row i of a trained embedding (and of the output projection) belongs to
token i of the tokenizer it was trained with; tokenizers trained on the new data number
their tokens by that data, so a run started ``--init-from`` those weights would train on
scrambled ids, silently where the vocabulary sizes happen to agree (a ``--vocab-size``
subword run). RUN is a text run's directory (``train --data``, the run the weights came
from, or any run with the vocabulary wanted): its config.json gives the tokenizer kind and
whether it is shared, and its recorded checksums vouch for its files. The new run saves the
same files as its own and records RUN's path.

A resumed run reads its own copies (checked against its config.json), never RUN's: RUN is
only compared with them, as ``--init-from``'s file is. Gone: a note. Elsewhere with the same
files: moved, a note. Other files: refused by name (the run would go on with a vocabulary
other than the one asked for).
"""

import os

from flaxformer_mini.runs.config import DataConfig, RunConfigError
from flaxformer_mini.runs.directory import RunDir, comparable_tokenizer_bytes, run_holding, sha256

OPTION = "--tokenizer-from"
# The DataConfig fields --tokenizer-from sets: RUN's tokenizer settings and RUN's path.
FIELDS = ("tokenizer", "tokenizer_vocab_size", "shared_vocab", "tokenizer_from")


class TokenizerFromError(RunConfigError):
    """A --tokenizer-from run that cannot give its tokenizers (not a text run, files missing
    or changed), or that is not the one a resumed run started from."""


def settings(path, out, echo):
    """The DataConfig fields (``FIELDS``) of the run in ``out`` with ``--tokenizer-from path``:
    RUN's tokenizer settings for a new run; for a resumed run that started from a RUN, its own
    (see the module docstring: RUN gone, moved or changed)."""
    absolute = os.path.abspath(path)
    own = RunDir(out)
    if not own.exists():  # a new run
        return _settings_of(path, absolute)
    recorded_data = own.load_config().data  # a damaged config.json: an error naming it
    if recorded_data.tokenizer_from is None:
        # It trained its own tokenizers; a run written before this option loads with None too,
        # and its config.json lacks the key, which the config check would pass over: refused here.
        raise TokenizerFromError(
            f"{OPTION} {path}: the run in {out} trained its own tokenizers on its --data; a run's tokenizers are "
            f"chosen when it starts: resume without {OPTION}, or train a new run with another --out. Nothing was "
            f"overwritten.")
    recorded = {name: getattr(recorded_data, name) for name in FIELDS}
    missing = [p.name for _, p in own.tokenizer_files(recorded_data) if not p.exists()]
    if not os.path.exists(absolute) and absolute == recorded["tokenizer_from"]:
        if missing:
            raise TokenizerFromError(
                f"{OPTION} {path} is gone and the run in {out} lacks its own copies of its tokenizers "
                f"({', '.join(missing)}): restore either")
        echo(f"note: {OPTION} {path} is gone; the run resumes with its own copies of its tokenizers")
        return recorded
    found = _settings_of(path, absolute)  # another path that is not there: no such directory
    theirs = load(_data(found))
    ours_recorded = own.recorded_checksums() if missing else {}  # what the run's missing copies held
    if any(ours_recorded.get(file.name) not in (None, sha256(file.read_bytes()))
           for _, file in RunDir(absolute).tokenizer_files(recorded_data) if file.name in missing):
        raise TokenizerFromError(
            f"{OPTION} {path}: its tokenizers are not the ones the run in {out} started from (those of "
            f"{recorded['tokenizer_from']}), whose copies the run lacks ({', '.join(missing)}); restore them, or "
            f"give {OPTION} a run that holds them. Nothing was written.")
    if missing and absolute != recorded["tokenizer_from"]:
        # Copied again only from the recorded path, which the run's config names (the data a
        # resumed run reads must be the config's): moved, the user copies them.
        raise TokenizerFromError(
            f"the run in {out} lacks its own copies of its tokenizers ({', '.join(missing)}), and {OPTION} {path} is "
            f"not where the run recorded that run ({recorded['tokenizer_from']}): copy {', '.join(missing)} from "
            f"{path} into {out}, or give {OPTION} at the recorded path. Nothing was written.")
    # The run's own copies, where they are there: where not, load_data copies RUN's again, and
    # saving them checks them against the sha256s the run recorded.
    ours = theirs if missing else own.load_vocabularies(recorded_data)
    if (found["tokenizer"], found["shared_vocab"]) != (recorded["tokenizer"], recorded["shared_vocab"]) \
            or _comparable(theirs) != _comparable(ours):
        raise TokenizerFromError(
            f"{OPTION} {path}: its tokenizers are not the ones the run in {out} started from (those of "
            f"{recorded['tokenizer_from']}); resume with that run's tokenizers, or train a new run with another "
            f"--out. Nothing was overwritten.")
    if absolute != recorded["tokenizer_from"]:
        echo(f"note: {OPTION} {path} holds the tokenizers the run started from (recorded at "
             f"{recorded['tokenizer_from']})")
    return recorded


def load(data):
    """(source, target) tokenizers of run ``data.tokenizer_from`` for a new run of ``data``
    (a DataConfig with ``settings``'s fields), each file checked against RUN's recorded
    sha256. Each carries the bytes it was read from (``file_bytes``), which the new run saves
    (``run_dir.tokenizer_bytes``): its copies are RUN's files byte for byte (a unigram file
    written again from memory may differ in a float's last digit)."""
    run = RunDir(data.tokenizer_from)
    recorded = run.recorded_checksums()
    files = run.tokenizer_files(data)
    raw = []
    for _, file in files:
        if not file.exists():
            raise TokenizerFromError(f"{OPTION} {data.tokenizer_from}: that run's tokenizer file {file.name} is missing")
        raw.append(file.read_bytes())
        digest = sha256(raw[-1])
        if recorded.get(file.name) not in (None, digest):
            raise TokenizerFromError(
                f"{OPTION} {data.tokenizer_from}: {file.name} differs from the file that run recorded (sha256 "
                f"{digest[:12]}..., recorded {recorded[file.name][:12]}...): edited since it was written?")
    vocabs = run.load_vocabularies(data)
    for vocab, content in zip(vocabs[: len(files)], raw):  # one file, one object twice, when shared
        vocab.file_bytes = content
    return vocabs


def _settings_of(path, absolute):
    run_dir, wanted = RunDir(absolute), "it takes the directory of a text run made by `flaxformer-mini train --data`"
    if not os.path.exists(absolute):
        raise TokenizerFromError(f"{OPTION} {path}: no such directory ({wanted})")
    if not os.path.isdir(absolute):
        raise TokenizerFromError(f"{OPTION} {path}: a file, not a run's directory ({wanted})")
    if not run_dir.exists():
        holder = run_holding(path)
        raise TokenizerFromError(f"{OPTION} {path}: not a run directory (no config.json); " + (
            f"it is part of the run {holder}: give that" if holder is not None else wanted))
    data = run_dir.load_config().data  # a damaged config.json: an error naming it
    if data.kind != "tsv":
        raise TokenizerFromError(f"{OPTION} {path}: a synthetic run (--task {data.task}) has no tokenizers; it "
                                 f"takes a text run's directory")
    return {"tokenizer": data.tokenizer, "tokenizer_vocab_size": data.tokenizer_vocab_size,
            "shared_vocab": data.shared_vocab, "tokenizer_from": absolute}


def _data(fields):
    """The DataConfig of a text run with ``fields`` (``FIELDS``): what RunDir.tokenizer_files
    and load_vocabularies read."""
    return DataConfig(kind="tsv", **fields)


def _comparable(vocabs):
    # Loaded tokenizers compared as saved (a unigram score may not read back bit for bit).
    return [comparable_tokenizer_bytes(v) for v in vocabs]
