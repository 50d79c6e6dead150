"""torch_ref's KV-cache decoder (torch_ref/cached_decoding.py) keeps its promises.

- Each cached step's logits equal the last position of a full forward pass over the prefix.
- Greedy picks the same tokens as torch_ref's uncached greedy decoder and as the Flax
  cached decoder, on a padded batch whose rows end at different steps.
- Beam search returns the Flax beam search's tokens and scores, for several length
  penalties; beam size 1 is greedy.
- Compiled, the step is one graph for every position (static shapes: no recompilation).
"""

import re

import numpy as np
import pytest
import torch

import flaxformer_mini as fm
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.data import BOS, EOS, PAD
from parity import sample_batch, transformer_pair
from torch_ref.cached_decoding import CachedDecoder, KVCache, beam_search, decode_one_token, prefill
from torch_ref.decoding import greedy_decode as uncached_greedy

from conftest import ATOL
from helpers import WIDE_BEAM, wide_beam_case

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

CONFIG = fm.get_preset("tiny")  # V=19, max_len=17, D=30, H=5, 2 layers
N = CONFIG.max_len
# The EOS bias makes rows end at different steps (and some not at all), so padding after EOS
# and the early exit are exercised; test_eos_bias_makes_rows_end_at_different_steps checks it.
EOS_BIAS = 0.5
ALPHAS = (0.0, 0.6, 2.0)


@pytest.fixture(scope="module")
def pair():
    torch_model, flax_model = transformer_pair(CONFIG, seed=1)
    with torch.no_grad():
        torch_model.decoder.fc.bias[EOS] += EOS_BIAS
    from parity import torch_to_flax

    torch_to_flax(torch_model.state_dict(), flax_model)
    return torch_model, flax_model


@pytest.fixture(scope="module")
def source():
    return torch.as_tensor(sample_batch(CONFIG, batch=5, seed=1, source_len=13)[0])  # (5, 13), padded rows


@pytest.fixture(scope="module")
def greedy(pair, source):
    return CachedDecoder(pair[0]).greedy(source, N)


def test_each_cached_step_equals_the_full_forward_pass(pair, source):
    model = pair[0]
    torch.manual_seed(3)
    prefix = torch.cat([torch.full((5, 1), BOS), torch.randint(3, CONFIG.target_vocab_size, (5, N - 1))], dim=1)
    with torch.no_grad():
        full = model(source, prefix)  # (B, N, V): the independent reference, no cache
        cache = prefill(model, source, N)
        for t in range(N):
            logits = decode_one_token(model, cache.self_k, cache.self_v, cache.cross_k, cache.cross_v,
                                      cache.source_mask, prefix[:, t], torch.tensor(t))
            err = (logits - full[:, t]).abs().max().item()
            assert err <= ATOL, f"step {t}: max abs diff {err:.3e}"


def test_eos_bias_makes_rows_end_at_different_steps(greedy):
    ends = [(row == EOS).nonzero().flatten().tolist()[:1] for row in greedy]
    ended = [e[0] for e in ends if e]
    assert len(set(ended)) >= 2 and len(ended) < len(ends), ends


def test_cached_greedy_equals_uncached_torch_greedy(pair, source, greedy):
    expected = uncached_greedy(pair[0], source, N)
    assert greedy.dtype == torch.int64 and greedy.shape == (5, N)
    torch.testing.assert_close(greedy, expected, rtol=0, atol=0)


def test_cached_greedy_equals_flax_cached_greedy(pair, source, greedy):
    expected = np.asarray(decoding.greedy_decode(pair[1], source.cpu().numpy(), N))
    np.testing.assert_array_equal(greedy.cpu().numpy(), expected)


def test_greedy_emits_only_pad_after_eos(greedy):
    assert any(EOS in row for row in greedy.tolist())  # some row ends, or nothing below is checked
    for row in greedy.tolist():
        if EOS in row:
            assert all(tok == PAD for tok in row[row.index(EOS) + 1:]), row


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_search_equals_flax_beam_search(pair, source, alpha):
    tokens, scores = beam_search(pair[0], source, N, beam_size=4, alpha=alpha)
    flax_tokens, flax_scores = decoding.beam_search(pair[1], source.cpu().numpy(), N, beam_size=4, alpha=alpha)
    np.testing.assert_array_equal(tokens.cpu().numpy(), np.asarray(flax_tokens))
    # Scores are sums of N log-probabilities computed by two frameworks: 1e-4 allows their
    # float32 rounding to accumulate over the steps.
    np.testing.assert_allclose(scores.cpu().numpy(), np.asarray(flax_scores), atol=1e-4, rtol=0)


