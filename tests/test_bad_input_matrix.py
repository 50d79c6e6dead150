"""The bad-input matrix: every kind of user mistake or fault met at the command line gets its
exit code, a message that names the problem, no traceback, and nothing lost or half-written.

Each row sets up its case in a fresh directory (copying a finished tiny run where it needs
one), runs the CLI in-process, and checks:
- the exit code (2: unusable options, files or run directories; 1: a failed run; 0: handled
  with a warning);
- a regular expression the message must match (it names the file, line, option or limit);
- no "Traceback" in the output;
- every file that existed before is unchanged (and, for a refused `train`, nothing new).
"""

import json
import shutil
from pathlib import Path

import pytest

from flaxformer_mini.runs.directory import RunLock
from helpers import TINY_RUN, cli

GOOD_PAIRS = "a b c\tx y z\nb c\ty z\nc a\tz x\na\tx\n"
GOOD_TSV = GOOD_PAIRS * 2
# Texts whose bpe and unigram tokenizers, unlimited, learn 7 tokens a side: the finished text run's
# word vocabulary of GOOD_TSV, so that a run of one of them with ONE_LAYER_TEXT reuses that run's
# compiled steps (the cases check the note, not what was learnt).
BPE_TEXT_OF_7_TOKENS = "a\tx\n" * 8  # the 4 specials, a, ▁ and ▁a
UNIGRAM_TEXT_OF_7_TOKENS = "a b\tx y\n" * 8  # the 4 specials, ▁, a and b


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny synthetic run and a finished tiny text run, to copy per case."""
    root = tmp_path_factory.mktemp("finished")
    assert cli("train", *TINY_RUN, "--steps", "5", "--save-every", "5", "--out", str(root / "synthetic")).returncode == 0
    (root / "train.tsv").write_text(GOOD_TSV)
    # One layer on each side, as TINY_RUN (which says why), and tests/test_run_lifecycle.py's text runs.
    text = cli("train", "--data", str(root / "train.tsv"), "--out", str(root / "text"), "--preset", "tiny", "--layers", "1",
               "--steps", "3", "--batch-size", "4", "--max-len", "8", "--save-every", "3", "--no-progress", "--no-plot")
    assert text.returncode == 0, text.stderr
    return root


def snapshot(root: Path):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# The text runs a case trains to its end (exit 0): the finished text run's one layer, batch size and
# --max-len, so that each compiles at most a step of one layer (a run of the finished run's
# vocabulary reuses its compiled steps); what they check is the message, not the model.
ONE_LAYER_TEXT = ["--layers", "1", "--batch-size", "4", "--max-len", "8"]


def tsv(content: bytes | str):
    def setup(d, finished):
        (d / "train.tsv").write_bytes(content if isinstance(content, bytes) else content.encode())
        return ["train", "--data", str(d / "train.tsv"), "--out", str(d / "out"), "--preset", "tiny", "--steps", "2",
                "--no-progress", "--no-plot"]
    return setup


def train_option(*options):
    def setup(d, finished):
        return ["train", *TINY_RUN, "--steps", "2", "--out", str(d / "out"), *options]
    return setup


def copy_run(kind="synthetic", edit=None):
    """A copy of a finished run, edited by ``edit(run_dir)``; returns it."""
    def make(d, finished):
        run = d / "run"
        shutil.copytree(finished / kind, run)
        if kind == "text":
            shutil.copy(finished / "train.tsv", d / "train.tsv")
            config = json.loads((run / "config.json").read_text())
            config["data"]["train_path"] = str(d / "train.tsv")
            (run / "config.json").write_text(json.dumps(config, indent=2))
        if edit:
            edit(run)
        return run
    return make


def on_run(command, *args, kind="synthetic", edit=None, stdin=""):
    def setup(d, finished):
        run = copy_run(kind, edit)(d, finished)
        if command == "train":
            return ["train", *TINY_RUN, "--steps", "5", "--save-every", "5", "--out", str(run), *args]
        return [command, "--checkpoint", str(run), *args]
    setup.stdin = stdin
    return setup


def text_run_resumed(*options):
    """The finished text run resumed with its own options and ``options`` added."""
    def setup(d, finished):
        run = copy_run("text")(d, finished)
        return ["train", "--data", str(d / "train.tsv"), "--out", str(run), "--preset", "tiny", *ONE_LAYER_TEXT,
                "--steps", "5", "--save-every", "3", "--no-progress", "--no-plot", *options]
    return setup


def training_file_changed(d, finished):
    """The finished text run resumed after its training file was edited (a pair appended)."""
    command = text_run_resumed()(d, finished)
    with open(d / "train.tsv", "a") as f:
        f.write("a\tx\n")
    return command


def edit_json(name, change):
    def edit(run):
        data = json.loads((run / name).read_text())
        change(data)
        (run / name).write_text(json.dumps(data))
    return edit


def write(name, text):
    return lambda run: (run / name).write_text(text)


def damage_every_checkpoint(run):
    for p in (run / "checkpoints").rglob("*"):
        if p.is_file() and p.parent.name == "d":
            p.write_bytes(p.read_bytes()[:10])


def swap_two_words(data):
    data["tokens"][4], data["tokens"][5] = data["tokens"][5], data["tokens"][4]


def out_is_a_file(d, finished):
    (d / "out").write_text("my notes")
    return ["train", *TINY_RUN, "--steps", "2", "--out", str(d / "out")]


def out_not_a_run(d, finished):
    (d / "out").mkdir()
    (d / "out" / "notes.txt").write_text("mine")
    return ["train", *TINY_RUN, "--steps", "2", "--out", str(d / "out")]


def data_is_a_directory(d, finished):
    (d / "data").mkdir()
    return ["train", "--data", str(d / "data"), "--out", str(d / "out"), "--preset", "tiny"]


def data_missing(d, finished):
    return ["train", "--data", str(d / "nope.tsv"), "--out", str(d / "out"), "--preset", "tiny"]


def valid_missing(d, finished):
    (d / "train.tsv").write_text(GOOD_TSV)
    return ["train", "--data", str(d / "train.tsv"), "--valid", str(d / "nope.tsv"), "--out", str(d / "out")]


def valid_bad_line(d, finished):
    (d / "train.tsv").write_text(GOOD_TSV)
    (d / "valid.tsv").write_text("a b\n")
    return ["train", "--data", str(d / "train.tsv"), "--valid", str(d / "valid.tsv"), "--out", str(d / "out"),
            "--preset", "tiny", "--steps", "2"]


def valid_side_empty_once_normalised(d, finished):
    (d / "train.tsv").write_text(GOOD_TSV)
    (d / "valid.tsv").write_text("a b\tc\n\u2581\tc\n")
    return ["train", "--data", str(d / "train.tsv"), "--valid", str(d / "valid.tsv"), "--out", str(d / "out"),
            "--preset", "tiny", "--steps", "2", "--tokenizer", "char"]


def max_tokens_below_the_longest_example(d, finished):
    (d / "train.tsv").write_text(GOOD_TSV)  # the longest pair: 3 words + EOS, padded to 8 (the length multiple)
    return ["train", "--data", str(d / "train.tsv"), "--out", str(d / "out"), "--preset", "tiny", "--steps", "2",
            "--max-tokens", "3", "--no-progress", "--no-plot"]


def evaluate_output_into(where):
    """evaluate --output at an unusable path: refused before the held-out set is decoded."""
    def setup(d, finished):
        run = copy_run()(d, finished)
        (d / "a_directory").mkdir()
        return ["evaluate", "--checkpoint", str(run), "--output", str(d / where)]
    return setup


def evaluate_data(content: bytes | str, kind="synthetic", output=None):
    """evaluate --data test.tsv holding ``content`` (and --output ``output``, written first)."""
    def setup(d, finished):
        run = copy_run(kind)(d, finished)
        (d / "test.tsv").write_bytes(content if isinstance(content, bytes) else content.encode())
        args = ["evaluate", "--checkpoint", str(run), "--data", str(d / "test.tsv")]
        if output is not None:
            if output != "test.tsv":
                (d / output).write_text("my notes\n")
            args += ["--output", str(d / output)]
        return args
    return setup


def evaluate_data_missing(d, finished):
    return ["evaluate", "--checkpoint", str(copy_run()(d, finished)), "--data", str(d / "nope.tsv")]


def run_held_by_another_process(d, finished):
    run = copy_run()(d, finished)
    held = RunLock(run / ".lock")
    held.write_holder()
    run_held_by_another_process.held = held  # released by the test after the call
    return ["train", *TINY_RUN, "--steps", "5", "--save-every", "5", "--out", str(run)]


def no_checkpoint_yet(d, finished):
    run = copy_run()(d, finished)
    shutil.rmtree(run / "checkpoints")
    return ["evaluate", "--checkpoint", str(run)]


def init_weights(name="w.safetensors", change=None, **sizes):
    """A torch_ref state dict of TINY_RUN's model (or of ``sizes``) saved as ``name`` in the
    case's directory, edited by ``change(state_dict)``; returns its path."""
    def make(d):
        import torch
        import torch_ref
        from safetensors.torch import save_file

        torch.manual_seed(0)
        config = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=11, max_len=6, embed_size=30, heads=5,
                      num_layers=1, dropout=0.0)
        state_dict = torch_ref.Transformer(**{**config, **sizes}).state_dict()
        if change:
            change(state_dict)
        save_file(state_dict, d / name) if name.endswith(".safetensors") else torch.save(state_dict, d / name)
        return d / name
    return make


