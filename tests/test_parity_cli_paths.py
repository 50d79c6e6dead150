"""`parity check` and `parity convert` and the paths they are given: Ctrl-C, an output that is
the input under another name, a report over a file of the run being checked, a checkpoint
whose suffix names the other kind.

Properties checked:
- Ctrl-C and SIGTERM exit 130 with one line, no traceback, and leave neither an output nor a
  temporary file or directory (a .safetensors file, an orbax directory, a --json report); a
  signal that comes while orbax writes is held until its threads are done, then delivered,
  and a second one (SIGTERM after Ctrl-C) ends the process at once with 130 and one line,
  orbax's staging directory removed first;
- IN and OUT that are one file under two names (``d/../x``, a symlink, a hard link) are
  refused before anything is read or written, even with --force; so is a --json onto the
  checkpoint being checked under another name, or onto the --config file (or a file of the
  --config run);
- an OUT or --json report that another process writes during the work is kept without
  --force (exit 2 naming it), not replaced;
- --json and --plot are written both or neither: a --plot file that appears during the work
  leaves no report, and a full disk while the plot is written under --force puts the report
  it replaced back; a Ctrl-C that comes while --force's renames put a file aside,
  put the files back after a first one, or remove those aside once all are written, is held
  until they are done: no file is left under its hidden .old name, and the outputs are the
  old ones or the new ones, whole; a Ctrl-C just as an output is renamed or linked into place
  leaves neither (or the earlier ones), and one while the replaced files are removed exits 130
  after saying both outputs were written, as they are;
- --json and --plot never replace a file of the training run being checked (its config.json,
  anything under checkpoints/, a text run's training and --valid files), even with --force,
  under any name (a hard link, a symlink, a path through ``..``); a new file beside them is
  written;
- `--help` names RUN/best, and the summary of a run trained with --ema says its moving
  average is what is read;
- a .safetensors file named .pt, and a torch checkpoint (zip or legacy pickle) named
  .safetensors, are refused naming what the file is and the name to give it.

Checkpoints are torch_ref's, of a 1-layer tiny model; every call is ``parity.cli.main``
in-process, and all but one stop before any model runs.
"""

import os
import signal
from pathlib import Path

import pytest
import torch

import torch_ref
from flaxformer_mini import files
from parity.cli import main
from parity.checkpoint_io import save_state_dict

from helpers import untrained_run

CONFIG = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=11, max_len=6, embed_size=30, heads=5,
              num_layers=1, dropout=0.1)


