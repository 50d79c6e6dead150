"""``parity check --decode N``: both twins decode greedily with their KV caches, and the ids
are compared row by row.

- Twins with the same weights decode the same ids, which an independent decoder (torch_ref's
  uncached greedy decoder) gives too; the check exits 0.
- One weight of the torch twin perturbed: the report names the first differing row, its first
  differing position, each side's token, and each side's margin there (its logit of its own
  token minus its logit of the other side's), as decoding both twins directly and the full
  forward pass work them out; exit 1.
- The exit rule: a disagreement counts when either margin exceeds 10 x --atol, and a
  near-tie within that is only noted (judged on the two chosen tokens: Flax choosing torch's
  third-ranked token is no near-tie, however close torch's top two are). A perturbation that only decoding reaches (the decoder's
  last position, which the compared forward pass never uses) exits 1 at the default --atol
  and 0, with the note, at an --atol that makes the same margin a near-tie.
- A bad N (0, negative, past max_len) exits 2 naming --decode; --json holds the result under
  ``decode``, beside the report's own keys.

The perturbations are chosen (by trying a few) so that the decoded ids change on the tiny preset
at seed 0; the expected rows, positions and tokens are computed here, never copied from a run.
"""

import contextlib
import io
import json

import numpy as np
import pytest
import torch

import flaxformer_mini as fm
import parity.twins
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.data import BOS
from parity import check_decoding, sample_batch, transformer_pair
from parity.cli import main
from torch_ref.cached_decoding import CachedDecoder
from torch_ref.decoding import greedy_decode as torch_uncached_greedy

from conftest import ATOL

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

CONFIG = fm.get_preset("tiny")  # V=19, max_len=17, D=30, H=5, 2 layers
N = CONFIG.max_len  # every decoder position, the last included
BATCH, SEED = 4, 0  # parity check's defaults: the batch its table compares
NEAR_TIE_ATOL = 2e-2  # 10 x this is above both of the last-position perturbation's margins (checked below)


def bump_output_bias(torch_model):
    """One output bias up: a row whose runner-up was that token switches to it mid-sequence."""
    torch_model.decoder.fc.bias[8] += 0.05


def bump_last_position(torch_model):
    """One weight of the decoder's last position embedding: only decoding step max_len - 1
    reads it; the compared forward pass feeds targets of max_len - 1 tokens (positions
    0..max_len - 2), so every intermediate still agrees."""
    torch_model.decoder.positional_embedding.weight[CONFIG.max_len - 1, 18] += 1.0


def torch_perturbed(pair, perturb):
    """``pair`` (torch, Flax) of ``transformer_pair`` with ``perturb`` applied to the torch twin
    after the conversion: the Flax twin keeps the original weights."""
    with torch.no_grad():
        perturb(pair[0])
    return pair


def run_check(tmp_path, *args, perturb=None):
    """``parity check --preset tiny --decode N --json OUT *args``, the torch twin perturbed by
    ``perturb``: (exit code, stdout, the JSON written)."""
    out = tmp_path / "report.json"
    real_pair = parity.twins.transformer_pair
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as stdout:
        if perturb is not None:  # parity.cli imports it when it runs: the patched one
            patch.setattr(parity.twins, "transformer_pair",
                          lambda config, seed: torch_perturbed(real_pair(config, seed=seed), perturb))
        code = main(["check", "--preset", "tiny", "--decode", str(N), "--json", str(out), *args])
    return code, stdout.getvalue(), json.loads(out.read_text())


def first_difference(torch_tokens, flax_tokens):
    """(row, position) of the first differing id, rows first, from the two decoders' outputs."""
    rows, positions = np.nonzero(np.asarray(torch_tokens) != np.asarray(flax_tokens))
    return int(rows[0]), int(positions[rows == rows[0]].min())


def full_forward_margin(torch_model, source, tokens, row, position, other):
    """``torch_model``'s full forward pass (no cache) at ``position`` of ``row``, the decoder fed
    BOS and the tokens before it: its logit of ``tokens[row, position]`` minus its logit of ``other``."""
    target_in = torch.cat([torch.full((len(tokens), 1), BOS), torch.as_tensor(tokens)[:, :position]], dim=1)
    with torch.no_grad():
        logits = torch_model(torch.as_tensor(source), target_in)[row, position].double()
    return float(logits[int(tokens[row, position])] - logits[int(other)])


@pytest.fixture(scope="module")
def source():
    return sample_batch(CONFIG, batch=BATCH, seed=SEED)[0]  # (4, 17) int64, rows 1.. padded