def init_from(make, run=None):
    """train --init-from FILE (made by ``make(d)``, or a path in d) into a new --out, or ``run``'s copy."""
    def setup(d, finished):
        path = make(d) if callable(make) else d / make
        if run is None:
            return train_option("--init-from", str(path))(d, finished)
        return on_run("train", "--init-from", str(path))(d, finished)
    return setup


def swapped_text(d):
    """GOOD_TSV with its columns swapped: words the finished text run's tokenizers never saw
    on either side."""
    (d / "swapped.tsv").write_text("".join(f"{t}\t{s}\n" for s, t in (line.split("\t") for line in GOOD_TSV.splitlines())))
    return d / "swapped.tsv"


def tokenizer_from_other_text(d, finished):
    run = copy_run("text")(d, finished)
    return ["train", "--data", str(swapped_text(d)), "--tokenizer-from", str(run), "--out", str(d / "out"),
            "--preset", "tiny", "--steps", "2", *ONE_LAYER_TEXT, "--no-progress", "--no-plot"]


def valid_in_other_words(d, finished):
    (d / "train.tsv").write_text(GOOD_TSV)
    return ["train", "--data", str(d / "train.tsv"), "--valid", str(swapped_text(d)), "--out", str(d / "out"),
            "--preset", "tiny", "--steps", "2", *ONE_LAYER_TEXT, "--no-progress", "--no-plot"]


def evaluate_data_in_other_words(d, finished):
    run = copy_run("text")(d, finished)
    return ["evaluate", "--checkpoint", str(run), "--data", str(swapped_text(d))]


def tsv_with(content, *options):
    return lambda d, f: tsv(content)(d, f) + list(options)


def tie_all_with_tokenizers_of_two_vocabularies(d, finished):
    """--tie-embeddings all with --tokenizer-from a text run that has a tokenizer a side."""
    run = copy_run("text")(d, finished)
    return ["train", "--data", str(d / "train.tsv"), "--tokenizer-from", str(run), "--tie-embeddings", "all",
            "--out", str(d / "out"), "--preset", "tiny", "--steps", "2", "--batch-size", "4", "--max-len", "8",
            "--no-progress", "--no-plot"]