@pytest.fixture(scope="module")
def state_dict():
    torch.manual_seed(3)
    return torch_ref.Transformer(**CONFIG).state_dict()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A training run, made once: the tests refuse to write over its files (one writes a report
    of its own beside them)."""
    return untrained_run(tmp_path_factory.mktemp("run") / "run")


@pytest.fixture
def pt(state_dict, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(state_dict, path)
    return path


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


def refused(capsys, message):
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- Ctrl-C


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("out", ["model.safetensors", "model_orbax"])
def test_ctrl_c_during_convert_exits_130_in_one_line_leaving_no_output_nor_temporary(pt, tmp_path, out, monkeypatch,
                                                                                     capsys):
    # Pressed while the bytes are written: after the temporary file (or staging directory) exists.
    if out.endswith(".safetensors"):
        monkeypatch.setattr("flaxformer_mini.files.os.fsync", _interrupt)
    else:
        monkeypatch.setattr("parity.flax_io._nest", _interrupt)
    assert main(["convert", str(pt), str(tmp_path / out), "--heads", "5"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["parity convert: stopped by Ctrl-C; no output was left half-written"], err
    assert listing(tmp_path) == ["model.pt"]


def test_ctrl_c_during_check_exits_130_in_one_line_writing_no_report(pt, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("parity.check.check_twins", _interrupt)
    report = tmp_path / "report.json"
    assert main(["check", "--torch-checkpoint", str(pt), "--heads", "5", "--json", str(report)]) == 130
    assert "parity check: stopped by Ctrl-C" in refused(capsys, "no output was left half-written")
    assert listing(tmp_path) == ["model.pt"]


def test_sigterm_during_convert_exits_130_in_one_line_leaving_no_output_nor_temporary(pt, tmp_path, monkeypatch,
                                                                                    capsys):
    monkeypatch.setattr("flaxformer_mini.files.os.fsync", lambda fd: signal.raise_signal(signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    assert main(["convert", str(pt), str(tmp_path / "model.safetensors"), "--heads", "5"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["parity convert: stopped by SIGTERM; no output was left half-written"], err
    assert listing(tmp_path) == ["model.pt"]
    assert signal.getsignal(signal.SIGTERM) is before  # main's handler is gone with it


@pytest.mark.parametrize("signum, by", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_while_orbax_writes_is_held_until_it_is_done_then_stops_leaving_nothing(pt, tmp_path, signum, by,
                                                                                          monkeypatch, capsys,
                                                                                          ctrl_c_raises):
    import parity.flax_io

    real_nest, finished = parity.flax_io._nest, []

    def nest_then_signal(flat):
        signal.raise_signal(signum)  # in the middle of the write: held, so orbax goes on
        tree = real_nest(flat)
        finished.append(True)
        return tree

    monkeypatch.setattr(parity.flax_io, "_nest", nest_then_signal)
    assert main(["convert", str(pt), str(tmp_path / "model_orbax"), "--heads", "5"]) == 130
    assert finished == [True]
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"parity convert: stopped by {by}; no output was left half-written"], err
    assert listing(tmp_path) == ["model.pt"]  # neither the directory nor orbax's staging one


class _Exited(BaseException):
    """os._exit's stand-in: unwinds instead of ending the test's process."""


def test_a_second_signal_while_orbax_writes_ends_the_process_at_once_leaving_nothing(pt, tmp_path, monkeypatch,
                                                                                      capsys, ctrl_c_raises):
    import parity.flax_io

    real_nest, finished, exits = parity.flax_io._nest, [], []

    def nest_then_two_signals(flat):
        signal.raise_signal(signal.SIGINT)  # held
        signal.raise_signal(signal.SIGTERM)  # insisting: the process ends here
        finished.append(True)
        return real_nest(flat)

    def exit_now(code):
        exits.append((code, capsys.readouterr().err, listing(tmp_path)))  # as the process ends
        raise _Exited

    monkeypatch.setattr(parity.flax_io, "_nest", nest_then_two_signals)
    monkeypatch.setattr("parity.output.os._exit", exit_now)
    with pytest.raises((_Exited, KeyboardInterrupt)):  # what unwinds after the stand-in
        main(["convert", str(pt), str(tmp_path / "model_orbax"), "--heads", "5", "--debug"])
    assert finished == []
    (code, err, left), = exits
    assert code == 130 and left == ["model.pt"]  # the staging directory removed before the exit
    assert err.strip().splitlines() == ["parity: stopped at once by a second SIGTERM while orbax was writing; "
                                        "no output was left half-written"], err


def test_a_signal_the_process_ignores_stays_ignored_while_orbax_writes(tmp_path, monkeypatch):
    from parity.output import _signals_deferred

    exits = []
    monkeypatch.setattr("parity.output.os._exit", exits.append)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell script's background job starts
    try:
        with _signals_deferred(tmp_path / "staging"):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert exits == []


# ----------------------------------------------------------------------------- one file, two names


def test_in_and_out_that_are_one_file_under_two_names_are_refused_even_with_force(state_dict, tmp_path, capsys):
    original = tmp_path / "model.safetensors"
    save_state_dict(state_dict, original, config=CONFIG)
    before = original.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.safetensors").symlink_to(original)
    os.link(original, tmp_path / "hard.safetensors")
    for source, out in [(original, tmp_path / "sub" / ".." / "model.safetensors"),
                        (tmp_path / "link.safetensors", original),
                        (tmp_path / "hard.safetensors", original)]:
        assert main(["convert", str(source), str(out), "--force"]) == 2
        refused(capsys, f"IN and OUT are the same path ({source})")
    assert original.read_bytes() == before  # still the torch state dict, not its Flax conversion


def test_a_report_onto_the_checkpoint_under_another_name_is_refused_even_with_force(pt, tmp_path, capsys):
    os.link(pt, tmp_path / "hard.pt")
    before = pt.read_bytes()
    for option in ("--json", "--plot"):
        assert main(["check", "--torch-checkpoint", str(pt), "--heads", "5", option, str(tmp_path / "hard.pt"),
                     "--force"]) == 2
        refused(capsys, f"{option} {tmp_path / 'hard.pt'}: is the checkpoint being checked")
    assert pt.read_bytes() == before


def test_a_report_onto_the_config_file_or_a_file_of_the_config_run_is_refused_even_with_force(pt, run, tmp_path,
                                                                                               capsys):
    config = tmp_path / "config.json"
    config.write_text('{"heads": 5}')
    run_config = (run / "config.json").read_bytes()
    for given, path, what in [(config, config, "the --config file"),
                              (run, run / "config.json", "one of the files of the --config run"),
                              (run / "config.json", run / "config.json", "the --config file")]:
        assert main(["check", "--torch-checkpoint", str(pt), "--config", str(given), "--json", str(path),
                     "--force"]) == 2
        refused(capsys, f"--json {path}: is {what} ({given}), which --force would replace too")
    assert config.read_text() == '{"heads": 5}' and (run / "config.json").read_bytes() == run_config


# A --plot file that appears during the work: test_json_and_plot_are_written_both_or_neither.
@pytest.mark.parametrize("out", ["model.safetensors", "back.pt", "report.json"])
def test_an_output_that_appears_during_the_work_is_kept_without_force(pt, tmp_path, out, monkeypatch, capsys):
    # Another process writes OUT after the check before the work (it was not there) and before
    # the write: without --force it is kept, and the conversion or report is not written.
    import parity.check
    import parity.convert

    path = tmp_path / out
    if out == "back.pt":
        source = tmp_path / "model.safetensors"
        assert main(["convert", str(pt), str(source), "--heads", "5"]) == 0
        arguments, function = ["convert", str(source), str(path)], "state_dict_from_flax_params"
    elif out.startswith("report"):
        option = "--json" if out.endswith(".json") else "--plot"
        source, arguments, function = pt, ["check", "--torch-checkpoint", str(pt), "--heads", "5", "--batch", "1",
                                           option, str(path)], None
    else:
        source, arguments, function = pt, ["convert", str(pt), str(path), "--heads", "5"], "flax_params_from_state_dict"
    module, name = (parity.convert, function) if function else (parity.check, "check_twins")
    real = getattr(module, name)

    def meanwhile(*args, **kwargs):
        path.write_text("another process's file")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, meanwhile)
    assert main(arguments) == 2
    refused(capsys, f"{path}: already exists; nothing was written")
    assert path.read_text() == "another process's file"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_json_and_plot_are_written_both_or_neither(pt, tmp_path, monkeypatch, capsys):
    # The --plot file appears during the work (no --force): the report, ready first, is not left either.
    import parity.check

    report, image = tmp_path / "report.json", tmp_path / "report.png"
    real, checked = parity.check.check_twins, []

    def meanwhile(*args, **kwargs):
        image.write_text("another process's file")
        checked.append(real(*args, **kwargs))
        return checked[0]

    monkeypatch.setattr(parity.check, "check_twins", meanwhile)
    arguments = ["check", "--torch-checkpoint", str(pt), "--heads", "5", "--batch", "1", "--json", str(report),
                 "--plot", str(image)]
    assert main(arguments) == 2
    refused(capsys, f"{image}: already exists; nothing was written")
    assert listing(tmp_path) == ["model.pt", "report.png"] and image.read_text() == "another process's file"
    # With --force, the disk fills while the plot is written: the report it replaced is back.
    monkeypatch.setattr(parity.check, "check_twins", lambda *args, **kwargs: checked[0])  # the same check again
    report.write_text("an earlier report")
    writes = []

    def second_write_fails(fd):
        writes.append(fd)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("flaxformer_mini.files.os.fsync", second_write_fails)
    assert main([*arguments, "--force"]) == 2
    refused(capsys, "no space left on the device")
    assert listing(tmp_path) == ["model.pt", "report.json", "report.png"]
    assert report.read_text() == "an earlier report" and image.read_text() == "another process's file"


def write_both_stopped_by_ctrl_c(report, image, replace):
    """``write_files_atomic`` of a new report and plot, which the test's patches make a Ctrl-C
    arrive in (under the ``ctrl_c_raises`` fixture)."""
    import parity.output

    with pytest.raises(KeyboardInterrupt):
        parity.output.write_files_atomic([(report, "a new report"), (image, b"a new plot")], replace=replace)


@pytest.mark.parametrize("when", ["a file is put aside", "the files go back", "the files aside are removed"])
def test_a_signal_while_force_moves_files_is_held_until_the_outputs_are_whole(tmp_path, monkeypatch, when,
                                                                                 ctrl_c_raises):
    # A Ctrl-C raised inside one of write_files_atomic's renames (in "the files go back", the
    # second one: the first stopped the plot's write). Delivered there, it would cut the renames
    # short, leaving a file under its hidden .old name; held, it comes once they are done.
    report, image = tmp_path / "report.json", tmp_path / "report.png"
    report.write_bytes(b"an earlier report")
    image.write_bytes(b"an earlier plot")
    real_write, real_replace, real_unlink, signalled = files.write_atomic, os.replace, os.unlink, []

    def second_write_stopped(path, data, replace=True):
        if Path(path) == image and when == "the files go back":
            raise KeyboardInterrupt  # the first Ctrl-C
        real_write(path, data, replace)

    def signal_once(at):
        if at and not signalled:
            signalled.append(when)
            signal.raise_signal(signal.SIGINT)

    def replace(source, destination):
        signal_once(when == "the files go back" and str(source).endswith(".old"))  # before the first goes back
        real_replace(source, destination)
        signal_once(when == "a file is put aside" and str(destination).endswith(".old"))  # once it is aside

    def unlink(path, *args, **kwargs):
        signal_once(when == "the files aside are removed" and str(path).endswith(".old"))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(files, "write_atomic", second_write_stopped)
    monkeypatch.setattr("parity.output.os.replace", replace)
    monkeypatch.setattr("parity.output.os.unlink", unlink)
    write_both_stopped_by_ctrl_c(report, image, replace=True)
    assert signalled == [when]  # the signal came where the test means it to
    assert listing(tmp_path) == ["report.json", "report.png"]  # no .old file, no temporary one
    if when == "the files aside are removed":  # all written before the signal: the new outputs, whole
        assert (report.read_bytes(), image.read_bytes()) == (b"a new report", b"a new plot")
    else:
        assert (report.read_bytes(), image.read_bytes()) == (b"an earlier report", b"an earlier plot")


@pytest.mark.parametrize("signalled_at", ["report.json", "report.png"])
@pytest.mark.parametrize("replace, earlier", [(False, False), (True, False), (True, True)],
                         ids=["new files", "force, new files", "force over earlier files"])
def test_a_signal_just_as_an_output_goes_into_place_leaves_neither_or_the_earlier_ones(tmp_path, monkeypatch,
                                                                                       signalled_at, replace,
                                                                                       earlier, ctrl_c_raises):
    # Ctrl-C just after write_atomic's rename (--force) or link into place: the file is there,
    # and counted as written, so taken away again with the others.
    report, image = tmp_path / "report.json", tmp_path / "report.png"
    if earlier:
        report.write_bytes(b"an earlier report")
        image.write_bytes(b"an earlier plot")
    real_replace, real_link, signalled = os.replace, os.link, []

    def signal_once(destination):
        if Path(destination).name == signalled_at and not signalled:
            signalled.append(signalled_at)
            signal.raise_signal(signal.SIGINT)

    def replace_then_signal(source, destination):
        real_replace(source, destination)
        signal_once(destination)

    def link_then_signal(source, destination):
        real_link(source, destination)
        signal_once(destination)

    monkeypatch.setattr("parity.output.os.replace", replace_then_signal)
    monkeypatch.setattr("parity.output.os.link", link_then_signal)
    write_both_stopped_by_ctrl_c(report, image, replace=replace)
    assert signalled == [signalled_at]
    if earlier:  # no .old file, no temporary one
        assert listing(tmp_path) == ["report.json", "report.png"]
        assert (report.read_bytes(), image.read_bytes()) == (b"an earlier report", b"an earlier plot")
    else:
        assert listing(tmp_path) == []


def test_a_ctrl_c_while_the_replaced_outputs_are_removed_says_the_outputs_were_written(pt, tmp_path, monkeypatch,
                                                                                       capsys, ctrl_c_raises):
    # Both new outputs are complete when Ctrl-C comes (the files they replaced are being
    # removed): exit 130, but they are said to be written, as they are.
    import parity.check

    report, image = tmp_path / "report.json", tmp_path / "report.png"
    report.write_text("an earlier report")
    image.write_text("an earlier plot")
    real_unlink, signalled = os.unlink, []

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".old") and not signalled:
            signalled.append(Path(path).name)
            signal.raise_signal(signal.SIGINT)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr("parity.output.os.unlink", unlink)
    real, checked = parity.check.check_twins, []
    monkeypatch.setattr(parity.check, "check_twins", lambda *a, **k: checked.append(real(*a, **k)) or checked[0])
    arguments = ["check", "--torch-checkpoint", str(pt), "--heads", "5", "--batch", "1", "--json", str(report),
                 "--plot", str(image), "--force"]
    assert main(arguments) == 130
    assert len(signalled) == 1 and signalled[0].startswith(".report.json.")
    out, err = capsys.readouterr()
    assert out.splitlines()[-2:] == [f"report written to {report}", f"plot written to {image}"], out
    assert err.strip().splitlines()[-1] == "parity check: stopped by Ctrl-C; no output was left half-written", err
    assert "Traceback" not in err
    assert listing(tmp_path) == ["model.pt", "report.json", "report.png"]
    assert '"passed": true' in report.read_text() and image.read_bytes().startswith(b"\x89PNG")
    # The same Ctrl-C just as the plot goes into place, before the outputs are all there:
    # neither is left, and none is said to be written.
    monkeypatch.setattr(parity.check, "check_twins", lambda *a, **k: checked[0])  # the same check again
    real_replace = os.replace

    def replace(source, destination):
        real_replace(source, destination)
        if Path(destination) == image and len(signalled) == 1:
            signalled.append(image.name)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr("parity.output.os.replace", replace)
    report.write_text("an earlier report")
    image.write_text("an earlier plot")
    assert main(arguments) == 130
    assert signalled[1:] == ["report.png"]
    out, err = capsys.readouterr()
    assert "written to" not in out, out
    assert err.strip().splitlines()[-1] == "parity check: stopped by Ctrl-C; no output was left half-written", err
    assert "Traceback" not in err
    assert listing(tmp_path) == ["model.pt", "report.json", "report.png"]
    assert (report.read_text(), image.read_text()) == ("an earlier report", "an earlier plot")


# ----------------------------------------------------------------------------- the run's own files


def test_check_never_replaces_a_file_of_the_run_it_checks_even_with_force(run, tmp_path, capsys):
    config = (run / "config.json").read_bytes()
    step = next((run / "checkpoints").iterdir())
    # The run's files under other names: a hard link, a symlink, a path through `..`, and a
    # hard link to a file of a checkpoint.
    os.link(run / "config.json", tmp_path / "hard.json")
    (tmp_path / "link.json").symlink_to(run / "metrics.jsonl")
    os.link(next(p for p in step.rglob("*") if p.is_file()), tmp_path / "weights.json")
    for option, path in [("--json", run / "config.json"), ("--json", step / "report.json"),
                         ("--plot", run / "checkpoints" / "report.png"), ("--json", tmp_path / "hard.json"),
                         ("--json", tmp_path / "link.json"), ("--json", step / ".." / ".." / "config.json"),
                         ("--json", tmp_path / "weights.json")]:
        assert main(["check", "--torch-checkpoint", str(run), option, str(path), "--force"]) == 2
        refused(capsys, f"{option} {path}: is one of the files of the training run being checked ({run})")
    assert (run / "config.json").read_bytes() == config
    assert not (step / "report.json").exists() and not (run / "checkpoints" / "report.png").exists()
    # A report of its own beside the run's files is the user's to write, and to replace.
    report = run / "parity.json"
    report.write_text("an earlier report")
    assert main(["check", "--torch-checkpoint", str(run), "--batch", "1", "--json", str(report), "--force"]) == 0
    assert '"passed": true' in report.read_text()


def test_check_never_replaces_a_text_runs_training_or_valid_file_even_with_force(trained_run, capsys):
    # A text run reads its --data and --valid files on every resume and evaluation; a report
    # written over one would lose the user's corpus (helpers.SHARED_RUNS' char run, read only).
    d = trained_run("char_4_steps")
    for data in (d / "train.tsv", d / "valid.tsv"):
        before = data.read_bytes()
        assert main(["check", "--torch-checkpoint", str(d / "run"), "--json", str(data), "--force"]) == 2
        refused(capsys, f"--json {data}: is one of the files of the training run being checked ({d / 'run'})")
        assert data.read_bytes() == before


def test_help_and_the_summary_say_which_weights_of_a_run_are_read(tmp_path, capsys):
    for command in ("check", "convert"):
        assert main([command, "--help"]) == 0
        assert "RUN/best" in capsys.readouterr().out
    run = untrained_run(tmp_path / "run", ema_decay=0.9)
    assert main(["convert", str(run), str(tmp_path / "model.pt")]) == 0
    out = capsys.readouterr().out
    assert f"{run} (training run, its newest checkpoint, its moving average (--ema 0.9): step 0)" in out, out


# ----------------------------------------------------------------------------- misnamed files


def test_a_checkpoint_whose_suffix_names_the_other_kind_is_named_for_what_it_is(state_dict, tmp_path, capsys):
    safetensors_as_pt = tmp_path / "a.pt"
    save_state_dict(state_dict, tmp_path / "a.safetensors", config=CONFIG)
    (tmp_path / "a.safetensors").rename(safetensors_as_pt)
    zip_as_safetensors, legacy_as_safetensors = tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    torch.save(state_dict, zip_as_safetensors)
    torch.save(state_dict, legacy_as_safetensors, _use_new_zipfile_serialization=False)
    cases = [(safetensors_as_pt, "not a torch checkpoint; its first bytes say it is a .safetensors file: "
                                 "rename it to a.safetensors"),
             (zip_as_safetensors, "not a .safetensors file; its first bytes say it is a torch checkpoint "
                                  "(torch.save's zip format): rename it to b.pt"),
             (legacy_as_safetensors, "not a .safetensors file; its first bytes say it is a torch checkpoint "
                                     "(torch.save's legacy pickle format): rename it to c.pt")]
    for path, message in cases:
        out = tmp_path / ("out.safetensors" if path.suffix == ".pt" else "out.pt")
        assert main(["convert", str(path), str(out), "--heads", "5"]) == 2
        refused(capsys, f"{path}: {message}")
        assert main(["check", "--torch-checkpoint", str(path), "--heads", "5"]) == 2
        refused(capsys, f"{path}: {message}")
        assert not out.exists()