@pytest.mark.parametrize("seed", [0, 2])
def test_a_beam_wider_than_the_vocabulary_equals_flax_beam_search(seed):
    # test_decoding's case where dead beams could finish phantom hypotheses; there the Flax
    # beam search is checked against the plain reference, here torch's against Flax's.
    torch_model, flax_model, source = wide_beam_case(seed)
    options = dict(beam_size=WIDE_BEAM["beam_size"], alpha=WIDE_BEAM["alpha"])
    tokens, scores = beam_search(torch_model, torch.as_tensor(source), WIDE_BEAM["max_new_tokens"], **options)
    flax_tokens, flax_scores = decoding.beam_search(flax_model, source, WIDE_BEAM["max_new_tokens"], **options)
    np.testing.assert_array_equal(tokens.cpu().numpy(), np.asarray(flax_tokens))
    np.testing.assert_allclose(scores.cpu().numpy(), np.asarray(flax_scores), atol=1e-4, rtol=0)  # as above
    assert scores.min().item() > -1e3  # no phantom hypothesis (those scored about -2e8)


def test_beam_search_of_size_one_equals_greedy(pair, source, greedy):
    tokens, _ = beam_search(pair[0], source, N, beam_size=1, alpha=0.6)
    torch.testing.assert_close(tokens[:, 0], greedy, rtol=0, atol=0)


def test_compiled_step_is_one_graph_for_every_position(pair, source, greedy):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # backend="eager": dynamo's tracing and guards, without inductor's code generation
    # (minutes on 2 cores); recompilation is decided by the guards, not the backend.
    tokens = CachedDecoder(pair[0], compile=True, backend="eager").greedy(source, N)
    torch.testing.assert_close(tokens, greedy, rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_decoder_restores_training_mode(pair, source):
    model = pair[0]
    model.train()
    try:
        CachedDecoder(model).greedy(source[:1], 3)
        assert model.training
    finally:
        model.eval()


def test_cache_reorder_keeps_the_chosen_rows():
    k = torch.arange(2 * 3 * 1 * 2 * 1, dtype=torch.float32).reshape(2, 3, 1, 2, 1)
    cache = KVCache(k, k.clone(), None, None, None)
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.self_k, k[:, [2, 2, 0]], rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=N + 1), "exceeds max_len"),
    (dict(max_new_tokens=0), "must be >= 1"),
    (dict(max_new_tokens=3, beam_size=0), "beam size"),
    (dict(max_new_tokens=3, alpha=float("nan")), "alpha"),
])
def test_bad_arguments_are_named(pair, source, kwargs, message):
    with pytest.raises(ValueError, match=message):
        beam_search(pair[0], source, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_size=2.5), "beam size must be an integer, got 2.5"),
    (dict(beam_size=True), "beam size must be an integer, got True"),
    (dict(alpha="0.6"), "length penalty alpha must be a number, got '0.6'"),
])
def test_arguments_of_the_wrong_type_are_named(pair, source, kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        beam_search(pair[0], source, 3, **kwargs)


def test_beam_search_encodes_each_item_once_not_once_per_beam_in_both_twins(pair, source, monkeypatch):
    # The encoder and the cross-attention projections run on the B items; the cache is then
    # repeated to B*W rows. The beams' outputs are those checked above, against each other
    # and (test_decoding) against a plain reference beam search.
    encoded = {"torch": [], "flax": []}
    torch_encode, flax_encode = type(pair[0]).encode, fm.Transformer.encode

    def spy(twin, encode):
        def recording(self, source_input, *args, **kwargs):
            encoded[twin].append(tuple(source_input.shape))
            return encode(self, source_input, *args, **kwargs)
        return recording

    monkeypatch.setattr(type(pair[0]), "encode", spy("torch", torch_encode))
    monkeypatch.setattr(fm.Transformer, "encode", spy("flax", flax_encode))
    # A batch, length and beam size no other test uses: the Flax beam search is jitted, and a
    # shape traced before would not call encode again (the assertion below would then fail).
    rows, W, new = source[:3, :11], 3, 6
    tokens, _ = beam_search(pair[0], rows, new, beam_size=W, alpha=0.6)
    flax_tokens, _ = decoding.beam_search(pair[1], rows.cpu().numpy(), new, beam_size=W, alpha=0.6)
    assert encoded == {"torch": [(3, 11)], "flax": [(3, 11)]}
    np.testing.assert_array_equal(tokens.cpu().numpy(), np.asarray(flax_tokens))