CASES = [
    # --- TSV data
    ("tsv_line_without_tab", tsv("a b\tx y\nno tab here\n"), 2, r"train\.tsv:2: expected one tab.*found no tab"),
    ("tsv_line_with_two_tabs", tsv("a\tb\tc\n"), 2, r"train\.tsv:1: .*found 2 tabs; --columns S,T picks two columns"),
    ("tsv_fewer_columns_than_asked", lambda d, f: tsv("a\tb\tc\n")(d, f) + ["--columns", "4,1"], 2,
     r"train\.tsv:1: expected at least 4 tab-separated columns \(--columns 4,1\), found 3"),
    ("columns_not_two_numbers", lambda d, f: tsv("a\tb\n")(d, f) + ["--columns", "2"], 2,
     r"argument --columns: '2': columns must be two column numbers"),
    ("tsv_empty_source", tsv("a\tx\n \ty\n"), 2, r"train\.tsv:2: empty source"),
    ("tsv_empty_target", tsv("a\t \n"), 2, r"train\.tsv:1: empty target"),
    ("tsv_invalid_utf8", tsv(b"a\tx\n\xff\xfe\ty\n"), 2, r"train\.tsv:2: not valid UTF-8 .*; a file in another encoding converts with `iconv -f ENCODING -t UTF-8`"),
    ("tsv_binary_file", tsv(bytes(range(256)) * 4), 2, r"train\.tsv:1: a NUL byte at byte 0: text files hold none \(a binary file"),
    ("tsv_empty_file", tsv(""), 2, r"train\.tsv: no source<TAB>target pairs \(the file is empty\)"),
    ("tsv_only_blank_lines", tsv("\n \n\n"), 2, r"train\.tsv: no source<TAB>target pairs \(its 3 lines are blank\)"),
    ("tsv_every_pair_too_long", tsv(("w " * 70 + "\tx\n") * 3), 2, r"no pairs: all 3 are longer than max_len"),
    # 20 pairs and no --valid: a tenth is held out first, and the count says where the rest went.
    ("tsv_every_pair_too_long_with_a_hold_out", tsv(("w " * 70 + "\tx\n") * 20), 2,
     r"no pairs: all 18 are longer than max_len.*; the file's other 2 pairs are held out for validation \(no --valid\)"),
    # Character and subword tokenizers train on the pairs that fit: none fitting is the same
    # error as for words, never a tokenizer trained on nothing.
    ("tsv_every_pair_too_long_in_characters", tsv_with("hello there\tHELLO THERE\n" * 3, "--tokenizer", "char",
                                                       "--max-len", "3"), 2,
     r"train\.tsv: no pairs: all 3 are longer than max_len=3 \(--max-len 3: .*; --max-len raises the limit"),
    ("tsv_every_pair_too_long_for_bpe", tsv_with("a b c\tx y z\n" * 3, "--tokenizer", "bpe", "--vocab-size", "20",
                                                 "--max-len", "2"), 2, r"train\.tsv: no pairs: all 3 are longer than max_len=2"),
    # 20 pairs, no --valid: the 2 held out (lines 13 and 17, the fixed split's) are the only
    # ones too long, and the error says it is the held-out pairs, not the file, that do not fit.
    ("tsv_only_the_held_out_pairs_too_long",
     tsv_with("".join("a b c d e\tA B C D E\n" if i in (12, 16) else "a\tA\n" for i in range(20)), "--max-len", "3"), 2,
     r"train\.tsv: the 2 pairs held out of it for validation \(no --valid\): no pairs: all 2 are longer than "
     r"max_len=3 .*--valid FILE gives held-out pairs of their own"),
    # U+2581 is the char, bpe and unigram tokenizers' word mark, read as a space: a side of it
    # alone is as empty as a blank side, in the training pairs, the held-out ones (lines 13 and
    # 17 of 20, the fixed split's) and a --valid file.
    ("tsv_side_empty_once_normalised", tsv_with("a\tx\nb\t\u2581 \u2581\n", "--tokenizer", "char"), 2,
     r"train\.tsv:2: empty target once the tokenizer normalises '\u2581 \u2581' \(it reads U\+2581"),
    ("tsv_held_out_side_empty_once_normalised",
     tsv_with("".join("\u2581\tA\n" if i == 12 else "a\tA\n" for i in range(20)), "--tokenizer", "char"), 2,
     r"train\.tsv:13: empty source once the tokenizer normalises '\u2581'"),
    ("valid_side_empty_once_normalised", valid_side_empty_once_normalised, 2,
     r"valid\.tsv:2: empty source once the tokenizer normalises '\u2581'"),
    ("data_missing", data_missing, 2, r"nope\.tsv: No such file"),
    ("data_is_a_directory", data_is_a_directory, 2, r"data: Is a directory \(give a file"),
    ("valid_missing", valid_missing, 2, r"nope\.tsv: No such file"),
    ("valid_line_without_tab", valid_bad_line, 2, r"valid\.tsv:1: expected one tab"),
    ("max_tokens_below_the_longest_example", max_tokens_below_the_longest_example, 2,
     r"--max-tokens 3 is smaller than the longest example \(.*train\.tsv:1: the pair whose source is 'a b c'.*8 padded"
     r".*at least 8"),
    # Text in another encoding, or holding NUL bytes, is refused by name: UTF-16 without a BOM
    # decodes as valid UTF-8 (a NUL between letters) and would train on tokens like '\x00q\x00u'.
    ("tsv_utf16_with_a_byte_order_mark", tsv(GOOD_TSV.encode("utf-16")), 2,
     r"train\.tsv: a UTF-16LE file \(its byte-order mark says so\), not UTF-8; it converts with `iconv -f UTF-16LE -t UTF-8`"),
    ("tsv_utf16_without_a_byte_order_mark", tsv(GOOD_TSV.encode("utf-16-le")), 2,
     r"train\.tsv:1: looks like UTF-16LE text without a byte-order mark, not UTF-8; it converts with `iconv -f UTF-16LE"),
    ("tsv_utf32_big_endian_without_a_byte_order_mark", tsv(GOOD_TSV.encode("utf-32-be")), 2,
     r"train\.tsv:1: looks like UTF-32BE text without a byte-order mark"),
    ("tsv_nul_inside_a_word", tsv("a b\tx y\nthe\tgr\x00een\n" + GOOD_TSV), 2,
     r"train\.tsv:2: a NUL byte at byte 6: text files hold none \(a binary file, or a NUL inside a word\)"),
    ("generate_utf16_standard_input", on_run("generate", stdin="1 2\n".encode("utf-16")), 2,
     r"standard input: a UTF-16LE file \(its byte-order mark says so\)"),
    # Sizes past what the text or the machine holds: clamped where only clamping is needed,
    # refused before anything is allocated or written otherwise.
    ("tsv_bpe_vocab_size_past_the_text", tsv_with(BPE_TEXT_OF_7_TOKENS, "--tokenizer", "bpe",
                                                  "--vocab-size", "100000000000", *ONE_LAYER_TEXT), 0,
     r"note: --vocab-size 100000000000 asked for, the bpe tokenizer learnt \d+ \(source\), \d+ \(target\)"),
    ("tsv_unigram_vocab_size_past_the_text", tsv_with(UNIGRAM_TEXT_OF_7_TOKENS, "--tokenizer", "unigram",
                                                      "--vocab-size", "100000000000", *ONE_LAYER_TEXT),
     0, r"note: --vocab-size 100000000000 asked for, the unigram tokenizer learnt"),
    # A budget past the corpus pads its batch to the corpus's rows: GOOD_PAIRS' 4 at the finished text
    # run's --max-len, that run's batch shape (its compiled steps reused).
    ("tsv_max_tokens_past_the_corpus", tsv_with(GOOD_PAIRS, "--max-tokens", "100000000000", "--layers", "1",
                                                "--max-len", "8"), 0,
     r'"step": 2, "loss"'),
    ("vocab_size_past_memory", train_option("--vocab-size", "100000000000"), 2,
     r"one train step takes at least [\d,.]+ GiB with the model's [\d,]+ parameters .*, more than the [\d,.]+ GiB "
     r"\(this machine's available memory\) free: give a smaller --vocab-size, --embed-size, --layers or --ffn-dim\. "
     r"Nothing was written"),
    ("batch_size_past_memory", train_option("--batch-size", "1000000000"), 2,
     r"a training batch of 1,000,000,000 rows of up to 6 tokens \(--batch-size 1000000000\).*: give a smaller "
     r"--batch-size"),
    # Words the tokenizers never saw, nearly all of them: said, with the likely cause.
    ("tokenizer_from_a_run_of_other_text", tokenizer_from_other_text, 0,
     r"warning: \S*swapped\.tsv: 100\.0% of its source tokens and 100\.0% of its target tokens are outside the "
     r"vocabulary \(the tokenizers of --tokenizer-from \S+\) and read as <unk>; so many suggests swapped source and "
     r"target columns \(--columns\)"),
    ("valid_in_other_words", valid_in_other_words, 0,
     r"warning: \S*swapped\.tsv: 100\.0% of its source tokens .*\(the tokenizers trained on --data\)"),
    ("evaluate_data_in_other_words", evaluate_data_in_other_words, 0,
     r"warning: \S*swapped\.tsv: 100\.0% of its source tokens .*\(the run's tokenizers\)"),
    # --- train options
    # The checks after parsing speak as the command they refuse: its usage, "flaxformer-mini train: error:".
    ("valid_without_data", train_option("--valid", "v.tsv"), 2, r"flaxformer-mini train: error: --valid goes with --data"),
    ("columns_without_data", train_option("--columns", "2,1"), 2,
     r"--columns goes with --data: it says which columns of that file to read \(a synthetic task reads no file\)"),
    ("evaluate_columns_without_data", on_run("evaluate", "--columns", "2,1"), 2, r"--columns goes with --data"),
    ("task_and_data", train_option("--data", "t.tsv"), 2, r"not allowed with"),
    ("steps_zero", train_option("--steps", "0"), 2, r"(?s)usage: flaxformer-mini train .*flaxformer-mini train: error: --steps must be >= 1, got 0"),
    ("batch_size_zero", train_option("--batch-size", "0"), 2, r"--batch-size must be >= 1"),
    ("lr_nan", train_option("--lr", "nan"), 2, r"--lr must be a finite number > 0, got nan"),
    ("lr_negative", train_option("--lr", "-1"), 2, r"--lr must be a finite number > 0"),
    ("clip_norm_negative", train_option("--clip-norm", "-1"), 2, r"--clip-norm must be a finite number > 0"),
    ("clip_norm_zero", train_option("--clip-norm", "0"), 2, r"--clip-norm must be .* or 'none'"),
    ("weight_decay_negative", train_option("--weight-decay", "-1"), 2, r"--weight-decay must be a finite number >= 0"),
    ("weight_decay_nan", train_option("--weight-decay", "nan"), 2, r"--weight-decay must be"),
    ("warmup_zero", train_option("--warmup", "0"), 2, r"--warmup must be >= 1"),
    # TINY_RUN warms up for 5 steps; the train_option runs stop at step 2.
    ("cosine_warmup_not_below_steps", train_option("--schedule", "cosine"), 2,
     r"--schedule cosine warms up for --warmup 5 steps and reaches 0 at --steps 2: --warmup must be below --steps"),
    ("length_multiple_zero", lambda d, f: tsv(GOOD_TSV)(d, f) + ["--length-multiple", "0"], 2,
     r"--length-multiple must be >= 1 \(1: each batch padded to its longest sequence\), got 0"),
    ("length_multiple_without_data", train_option("--length-multiple", "2"), 2,
     r"--length-multiple goes with --data \(synthetic tasks have integer tokens and fixed-size batches\)"),
    ("label_smoothing_one", train_option("--label-smoothing", "1"), 2, r"--label-smoothing must be in \[0, 1\)"),
    ("dropout_negative", train_option("--dropout", "-0.1"), 2, r"--dropout must be in \[0, 1\)"),
    ("seed_negative", train_option("--seed", "-1"), 2, r"--seed must be in \[0, 2\*\*63\)"),
    # jax.random.key's C long: refused before --out is made, not a traceback after it.
    ("seed_past_jax_keys", train_option("--seed", str(2**63)), 2, r"--seed must be in \[0, 2\*\*63\), got 9223372036854775808"),
    ("vocab_size_too_small", train_option("--vocab-size", "4"), 2, r"--vocab-size must be >= 5"),
    ("min_len_over_max_len", train_option("--min-len", "9"), 2, r"--min-len 9 is greater than --max-len 5"),
    ("unknown_preset", train_option("--preset", "huge"), 2, r"invalid choice: 'huge'"),
    ("unknown_dtype", train_option("--dtype", "float16"), 2, r"invalid choice: 'float16'"),
    ("width_not_divisible_by_heads", train_option("--embed-size", "31"), 2,
     r"the width 31 \(--embed-size or --preset tiny\) is not divisible by the 5 heads"),
    ("more_devices_than_exist", train_option("--devices", "3"), 2, r"asked for 3 devices"),
    ("valid_size_with_a_synthetic_task", train_option("--valid-size", "5"), 2,
     r"--valid-size goes with --data \(synthetic tasks"),
    ("min_len_with_a_text_run", tsv_with(GOOD_TSV, "--min-len", "2"), 2,
     r"--min-len goes with --task \(a text run's lengths and held-out pairs come from its files\)"),
    ("eval_sequences_with_a_text_run", tsv_with(GOOD_TSV, "--eval-sequences", "8"), 2, r"--eval-sequences goes with --task"),
    ("tsv_vocab_size_too_small", tsv_with(GOOD_TSV, "--vocab-size", "4"), 2, r"--vocab-size must be >= 5"),
    ("synthetic_vocab_size_of_one_value", train_option("--vocab-size", "5"), 2,
     r"--vocab-size 5 leaves a synthetic task one value: it takes >= 6"),
    ("clip_norm_not_a_number", train_option("--clip-norm", "lots"), 2,
     r"argument --clip-norm: 'lots' is not a number, nor 'none' for no clipping"),
    ("tie_embeddings_unknown", train_option("--tie-embeddings", "encoder"), 2,
     r"argument --tie-embeddings: invalid choice: 'encoder' \(choose from '?decoder'?, '?all'?\)"),
    ("tie_all_without_shared_vocab", tsv_with(GOOD_TSV, "--tie-embeddings", "all"), 2,
     r"flaxformer-mini train: error: --tie-embeddings all goes with --shared-vocab: one embedding table for source "
     r"and target needs one vocabulary"),
    ("tie_all_with_tokenizers_of_two_vocabularies", tie_all_with_tokenizers_of_two_vocabularies, 2,
     r"--tie-embeddings all shares one embedding table between source and target, which needs one vocabulary for "
     r"both sides \(--shared-vocab\): the run --tokenizer-from \S+ names has one tokenizer a side"),
    # --- run directories
    ("out_is_a_file", out_is_a_file, 2, r"--out .*out: is a file; give a directory for the run"),
    ("out_holds_something_else", out_not_a_run, 2, r"exists and is not a flaxformer-mini run"),
    ("out_holds_another_run", on_run("train", "--seed", "3"), 2, r"train\.seed \(--seed\): 0 in the run, 3 now"),
    # The run records the schedule's factor (--lr x sqrt(width x --warmup)); the error says the --lr typed.
    ("out_holds_a_run_of_another_lr", on_run("train", "--lr", "1e-4"), 2,
     r"another run whose config differs: --lr \(the schedule's peak\): 0\.003 in the run, 0\.0001 now\. Use"),
    # Only the schedule's line: each schedule's own settings (factor, warm-up, rate) are noise there.
    ("out_holds_a_run_of_another_schedule", on_run("train", "--schedule", "constant"), 2,
     r"another run whose config differs: train\.schedule \(--schedule\): 'rsqrt' in the run, 'constant' now\. Use"),
    # Likewise for the cosine's own setting (decay_steps, from --steps): only the schedule's line.
    ("out_holds_an_rsqrt_run_resumed_as_cosine", on_run("train", "--schedule", "cosine", "--steps", "9"), 2,
     r"another run whose config differs: train\.schedule \(--schedule\): 'rsqrt' in the run, 'cosine' now\. Use"),
    ("out_holds_a_text_run_of_another_length_multiple", text_run_resumed("--length-multiple", "3"), 2,
     r"another run whose config differs: data\.length_multiple \(--length-multiple\): 8 in the run, 3 now\. Use"),
    # A text run stores --max-len less its EOS; the refusal says the --max-len typed, and the
    # held-out settings by the option that sets them.
    ("out_holds_a_text_run_of_another_max_len", text_run_resumed("--max-len", "12"), 2,
     r"data\.max_len \(--max-len\): 8 in the run, 12 now"),
    ("out_holds_a_text_run_of_another_valid_size", text_run_resumed("--valid-size", "2"), 2,
     r"data\.eval_pairs \(--valid-size\): \S+ in the run, 2 now"),
    ("out_being_trained", run_held_by_another_process, 2, r"is being trained by process \d+ on "),
    # Which tables are one is the model's parameters: an untied run resumed with a tie is another run.
    ("out_holds_an_untied_run", on_run("train", "--tie-embeddings", "decoder"), 2,
     r"another run whose config differs: model\.tie_embeddings \(--tie-embeddings\): None in the run, 'decoder' now"),
    ("config_not_json", on_run("evaluate", edit=write("config.json", "{")), 2, r"config\.json: not valid JSON"),
    ("config_not_json_on_resume", on_run("train", edit=write("config.json", "")), 2, r"config\.json: not valid JSON"),
    ("config_not_a_run", on_run("evaluate", edit=write("config.json", '{"a": 1}')), 2,
     r"config\.json: not a flaxformer-mini run config"),
    ("config_unknown_dtype", on_run("evaluate", edit=edit_json("config.json", lambda c: c.update(dtype="float16"))), 2,
     r"config\.json: malformed run config: unknown dtype 'float16'"),
    ("evaluate_no_run", lambda d, f: ["evaluate", "--checkpoint", str(d / "nothing")], 2,
     r"nothing: no such directory; give a run's directory \(the --out of `train`\)"),
    ("evaluate_empty_directory", lambda d, f: (d / "empty").mkdir() or ["evaluate", "--checkpoint", str(d / "empty")], 2,
     r"empty: no run here \(config\.json is missing\)"),
    ("generate_checkpoint_is_a_file", lambda d, f: (d / "t.tsv").write_text("a\tb\n") and ["generate", "--checkpoint", str(d / "t.tsv"), "a"],
     2, r"t\.tsv: is a file; give a run's directory"),
    ("evaluate_no_checkpoint", no_checkpoint_yet, 2, r"the run has no checkpoint yet"),
    ("evaluate_output_is_a_directory", evaluate_output_into("a_directory"), 2,
     r"--output .*a_directory: is a directory; give a file name"),
    ("evaluate_output_in_a_missing_directory", evaluate_output_into("nowhere/hyp.txt"), 2,
     r"--output .*nowhere/hyp\.txt: the directory .*nowhere does not exist"),
    ("evaluate_output_exists", evaluate_data("1 2\t2 1\n", output="hyp.txt"), 2,
     r"--output .*hyp\.txt: already exists \(a file\); nothing was written\. Give --force"),
    ("evaluate_output_is_the_data_file", evaluate_data("1 2\t2 1\n", output="test.tsv"), 2,
     r"--output .*test\.tsv: is the --data file being scored"),
    # No run at the path: the message being --force's shows the refusal comes before the run is read.
    ("evaluate_force_without_output", lambda d, f: ["evaluate", "--checkpoint", str(d / "nothing"), "--force"], 2,
     r"flaxformer-mini evaluate: error: --force goes with --output: it replaces an existing --output file, and none "
     r"was given"),
    ("evaluate_data_missing", evaluate_data_missing, 2, r"nope\.tsv: No such file"),
    ("evaluate_data_line_without_tab", evaluate_data("1 2\t2 1\n3 4\n"), 2, r"test\.tsv:2: expected one tab"),
    ("evaluate_data_empty_file", evaluate_data(""), 2, r"test\.tsv: no source<TAB>target pairs"),
    ("evaluate_data_not_an_integer", evaluate_data("1 2\t2 x\n"), 2,
     r"test\.tsv:1: target: token 'x' is not an integer"),
    ("evaluate_data_every_pair_too_long", evaluate_data("a b c d e f g h\tx\n", kind="text"), 2,
     r"test\.tsv: no pairs: all 1 are longer than max_len=8"),
    ("vocabulary_edited", on_run("generate", "a b", kind="text", edit=edit_json("vocab_target.json", swap_two_words)),
     2, r"vocab_target\.json differs from the file this run wrote"),
    ("training_file_changed_since_the_run_started", training_file_changed, 2,
     r"train\.tsv \(data\.train_path\) has changed since the run in .* started \(sha256 [0-9a-f]{12}\.\.\., recorded"),
    ("vocabulary_missing", on_run("generate", "a b", kind="text", edit=lambda r: (r / "vocab_source.json").unlink()),
     2, r"vocab_source\.json: the run's vocabulary is missing"),
    ("metrics_line_torn", on_run("train", edit=lambda r: open(r / "metrics.jsonl", "a").write('{"step": 9, "l')),
     0, r"metrics\.jsonl:\d+: unreadable line dropped"),
    # --- checkpoints
    ("every_checkpoint_damaged", on_run("evaluate", edit=damage_every_checkpoint), 2,
     r"no checkpoint in .* can be read \(step 5: "),
    # A config.json edited by hand is refused by its recorded checksum; with no checksum (a file
    # written before it was recorded), a model of other shapes is refused by the checkpoint's.
    ("config_edited_heads", on_run("evaluate", edit=edit_json("config.json", lambda c: c["model"].update(heads=3))), 2,
     r"config\.json: edited since the run wrote it \(sha256 of its settings [0-9a-f]{12}\.\.\., recorded [0-9a-f]{12}\.\.\.\)"),
    ("config_edited_learning_rate", on_run("train", edit=edit_json("config.json", lambda c: c["train"].update(peak_learning_rate=1e-3))),
     2, r"config\.json: edited since the run wrote it"),
    ("checkpoint_of_another_size", on_run("evaluate", edit=edit_json("config.json", lambda c: (
        c["model"].update(embed_size=35, heads=5), c["checksums"].pop("config")))),
     2, r"checkpoint 5 in .* is from a different model: .*\(30, 30\), model \(35, 35\)"),
    # --- generate and evaluate options
    ("generate_max_new_tokens_zero", on_run("generate", "--max-new-tokens", "0", "1 2"), 2, r"--max-new-tokens must be >= 1"),
    ("generate_max_new_tokens_too_many", on_run("generate", "--max-new-tokens", "99", "1 2"), 2, r"--max-new-tokens=99 exceeds max_len=6"),
    ("generate_beam_size_zero", on_run("generate", "--beam-size", "0", "1 2"), 2, r"flaxformer-mini generate: error: --beam-size must be >= 1"),
    ("generate_temperature_zero", on_run("generate", "--temperature", "0", "1 2"), 2, r"--temperature must be > 0"),
    ("generate_temperature_nan", on_run("generate", "--temperature", "nan", "1 2"), 2, r"--temperature must be > 0"),
    ("generate_top_k_zero", on_run("generate", "--top-k", "0", "1 2"), 2, r"--top-k must be >= 1"),
    ("generate_top_k_over_vocabulary", on_run("generate", "--top-k", "99", "1 2"), 2, r"--top-k must be in \[1, 11\]"),
    # ((5 + 5) / 6) ** 1000 is past float32: every score would round to -0.0 and rank nothing.
    ("generate_length_penalty_past_float32", on_run("generate", "--beam-size", "2", "--length-penalty", "1000", "1 2"), 2,
     r"--length-penalty=1000.0 makes the length penalty .* too large for float32 scores at 6 tokens"),
    ("generate_beam_and_sampling", on_run("generate", "--beam-size", "2", "--temperature", "0.5", "1"), 2, r"exclude each other"),
    ("generate_empty_input", on_run("generate", stdin="\n\n"), 2, r"empty input"),
    # An over-long input gets an empty output line and a warning; the other lines are decoded.
    ("generate_input_too_long", on_run("generate", "1 2 3 4 5 6"), 0, r"warning: the input has 6 tokens.*at most 5 tokens fit"),
    ("generate_invalid_utf8", on_run("generate", stdin=b"1\n\xff\n"), 2, r"standard input:2: not valid UTF-8"),
    ("generate_not_an_integer", on_run("generate", "x"), 2, r"token 'x' is not an integer"),
    ("generate_value_out_of_range", on_run("generate", "99"), 2,
     r"input 1: token '99' is out of range: values are 0\.\.6"),
    ("generate_batch_size_zero", on_run("generate", "--batch-size", "0", "1"), 2, r"--batch-size must be >= 1"),
    ("generate_beam_size_past_memory", on_run("generate", "--beam-size", "100000000", "1 2"), 2,
     r"decoding 1 source rows \(--batch-size\) with 100,000,000 beams each \(--beam-size\) takes at least [\d,.]+ GiB, "
     r"more than the .* free: give a smaller --beam-size or --batch-size"),
    ("evaluate_beam_size_past_memory", on_run("evaluate", "--beam-size", "100000000"), 2,
     r"decoding \d+ source rows \(--batch-size\) with 100,000,000 beams each \(--beam-size\) takes at least"),
    # A batch larger than the input decodes the input's rows alone: one output line, no warning.
    ("generate_batch_size_past_the_input", on_run("generate", "--batch-size", "1000000000", "1 2"), 0, r"\A[0-9 ]*\n\Z"),
    ("evaluate_beam_size_zero", on_run("evaluate", "--beam-size", "0"), 2, r"--beam-size must be >= 1"),
    ("evaluate_batch_size_zero", on_run("evaluate", "--batch-size", "0"), 2, r"--batch-size must be >= 1"),
    ("init_from_missing", init_from("nope.safetensors"), 2, r"--init-from \S*nope\.safetensors: no such file"),
    ("init_from_another_vocabulary_size", init_from(init_weights(target_vocab_size=13)), 2,
     r"'decoder\.embedding_layer\.weight' is \(13, 30\) in the file, \(11, 30\) in the run's model.*--vocab-size 11"),
    ("init_from_another_depth", init_from(init_weights(num_layers=2)), 2,
     r"2 \+ 2 layers in the file, 1 \+ 1 in the run's model.*--layers 2"),
    ("init_from_nan_weights", init_from(init_weights(change=lambda sd: sd["decoder.fc.bias"].fill_(float("nan")))), 2,
     r"weights hold NaN or Inf: 'decoder\.fc\.bias'"),
    ("init_from_truncated_file", init_from(lambda d: (init_weights()(d).write_bytes(b"\x10\x00\x00"), d / "w.safetensors")[1]),
     2, r"--init-from \S*w\.safetensors: not a readable"),
    ("init_from_a_run_directory", lambda d, f: train_option("--init-from", str(f / "synthetic"))(d, f), 2,
     r"is a flaxformer-mini run directory, not a weights file"),
    ("init_from_a_runs_checkpoint", lambda d, f: train_option("--init-from", str(max(
        p for p in (f / "synthetic" / "checkpoints").iterdir() if p.name.isdigit())))(d, f), 2,
     r"is part of the flaxformer-mini run \S*synthetic, not a weights file: export .*parity convert"),
    ("init_from_an_item_of_a_runs_checkpoint", lambda d, f: train_option("--init-from", str(max(
        p for p in (f / "synthetic" / "checkpoints").iterdir() if p.name.isdigit()) / "default"))(d, f), 2,
     r"is part of the flaxformer-mini run \S*synthetic, not a weights file"),
    ("init_from_on_a_run_started_without_it", init_from(init_weights(), run="synthetic"), 2,
     r"--init-from: the run started from a random init"),
    # Untied weights (their output projection not their embedding) cannot start a tied run.
    ("init_from_untied_weights_into_a_tied_run", lambda d, f: init_from(init_weights())(d, f) + [
        "--tie-embeddings", "decoder"], 2,
     r"--init-from \S*w\.safetensors does not fit the run's model: 'decoder\.fc\.weight': tied to "
     r"'decoder\.embedding_layer\.weight', but \d+ of 330 values differ .*: a checkpoint whose tied weights differ "
     r"is not tied\. The run's model: .*embeddings tied \('decoder'\), set by .*--tie-embeddings"),
    # --- the best checkpoint, early stopping, the evaluation's beam, averaging
    ("best_metric_unknown", train_option("--best-metric", "accuracy"), 2,
     r"argument --best-metric: invalid choice: 'accuracy' \(choose from '?loss'?, '?wer'?, '?cer'?, '?bleu'?, '?chrf'?, "
     r"'?exact_match'?\)"),
    ("patience_without_best_metric", train_option("--patience", "3"), 2,
     r"flaxformer-mini train: error: --patience goes with --best-metric"),
    ("patience_zero", train_option("--best-metric", "loss", "--patience", "0"), 2, r"--patience must be >= 1"),
    ("eval_beam_size_zero", train_option("--eval-beam-size", "0"), 2, r"--eval-beam-size must be >= 1"),
    ("eval_length_penalty_with_greedy_evaluation", train_option("--eval-length-penalty", "1"), 2,
     r"--eval-length-penalty goes with --eval-beam-size K > 1"),
    ("eval_length_penalty_past_float32", train_option("--eval-beam-size", "2", "--eval-length-penalty", "1000"), 2,
     r"--eval-length-penalty\): length penalty alpha=1000.0 makes the length penalty .* too large"),
    ("eval_length_penalty_negative", train_option("--eval-beam-size", "2", "--eval-length-penalty", "-1"), 2,
     r"--eval-length-penalty must be a finite number >= 0"),
    ("eval_beam_size_past_memory", train_option("--eval-beam-size", "100000000"), 2,
     r"the evaluation during training: decoding 8 source rows \(--batch-size\) with 100,000,000 beams each "
     r"\(--eval-beam-size\) takes at least [\d,.]+ GiB, .*give a smaller --eval-beam-size or --batch-size\. Nothing "
     r"was written"),
    ("out_holds_a_run_of_another_best_metric", on_run("train", "--best-metric", "loss"), 2,
     r"another run whose config differs: evaluation\.best_metric \(--best-metric\): None in the run, 'loss' now"),
    ("out_holds_a_run_of_another_eval_beam_size", on_run("train", "--eval-beam-size", "3"), 2,
     r"evaluation\.beam_size \(--eval-beam-size\): 1 in the run, 3 now"),
    # A run written before --best-metric existed resumes as it was trained, and says so.
    ("best_metric_on_a_run_written_before_it", on_run("train", "--best-metric", "loss", "--patience", "2", edit=edit_json(
        "config.json", lambda c: (c.pop("evaluation"), c["checksums"].pop("config")))), 0,
     r"note: the run in \S+ was written before --best-metric and --eval-beam-size existed and resumes without them"),
    ("evaluate_best_of_a_run_without_best_metric",
     lambda d, f: ["evaluate", "--checkpoint", str(copy_run()(d, f) / "best")], 2,
     r"run/best: the run has no best checkpoint \(it was trained without --best-metric\); give \S*run for its latest"),
    ("generate_a_step_of_best", lambda d, f: ["generate", "--checkpoint", str(copy_run(edit=lambda r: shutil.copytree(
        r / "checkpoints" / "5", r / "best" / "5"))(d, f) / "best" / "5"), "1 2"], 2,
     r"best/5: this is the best checkpoint's step directory of a training run; give \S*run/best"),
    ("average_one_checkpoint", lambda d, f: ["average", "--checkpoint", str(d), "--last", "1", "--out", str(d / "a")],
     2, r"flaxformer-mini average: error: --last must be >= 2"),
    ("average_more_checkpoints_than_kept",
     lambda d, f: ["average", "--checkpoint", str(copy_run()(d, f)), "--last", "2", "--out", str(d / "avg")], 2,
     r"--last 2: \S*run holds 1 checkpoint\(s\) \(steps 5\); train --keep N keeps the newest N"),
    ("average_into_a_directory_in_use", lambda d, f: (d / "avg").mkdir() or (d / "avg" / "notes").write_text("mine") and [
        "average", "--checkpoint", str(copy_run()(d, f)), "--last", "2", "--out", str(d / "avg")], 2,
     r"--out \S*avg: exists and is a directory that is not empty; give a new directory for the average "
     r"\(nothing was written\)"),
    ("average_into_a_file", lambda d, f: (d / "avg").write_text("mine") and [
        "average", "--checkpoint", str(copy_run()(d, f)), "--last", "2", "--out", str(d / "avg")], 2,
     r"--out \S*avg: exists and is a file, not a directory; give a new directory for the average"),
    # OUT inside the run would become a checkpoint the run never saved (or its best one).
    ("average_into_its_own_run", lambda d, f: [
        "average", "--checkpoint", str(copy_run()(d, f)), "--last", "2", "--out", str(d / "run" / "checkpoints" / "100")],
     2, r"--out \S*run/checkpoints/100: inside the run it averages \(\S*run\); give a directory outside it "
        r"\(nothing was written\)"),
    ("average_into_a_symbolic_link", lambda d, f: (d / "elsewhere").mkdir() or (d / "avg").symlink_to(d / "elsewhere")
     or ["average", "--checkpoint", str(copy_run()(d, f)), "--last", "2", "--out", str(d / "avg")], 2,
     r"--out \S*avg: a symbolic link; give the directory itself, or a new one \(nothing was written\)"),
    ("average_the_best_checkpoint",
     lambda d, f: ["average", "--checkpoint", str(copy_run()(d, f) / "best"), "--last", "2", "--out", str(d / "avg")],
     2, r"run/best: the best checkpoint is one state; average reads a run's rotating checkpoints"),
    ("ema_one", train_option("--ema", "1"), 2, r"--ema must be in \(0, 1\) \(the moving average's decay per update"),
    ("ema_nan", train_option("--ema", "nan"), 2, r"--ema must be in \(0, 1\)"),
    ("out_holds_a_run_of_another_ema", on_run("train", "--ema", "0.99"), 2,
     r"train\.ema_decay \(--ema\): None in the run, 0\.99 now"),
    ("ema_on_a_run_written_before_it", on_run("train", "--ema", "0.99", edit=edit_json(
        "config.json", lambda c: (c["train"].pop("ema_decay"), c["checksums"].pop("config")))), 0,
     r"note: the run in \S+ was written before --ema existed and resumes without it, as it was trained"),
    ("train_into_an_averaged_run", on_run("train", edit=edit_json("config.json", lambda c: (
        c.update(averaged={"run": "/elsewhere/run", "steps": [1, 5]}), c["checksums"].pop("config")))), 2,
     r"holds an average of checkpoints of /elsewhere/run \(`flaxformer-mini average`\), which evaluate and generate "
     r"read; it does not train"),
]