@pytest.fixture(scope="module")
def same_weights(tmp_path_factory):
    return run_check(tmp_path_factory.mktemp("same"))


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    return run_check(tmp_path_factory.mktemp("perturbed"), perturb=bump_output_bias)


@pytest.fixture(scope="module")
def perturbed_decodes(source):
    """The output-bias perturbation decoded here, not by the check: the torch twin by
    torch_ref's cached decoder, the Flax twin by the library's greedy decoder, and the pair."""
    torch_model, flax_model = torch_perturbed(transformer_pair(CONFIG, seed=SEED), bump_output_bias)
    torch_tokens = CachedDecoder(torch_model).greedy(torch.as_tensor(source), N).cpu().numpy()
    flax_tokens = np.array(decoding.greedy_decode(flax_model, source, N))  # writable, for torch.as_tensor
    return torch_tokens, flax_tokens, torch_model, flax_model


def test_twins_with_the_same_weights_decode_the_same_ids_and_exit_0(same_weights, source):
    code, stdout, data = same_weights
    assert code == 0
    torch_model, _ = transformer_pair(CONFIG, seed=SEED)
    want = torch_uncached_greedy(torch_model, torch.as_tensor(source), N).cpu().numpy()  # no cache: independent
    assert len({tuple(row) for row in want}) > 1, "every row decodes alike: a weak test"
    assert data["decode"]["torch_tokens"] == data["decode"]["flax_tokens"] == want.tolist()
    assert f"greedy decoding of {N} new tokens with KV caches, {BATCH} rows: the same token ids in every row" in stdout


def test_a_perturbed_torch_weight_is_named_by_row_position_tokens_and_margins(source, perturbed_decodes):
    torch_tokens, flax_tokens, torch_model, flax_model = perturbed_decodes
    decoded = check_decoding(torch_model, flax_model, CONFIG, N, batch=BATCH, seed=SEED)

    row, position = first_difference(torch_tokens, flax_tokens)
    assert (row, position) != (0, 0), "the first row's first token: a weak test"
    d = decoded.first_difference
    assert (d.row, d.position) == (row, position)
    assert (d.torch_token, d.flax_token) == (torch_tokens[row, position], flax_tokens[row, position])
    # The margins the cached decoders saw equal the full forward pass's; the Flax twin holds
    # the unperturbed weights, which an unperturbed torch copy computes too.
    original, _ = transformer_pair(CONFIG, seed=SEED)
    assert d.torch_margin == pytest.approx(
        full_forward_margin(torch_model, source, torch_tokens, row, position, other=d.flax_token), abs=ATOL)
    assert d.flax_margin == pytest.approx(
        full_forward_margin(original, source, flax_tokens, row, position, other=d.torch_token), abs=ATOL)
    assert d.torch_margin > 10 * ATOL and not d.near_tie and not decoded.ok
    want_rows = np.flatnonzero((torch_tokens != flax_tokens).any(axis=1)).tolist()
    assert [x.row for x in decoded.differences] == want_rows


def test_check_names_the_first_difference_and_exits_1(perturbed, perturbed_decodes, source):
    code, stdout, data = perturbed
    assert code == 1
    torch_tokens, flax_tokens, torch_model, _ = perturbed_decodes
    assert data["decode"]["torch_tokens"] == torch_tokens.tolist()
    assert data["decode"]["flax_tokens"] == flax_tokens.tolist()
    d = data["decode"]["first_difference"]
    row, position = first_difference(torch_tokens, flax_tokens)
    assert (d["row"], d["position"]) == (row, position)
    assert (d["torch_token"], d["flax_token"]) == (torch_tokens[row, position], flax_tokens[row, position])
    # The margin printed is the one torch's full forward pass gives here, computed apart from the check.
    assert d["torch_margin"] == pytest.approx(
        full_forward_margin(torch_model, source, torch_tokens, row, position, other=d["flax_token"]), abs=ATOL)
    assert (f"first difference: row {row}, position {position}: torch chose {d['torch_token']} "
            f"({d['torch_margin']:.3e} above {d['flax_token']} in torch's logits), Flax chose {d['flax_token']}") in stdout
    assert "decoding diverges" in stdout


