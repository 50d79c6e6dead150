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

from flaxformer_mini.run_config import RunConfigError
from flaxformer_mini.run_dir import RunDir, comparable_tokenizer_bytes

OPTION = "--tokenizer-from"
# The DataConfig fields --tokenizer-from sets, and the options that would set them otherwise.
FIELDS = {"tokenizer": "--tokenizer", "tokenizer_vocab_size": "--vocab-size", "shared_vocab": "--shared-vocab"}


class TokenizerFromError(RunConfigError):
    """A --tokenizer-from run that cannot give its tokenizers (not a text run, files missing
    or changed), or that is not the one a resumed run started from."""


def settings(path, out, echo):
    """The DataConfig fields (``FIELDS`` and ``tokenizer_from``) of the run in ``out`` with
    ``--tokenizer-from path``: RUN's tokenizer settings for a new run; for a resumed run that
    started from a RUN, its own (see the module docstring: RUN gone, moved or changed)."""
    absolute = os.path.abspath(path)
    recorded = _recorded(out)
    if recorded is None:  # a new run, or one that trained its own tokenizers (refused by the config check)
        return _settings_of(path, absolute)
    if not os.path.exists(absolute):
        echo(f"note: {OPTION} {path} is gone; the run resumes with its own copies of its tokenizers")
        return recorded
    found = _settings_of(path, absolute)
    if (found["tokenizer"], found["shared_vocab"]) != (recorded["tokenizer"], recorded["shared_vocab"]) \
            or _comparable(load(_Data(found))) != _comparable(RunDir(out).load_vocabularies(_Data(recorded))):
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
    checksums."""
    try:
        return RunDir(data.tokenizer_from).load_vocabularies(data)
    except FileNotFoundError as e:
        raise TokenizerFromError(f"{OPTION} {data.tokenizer_from}: {e}") from None
    except RunConfigError as e:  # a file that differs from what RUN recorded
        raise TokenizerFromError(f"{OPTION}: {e}") from None


def _settings_of(path, absolute):
    run_dir = RunDir(absolute)
    if not os.path.isdir(absolute):
        raise TokenizerFromError(f"{OPTION} {path}: no such directory (it takes the directory of a text run made by "
                                 f"`flaxformer-mini train --data`)")
    if not run_dir.exists():
        raise TokenizerFromError(f"{OPTION} {path}: not a run directory (no config.json); it takes the directory "
                                 f"of a text run made by `flaxformer-mini train --data`")
    data = run_dir.load_config().data  # a damaged config.json: an error naming it
    if data.kind != "tsv":
        raise TokenizerFromError(f"{OPTION} {path}: a synthetic run (--task {data.task}) has no tokenizers; it "
                                 f"takes a text run's directory")
    return {"tokenizer": data.tokenizer, "tokenizer_vocab_size": data.tokenizer_vocab_size,
            "shared_vocab": data.shared_vocab, "tokenizer_from": absolute}


def _recorded(out):
    """The tokenizer settings of the run in ``out`` if it started with --tokenizer-from, else None."""
    run_dir = RunDir(out)
    if not run_dir.exists():
        return None
    data = run_dir.load_config().data
    if data.tokenizer_from is None:
        return None
    return {name: getattr(data, name) for name in (*FIELDS, "tokenizer_from")}


class _Data:
    """The fields RunDir.tokenizer_files and load_vocabularies read, and the RUN to read."""

    def __init__(self, fields):
        self.tokenizer, self.shared_vocab = fields["tokenizer"], fields["shared_vocab"]
        self.tokenizer_from = fields["tokenizer_from"]


def _comparable(vocabs):
    # Loaded tokenizers compared as saved (a unigram score may not read back bit for bit).
    return [comparable_tokenizer_bytes(v) for v in vocabs]