@pytest.mark.parametrize("name, setup, code, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_named_with_its_exit_code_and_nothing_is_lost(name, setup, code, message, finished, tmp_path):
    import re

    args = setup(tmp_path, finished)
    before = snapshot(tmp_path)
    try:
        proc = cli(*args, stdin=getattr(setup, "stdin", ""))
    finally:
        held = getattr(setup, "held", None)
        if held is not None:
            held.release()
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert re.search(message, output), output
    assert "Traceback" not in output
    after = snapshot(tmp_path)
    if code == 0 and args[0] == "train":  # a run trained or resumed to its end writes its files
        return
    changed = sorted(str(p) for p in before if after.get(p) != before[p])
    assert not changed, f"changed or removed: {changed}"
    if args[0] == "train":
        assert set(after) == set(before), f"written: {sorted(map(str, set(after) - set(before)))}"


# ============================================================================= parity
# The same four checks for the `parity` command line (parity.cli.main, in-process): exit code,
# a message naming the problem, no traceback, nothing changed and nothing written.

PARITY_SIZES = dict(src_pad_idx=0, source_vocab_size=11, target_vocab_size=13, max_len=7, embed_size=8, heads=2,
                    num_layers=1, dropout=0.0)


def parity_cli(*args):
    import contextlib
    import io
    import subprocess

    from parity.cli import main as parity_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = parity_main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def parity_weights():
    """A tiny torch_ref Transformer's state dict (width 8, so --heads 3 does not divide it)."""
    import torch

    import torch_ref

    torch.manual_seed(0)
    return torch_ref.Transformer(**PARITY_SIZES).state_dict()


def weights_file(name, change=None, writer="torch.save"):
    """Write the weights (changed by ``change(state_dict)``) to ``d/name``; returns the path."""
    def make(d, weights):
        import torch

        from parity import save_state_dict

        state_dict = {k: v.clone() for k, v in weights.items()}
        if change:
            change(state_dict)
        if writer == "torch.save":
            torch.save(state_dict, d / name)
        else:
            save_state_dict(state_dict, d / name)
        return d / name
    return make


def parity_check(make, *options):
    def setup(d, weights):
        return ["check", "--torch-checkpoint", make(d, weights), "--heads", "2", *options]
    return setup


def parity_convert(make, out, *options, existing=None):
    def setup(d, weights):
        if existing is not None:
            existing(d / out)
        return ["convert", make(d, weights), d / out, "--heads", "2", *options]
    return setup


def raw_file(name, content):
    def make(d, weights):
        (d / name).write_bytes(content)
        return d / name
    return make


def truncated(name):
    def make(d, weights):
        path = weights_file(name, writer="parity")(d, weights)
        path.write_bytes(path.read_bytes()[:200])
        return path
    return make


def directory(name):
    def make(d, weights):
        (d / name).mkdir()
        return d / name
    return make


def missing(name):
    return lambda d, weights: d / name


class _TouchOnLoad:
    """Unpickling this would create ``marker``: a harmless stand-in for os.system."""

    def __init__(self, marker):
        self.marker = Path(marker)

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def malicious_pickle(d, weights):
    import torch

    torch.save({"encoder.embedding_layer.weight": torch.zeros(11, 8), "payload": _TouchOnLoad(d / "pwned")},
               d / "evil.pt")
    return d / "evil.pt"


def to_int64(state_dict):
    state_dict.update({k: v.to(__import__("torch").int64) for k, v in state_dict.items()})


def plant(value, key="encoder.transformer_layers.0.norm1.weight"):
    def change(state_dict):
        state_dict[key][0] = value
    return change


def config_file(text):
    def setup(d, weights):
        (d / "config.json").write_text(text)
        return parity_check(weights_file("model.pt"), "--config", d / "config.json")(d, weights)
    return setup


def make_file(text):
    return lambda path: path.write_text(text)


def make_foreign_directory(path):
    path.mkdir()
    (path / "params").mkdir()
    (path / "train.py").write_text("mine")


GOOD = weights_file("model.pt")
PARITY_CASES = [
    ("checkpoint_missing", parity_check(missing("nope.pt")), 2, r"nope\.pt: no such file"),
    ("checkpoint_missing_convert", parity_convert(missing("nope.pt"), "flax.safetensors"), 2, r"nope\.pt: no such file"),
    ("checkpoint_is_a_directory", parity_check(directory("model.pt")), 2,
     r"model\.pt: is a directory, not a torch checkpoint file"),
    ("checkpoint_random_bytes_pt", parity_check(raw_file("model.pt", bytes(range(256)) * 3)), 2,
     r"model\.pt: refused to load: .*or is not a torch checkpoint at all"),
    ("checkpoint_random_bytes_safetensors", parity_check(raw_file("model.safetensors", bytes(range(256)) * 3)), 2,
     r"model\.safetensors: not a readable \.safetensors file \(truncated or corrupt\?\)"),
    ("checkpoint_truncated_safetensors", parity_check(truncated("model.safetensors")), 2,
     r"model\.safetensors: not a readable \.safetensors file \(truncated or corrupt\?\)"),
    ("checkpoint_truncated_pt", parity_check(truncated("model.pt")), 2, r"model\.pt: (not a readable torch checkpoint|refused)"),
    ("checkpoint_malicious_pickle", parity_check(malicious_pickle), 2,
     r"evil\.pt: refused to load: the pickle asks for objects other than tensors"),
    ("checkpoint_unknown_suffix", parity_check(weights_file("model.npz")), 2, r"model\.npz: unknown checkpoint type '\.npz'"),
    ("checkpoint_unknown_suffix_convert", parity_convert(weights_file("model.npz"), "flax.safetensors"), 2,
     r"model\.npz: unknown checkpoint type '\.npz'"),
    ("convert_output_exists", parity_convert(GOOD, "flax.safetensors", existing=make_file("mine")), 2,
     r"OUT .*flax\.safetensors: already exists \(a file\); nothing was written\. Give --force"),
    ("convert_orbax_output_exists", parity_convert(GOOD, "flax_orbax", existing=make_foreign_directory), 2,
     r"OUT .*flax_orbax: already exists \(a directory\).*--force"),
    ("convert_force_over_a_foreign_directory", parity_convert(GOOD, "flax_orbax", "--force", existing=make_foreign_directory),
     2, r"flax_orbax: exists and is not a directory of Flax parameters written by `parity convert`"),
    ("convert_in_is_out", lambda d, w: ["convert", GOOD(d, w), d / "model.pt", "--force"], 2, r"IN and OUT are the same path"),
    ("check_int64_weights", parity_check(weights_file("model.pt", to_int64)), 2,
     r"invalid value for 'encoder\.embedding_layer\.weight': dtype int64 is not a floating-point dtype"),
    ("convert_int64_weights", parity_convert(weights_file("model.pt", to_int64), "flax.safetensors"), 2,
     r"invalid value for 'decoder\.fc\.bias': dtype int64 is not a floating-point dtype"),
    ("check_nan_weights", parity_check(weights_file("model.pt", plant(float("nan")))), 2,
     r"weights contain NaN: key 'encoder\.transformer_layers\.0\.norm1\.weight'"),
    ("check_inf_weights", parity_check(weights_file("model.safetensors", plant(float("inf"), "decoder.fc.bias"), "parity")), 2,
     r"weights contain Inf: key 'decoder\.fc\.bias'"),
    ("heads_not_dividing_the_width", parity_check(GOOD, "--heads", "3"), 2, r"heads=3 does not divide the model width D=8"),
    ("heads_zero", parity_check(GOOD, "--heads", "0"), 2, r"heads=0 does not divide the model width"),
    ("atol_negative", parity_check(GOOD, "--atol", "-1"), 2, r"--atol must be a finite number >= 0, got -1"),
    ("atol_nan", parity_check(GOOD, "--atol", "nan"), 2, r"--atol must be a finite number >= 0, got nan"),
    ("atol_not_a_number", parity_check(GOOD, "--atol", "tiny"), 2, r"--atol: invalid float value: 'tiny'"),
    ("batch_zero", parity_check(GOOD, "--batch", "0"), 2, r"--batch must be >= 1, got 0"),
    ("config_missing", parity_check(GOOD, "--config", "nope.json"), 2, r"config file nope\.json: cannot read: No such file"),
    ("config_not_json", config_file("{heads: 2"), 2, r"config file .*config\.json: not valid JSON"),
    ("config_not_an_object", config_file("[2]"), 2, r"config file .*config\.json: expected a JSON object"),
    ("config_unknown_key", config_file('{"head": 2}'), 2, r"unknown config key 'head' \(did you mean 'heads'\?\)"),
    ("json_report_directory_missing", parity_check(GOOD, "--json", "no/such/dir/report.json"), 2,
     r"--json no/such/dir/report\.json: the directory .* does not exist"),
    ("json_report_is_a_directory", parity_check(GOOD, "--json", "."), 2, r"--json \.: is a directory; give a file name"),
    ("plot_unknown_image_type", parity_check(GOOD, "--plot", "plot.gif"), 2, r"--plot plot\.gif: unknown image type '\.gif'"),
    # No checkpoint at the path: the message being --force's shows the refusal comes before it is read.
    ("check_force_without_json_or_plot", parity_check(missing("nope.pt"), "--force"), 2,
     r"parity check: error: --force goes with --json or --plot: it replaces an existing --json or --plot file, and "
     r"none was given"),
    ("unknown_preset", lambda d, w: ["check", "--preset", "huge"], 2, r"huge"),
]


@pytest.mark.parametrize("name, setup, code, message", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_parity_bad_input_is_named_with_its_exit_code_and_nothing_is_written(name, setup, code, message, parity_weights,
                                                                              tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)  # relative paths (--json, --config) land in the case's directory
    args = setup(tmp_path, parity_weights)
    before = snapshot(tmp_path)
    before_paths = sorted(tmp_path.rglob("*"))
    proc = parity_cli(*args)
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert re.search(message, output), output
    assert "Traceback" not in output
    after = snapshot(tmp_path)
    changed = sorted(str(p) for p in before if after.get(p) != before[p])
    assert not changed, f"changed or removed: {changed}"
    assert sorted(tmp_path.rglob("*")) == before_paths, "something was written (a partial output, a temp file, pwned)"


def test_the_parity_matrix_covers_every_kind_of_mistake_issue_15_lists():
    kinds = {"checkpoint_missing", "checkpoint_is_a_directory", "checkpoint_random_bytes_pt",
             "checkpoint_truncated_safetensors", "checkpoint_malicious_pickle", "checkpoint_unknown_suffix",
             "convert_output_exists", "check_int64_weights", "check_nan_weights", "heads_not_dividing_the_width",
             "atol_negative", "atol_nan", "config_missing", "config_not_json"}
    assert kinds <= {case[0] for case in PARITY_CASES}