def test_a_clear_token_difference_alone_exits_1_and_a_near_tie_does_not(tmp_path):
    code, stdout, data = run_check(tmp_path, perturb=bump_last_position)
    assert data["ok"] is True and data["first_divergence"] is None  # the table sees nothing
    d = data["decode"]["first_difference"]
    assert d["position"] == N - 1 and 10 * ATOL < max(d["torch_margin"], d["flax_margin"])
    assert max(d["torch_margin"], d["flax_margin"]) <= 10 * NEAR_TIE_ATOL  # the premise of the second run
    assert code == 1 and data["decode"]["ok"] is False

    code, stdout, data = run_check(tmp_path, "--atol", str(NEAR_TIE_ATOL), "--force", perturb=bump_last_position)
    assert data["decode"]["first_difference"] == dict(d, near_tie=True)  # the same step, judged a near-tie
    assert code == 0 and data["decode"]["ok"] is True and data["decode"]["identical"] is False
    assert "note: a near-tie (both margins <= 0.2, 10 x atol)" in stdout


def test_a_near_tie_is_judged_on_the_two_chosen_tokens_not_on_torchs_top_two():
    from parity.decode_check import judge_step

    threshold = 10 * ATOL
    torch_logits = np.array([5.0, 5.0 - ATOL, 1.0])  # torch: token 0, token 1 a hair behind, token 2 far
    # Flax chose torch's third: torch's top two are a near-tie, but the chosen tokens are 4 apart.
    torch_gap, flax_gap, near_tie = judge_step(torch_logits, np.array([1.0, 0.0, 1.0 + ATOL]), 0, 2, threshold)
    assert (torch_gap, near_tie) == (4.0, False) and flax_gap == pytest.approx(ATOL)
    # Flax chose torch's runner-up by a hair: both margins within the threshold.
    torch_gap, flax_gap, near_tie = judge_step(torch_logits, np.array([5.0, 5.0 + ATOL, 1.0]), 0, 1, threshold)
    assert near_tie and torch_gap == pytest.approx(ATOL) and flax_gap == pytest.approx(ATOL)
    # Torch a hair ahead, Flax far ahead of torch's token: no near-tie either.
    assert not judge_step(torch_logits, np.array([0.0, 3.0, 0.0]), 0, 1, threshold)[2]
    assert not judge_step(torch_logits, np.array([np.nan, 0.0, 0.0]), 0, 1, threshold)[2]  # NaN is never one


@pytest.mark.parametrize("n, problem", [
    (0, "--decode must be >= 1"),
    (-3, "--decode must be >= 1"),
    (N + 1, f"--decode {N + 1} exceeds the model's max_len {CONFIG.max_len}"),
])
def test_a_bad_decode_value_exits_2_naming_the_option(n, problem, capsys):
    assert main(["check", "--preset", "tiny", "--decode", str(n)]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


def test_json_holds_the_decode_result_beside_the_reports_own_keys(same_weights, perturbed):
    for code, _, data in (same_weights, perturbed):
        assert {"atol", "ok", "first_divergence", "rows", "left_out"} < set(data)
        assert data["passed"] is (code == 0)  # the exit code's verdict, decoding included
        decoded = data["decode"]
        assert decoded["max_new_tokens"] == N and decoded["near_tie_margin"] == 10 * ATOL
        assert np.shape(decoded["torch_tokens"]) == np.shape(decoded["flax_tokens"]) == (BATCH, N)
        differs = np.asarray(decoded["torch_tokens"]) != np.asarray(decoded["flax_tokens"])
        assert decoded["identical"] is (not differs.any())
        assert [d["row"] for d in decoded["differences"]] == np.flatnonzero(differs.any(axis=1)).tolist()
        assert decoded["first_difference"] == (decoded["differences"][0] if differs.any() else None)
        assert decoded["ok"] is all(d["near_tie"] for d in decoded["differences"])
    first = perturbed[2]["decode"]["first_difference"]
    assert set(first) == {"row", "position", "torch_token", "flax_token", "torch_margin", "flax_margin", "near_tie"}
    row, position = first["row"], first["position"]
    assert first["torch_token"] == perturbed[2]["decode"]["torch_tokens"][row][position] != first["flax_token"]


def test_an_atol_whose_near_tie_margin_overflows_still_writes_strict_json(tmp_path):
    # 10 x 1e308 is inf: the report says null there, as for a non-finite margin, and the check
    # still passes (the twins agree), where json.dumps(allow_nan=False) would refuse it after the work.
    code, _, data = run_check(tmp_path, "--atol", "1e308")
    assert code == 0 and data["passed"] is True and data["atol"] == 1e308
    assert data["decode"]["near_tie_margin"] is None and data["decode"]["identical"] is True
