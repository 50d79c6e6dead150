"""Decoding: the KV cache computes what the full forward pass computes, and every search
(greedy, beam, sampling) keeps its promises.

- Incremental parity: at every step, the cached decoder's logits equal the full forward
  pass's logits at that position (eager and under ``jax.jit``, several sizes).
- Cached greedy = uncached greedy = the torch reference's greedy decoder (same weights).
- Beam search: beam size 1 is greedy; beams are sorted; a beam's score is its
  log-probability, recomputed with the full forward pass, over its length penalty; the
  beams equal those of a plain Python beam search over full forward passes; on sharper
  logits the best beam scores at least as well as greedy.
- Sampling: reproducible per seed, top_k=1 and temperature -> 0 are greedy, tokens stay in
  the top-k set.
- After EOS only PAD; bad arguments are refused with a ValueError naming the limit.

Random weights give logits that are close to uniform, and the models never say EOS on
their own; ``EOS_BIAS`` nudges the EOS logit so that rows end at different steps (and two
rows never end), which is what the EOS handling needs. Token-for-token comparisons are
only meaningful where the best logit is clearly ahead of the second: ``greedy_margin``
checks that it is (a near-tie would be a property of the test data, not a bug).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import flaxformer_mini as fm
from flaxformer_mini.decode import search as decoding
from flaxformer_mini.data import BOS, EOS, PAD
from flaxformer_mini.decode.metrics import exact_match
from flaxformer_mini.decode.options import MAX_LOG_LENGTH_PENALTY, OptionError
from parity import sample_batch, torch_to_flax, transformer_pair
from torch_ref.decoding import greedy_decode as torch_greedy_decode

from conftest import ATOL
from helpers import WIDE_BEAM, eos_biased_pair, wide_beam_case

pytestmark = pytest.mark.parity  # torch twin against Flax twin: the GPU run (pyproject's markers)

CONFIG = fm.get_preset("tiny")  # V=19, max_len=17, D=30, H=5, 2 layers
N = CONFIG.max_len  # decode to the limit: positions 0..max_len-1 all get used
BATCH, SOURCE_LEN = 5, 13  # rows of 13, 9, 6, 11 and 5 real tokens (sample_batch seed 1)
MODEL_SEED = 1
# Added to the EOS logit's bias: the greedy rows of `source` then end at steps 7, -, 10, -, 4.
EOS_BIAS = 0.5
# Top-1 minus top-2 logit along a compared greedy path must exceed this: ten times the
# parity tolerance, so the two sides agree on the argmax whatever their rounding.
MIN_MARGIN = 10 * ATOL
ALPHAS = (0.0, 0.6, 2.0)


def make_pair(config=CONFIG, seed=MODEL_SEED, eos_bias=EOS_BIAS):
    """(torch model, Flax twin) with the same weights; ``eos_bias`` added to the EOS bias."""
    return eos_biased_pair(config, seed, eos_bias)


@pytest.fixture(scope="module")
def pair():
    return make_pair()


@pytest.fixture(scope="module")
def model(pair):
    return pair[1]


@pytest.fixture(scope="module")
def source():
    return sample_batch(CONFIG, batch=BATCH, seed=1, source_len=SOURCE_LEN)[0]  # (5, 13) int64, padded


@pytest.fixture(scope="module")
def greedy(model, source):
    return np.asarray(decoding.greedy_decode(model, source, N))


# --- helpers: the full forward pass as the independent reference -----------------------


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, source, target_in):
    return nnx.merge(graphdef, state)(source, target_in)


def forward(model, source, target_in):
    """The full forward pass ``model(source, target_in)`` (B, T, V), compiled: eager JAX
    would compile every op of it separately, which costs more than the whole jit."""
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, jnp.asarray(source), jnp.asarray(target_in)))


def teacher_forced_logits(model, source, tokens):
    """Full-forward logits (B, N, V) float64 for decoder outputs ``tokens`` (B, N): the decoder
    reads BOS + tokens[:, :-1], so position t holds the distribution token t was drawn from."""
    tokens = np.asarray(tokens)
    target_in = np.concatenate([np.full((tokens.shape[0], 1), BOS), tokens[:, :-1]], axis=1)
    return forward(model, source, target_in).astype(np.float64)


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def lengths(tokens):
    """Tokens up to and including the first EOS, per row; the full length without EOS."""
    tokens = np.asarray(tokens)
    has_eos = (tokens == EOS).any(-1)
    return np.where(has_eos, (tokens == EOS).argmax(-1) + 1, tokens.shape[-1])


def live(tokens):
    """(B, N) True at the positions up to and including the first EOS."""
    return np.arange(np.shape(tokens)[-1]) < lengths(tokens)[..., None]


def gnmt_penalty(length, alpha):
    """GNMT's length penalty written out here (Wu et al. 2016), so the references below do not
    divide by the function they check."""
    return ((5.0 + length) / 6.0) ** alpha


def recomputed_score(model, source, tokens, alpha):
    """Sum of log-softmax of the full forward pass along ``tokens`` (B, N), up to and
    including EOS, over length_penalty(length, alpha); and the number of summed terms."""
    logp = log_softmax(teacher_forced_logits(model, source, tokens))
    picked = np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]  # (B, N)
    n = lengths(tokens)
    return np.where(live(tokens), picked, 0.0).sum(-1) / gnmt_penalty(n, alpha), n


def greedy_margin(model, source, tokens):
    """Smallest top-1 minus top-2 logit gap (full forward) over the live positions of a
    greedy output: how far every step's choice was from a tie."""
    top2 = np.sort(teacher_forced_logits(model, source, tokens), -1)[..., -2:]
    return float((top2[..., 1] - top2[..., 0])[live(tokens)].min())


def assert_pad_after_eos(tokens):
    tokens = np.asarray(tokens)
    after = np.arange(tokens.shape[-1]) >= lengths(tokens)[..., None]
    assert np.all(tokens[after] == PAD), "a token other than PAD follows EOS"


# --- incremental parity: the cache equals the full forward pass ------------------------


def cached_logits(model, source, prefix, max_positions):
    """Logits (B, T, V) of prefill + decode_one_token fed ``prefix`` (B, T), step by step."""
    cache = decoding.prefill(model, jnp.asarray(source), max_positions)
    steps = []
    for t in range(prefix.shape[1]):
        logits, cache = decoding.decode_one_token(model, cache, jnp.asarray(prefix[:, t]), t)
        steps.append(logits)
    return jnp.stack(steps, axis=1)


@functools.partial(jax.jit, static_argnums=(0, 4))
def cached_logits_jit(graphdef, state, source, prefix, max_positions):
    """The same, compiled, with the step t traced (lax.scan), as the decoding loops run it."""
    model = nnx.merge(graphdef, state)
    cache = decoding.prefill(model, source, max_positions)

    def step(cache, xs):
        t, tokens = xs
        logits, cache = decoding.decode_one_token(model, cache, tokens, t)
        return cache, logits

    _, logits = jax.lax.scan(step, cache, (jnp.arange(prefix.shape[1]), prefix.T))  # (T, B, V)
    return logits.transpose(1, 0, 2)


def prefix_batch(config, seed, source_len, target_len):
    """A padded source and a fixed decoder input: BOS, then random target ids."""
    source, target = sample_batch(config, batch=3, seed=seed, source_len=source_len, target_len=target_len)
    target[:, 0] = BOS
    return source, target


SIZES = {
    # Cache longer than the prefix: the unwritten slots must be masked like the future.
    "tiny": (CONFIG, 13, 11, CONFIG.max_len),
    "1-layer-D21-H3": (CONFIG.replace(num_layers=1, embed_size=21, heads=3, max_len=9), 7, 9, 9),
    "3-layers-D28-H7-V11": (CONFIG.replace(num_layers=3, embed_size=28, heads=7, target_vocab_size=11), 5, 6, 8),
}


def test_cached_decode_matches_full_forward_at_every_step():
    # Eager, step t a Python int. (Eager JAX compiles each op for each new shape, so this
    # runs one size; the compiled test below runs them all.)
    config, source_len, target_len, max_positions = SIZES["tiny"]
    _, model = transformer_pair(config, seed=0)
    source, prefix = prefix_batch(config, 2, source_len, target_len)
    assert (source == PAD).any(), "the batch must have source padding"
    full = forward(model, source, prefix)  # (B, T, V)
    cached = np.asarray(cached_logits(model, source, prefix, max_positions))
    np.testing.assert_allclose(cached, full, rtol=0, atol=ATOL)


def test_the_cache_steps_refuse_ids_outside_the_vocabulary_and_positions_outside_the_cache(model, source):
    # Unchecked, JAX's gather clamps an id or a position past the table silently.
    with pytest.raises(ValueError, match=r"^prefill: max_positions must be an int in \[1, 17\] \(the decoder's max_len\), "
                                        r"got 18$"):
        decoding.prefill(model, source, 18)
    with pytest.raises(ValueError, match=r"^prefill: max_positions must be an int .* got True$"):
        decoding.prefill(model, source, True)
    bad = np.array(source)
    bad[0, 0] = CONFIG.source_vocab_size
    with pytest.raises(ValueError, match="source input"):
        decoding.prefill(model, bad, 5)
    cache = decoding.prefill(model, source, np.int64(5))  # a numpy count is a count
    tokens = jnp.full((len(source),), BOS, jnp.int32)
    with pytest.raises(ValueError, match=r"^decode_one_token's tokens: .*19"):
        decoding.decode_one_token(model, cache, tokens.at[0].set(CONFIG.target_vocab_size), 0)
    with pytest.raises(ValueError, match=r"^decode_one_token: tokens are one id per sequence, shape \(B,\), got \(5, 1\)$"):
        decoding.decode_one_token(model, cache, tokens[:, None], 0)
    with pytest.raises(ValueError, match=r"^decode_one_token: position t=5 is outside the cache's 5 positions \(0\.\.4; "):
        decoding.decode_one_token(model, cache, tokens, 5)
    logits, _ = decoding.decode_one_token(model, cache, tokens, 4)  # the last position is in range
    assert logits.shape == (len(source), CONFIG.target_vocab_size)


@pytest.mark.parametrize("size", sorted(SIZES))
def test_cached_decode_matches_full_forward_under_jit(size):
    config, source_len, target_len, max_positions = SIZES[size]
    _, model = transformer_pair(config, seed=0)
    source, prefix = prefix_batch(config, 3, source_len, target_len)
    assert (source == PAD).any(), "the batch must have source padding"
    full = forward(model, source, prefix)
    graphdef, state = nnx.split(model)
    cached = np.asarray(cached_logits_jit(graphdef, state, jnp.asarray(source), jnp.asarray(prefix), max_positions))
    np.testing.assert_allclose(cached, full, rtol=0, atol=ATOL)


# --- greedy ---------------------------------------------------------------------------


def test_eos_bias_makes_rows_end_at_different_steps(greedy):
    # The premise of the EOS tests below: some rows end (at different steps), some never.
    ends = lengths(greedy)
    assert len(set(ends[(greedy == EOS).any(-1)].tolist())) >= 2
    assert not (greedy == EOS).any(-1).all()


def test_cached_greedy_equals_uncached_greedy(model, source, greedy):
    np.testing.assert_array_equal(greedy, np.asarray(decoding.greedy_decode_uncached(model, source, N)))


def test_cached_greedy_equals_uncached_greedy_at_seed_width():
    # The seed's own model (D=512, 8 heads, 6 layers, V=8, max_len=10).
    config = fm.get_preset("seed")
    _, model = transformer_pair(config, seed=0)
    source = sample_batch(config, batch=3, seed=4)[0]
    cached = np.asarray(decoding.greedy_decode(model, source, config.max_len))
    assert greedy_margin(model, source, cached) > MIN_MARGIN
    np.testing.assert_array_equal(cached, np.asarray(decoding.greedy_decode_uncached(model, source, config.max_len)))


def test_torch_greedy_equals_flax_cached_greedy(pair, source, greedy):
    torch_model, model = pair
    assert greedy_margin(model, source, greedy) > MIN_MARGIN, "near-tie in the test data"
    tokens = torch_greedy_decode(torch_model, torch.as_tensor(source), N)
    assert tokens.dtype == torch.int64 and tokens.shape == (BATCH, N)
    np.testing.assert_array_equal(tokens.cpu().numpy(), greedy)


def test_torch_greedy_stops_when_every_row_ended(source):
    # A larger EOS bias: every row ends by step 10, so the decoder runs 11 times, not 17,
    # and the output is padded to max_new_tokens. The Flax decoder agrees.
    torch_model, model = make_pair(eos_bias=0.65)
    calls = []
    hook = torch_model.decoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        tokens = torch_greedy_decode(torch_model, torch.as_tensor(source), N).cpu().numpy()
    finally:
        hook.remove()
    assert (tokens == EOS).any(-1).all()
    assert len(calls) == lengths(tokens).max() < N
    assert_pad_after_eos(tokens)
    assert greedy_margin(model, source, tokens) > MIN_MARGIN
    np.testing.assert_array_equal(tokens, np.asarray(decoding.greedy_decode(model, source, N)))


def test_torch_greedy_restores_training_mode(pair, source):
    torch_model = pair[0]
    torch_model.train()
    try:
        torch_greedy_decode(torch_model, torch.as_tensor(source[:1]), 2)
        assert torch_model.training
    finally:
        torch_model.eval()


def test_greedy_emits_only_pad_after_eos(greedy):
    assert_pad_after_eos(greedy)


# --- beam search ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def beams(model, source):
    """Beam size 4 for every alpha: {alpha: (tokens (B, W, N), scores (B, W))}."""
    return {a: tuple(map(np.asarray, decoding.beam_search(model, source, N, beam_size=4, alpha=a))) for a in ALPHAS}


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_search_of_size_one_equals_greedy(model, source, greedy, alpha):
    tokens, scores = decoding.beam_search(model, source, N, beam_size=1, alpha=alpha)
    assert tokens.shape == (BATCH, 1, N) and scores.shape == (BATCH, 1)
    np.testing.assert_array_equal(np.asarray(tokens)[:, 0], greedy)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beams_are_sorted_by_score(beams, alpha):
    tokens, scores = beams[alpha]
    assert tokens.shape == (BATCH, 4, N)
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert np.all(scores > decoding._NEG / 2), "every beam is a real hypothesis"


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_scores_equal_recomputed_log_probability(model, source, beams, alpha):
    tokens, scores = beams[alpha]
    for w in range(tokens.shape[1]):
        expected, n = recomputed_score(model, source, tokens[:, w], alpha)
        # Each of the n summed log-probabilities is within the parity tolerance of the
        # full forward's, so their sum is within n times it.
        assert np.all(np.abs(scores[:, w] - expected) <= n * ATOL), (w, scores[:, w], expected)


def reference_beam_search(model, source, max_new_tokens, beam_size, alpha):
    """Beam search written plainly, one full forward pass per step, with the rules that
    ``decoding.beam_search`` documents (fairseq's): the 2W best extensions of the live
    beams are the candidates; an EOS candidate among the first W is finished (while fewer
    than W are); the first W candidates without EOS live on; unfinished items let their
    live beams compete at the end. Returns, per item, [(score, tokens)] best first."""
    B, W, V = source.shape[0], beam_size, model.config.target_vocab_size
    alive = [[((), 0.0)] for _ in range(B)]  # per item: (tokens, log-probability)
    finished = [[] for _ in range(B)]  # per item: (score, tokens)
    for t in range(max_new_tokens):
        # One batch (B * W, N) for the forward pass: item b's beams at rows b*W..b*W+W-1.
        rows = np.full((B * W, max_new_tokens), PAD)
        for b in range(B):
            if len(finished[b]) < W:  # a finished item's beams stay as they were
                for i, (seq, _) in enumerate(alive[b]):
                    rows[b * W + i, :t] = seq
        logp = log_softmax(teacher_forced_logits(model, np.repeat(source, W, axis=0), rows))[:, t]  # (B*W, V)
        for b in range(B):
            if len(finished[b]) == W:
                continue
            candidates = sorted(
                ((lp + logp[b * W + i, v], seq + (v,)) for i, (seq, lp) in enumerate(alive[b]) for v in range(V)),
                key=lambda c: -c[0],
            )[: 2 * W]
            new = [(lp / gnmt_penalty(t + 1, alpha), seq) for lp, seq in candidates[:W] if seq[-1] == EOS]
            finished[b] = sorted(finished[b] + new, key=lambda c: -c[0])[:W]
            alive[b] = [(seq, lp) for lp, seq in candidates if seq[-1] != EOS][:W]
    for b in range(B):
        if len(finished[b]) < W:
            at_end = [(lp / gnmt_penalty(max_new_tokens, alpha), seq) for seq, lp in alive[b]]
            finished[b] = sorted(finished[b] + at_end, key=lambda c: -c[0])[:W]
    return finished


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_search_matches_a_plain_reference_beam_search(model, source, beams, alpha):
    tokens, scores = beams[alpha]
    expected = reference_beam_search(model, source, N, 4, alpha)
    for b in range(BATCH):
        for w, (score, seq) in enumerate(expected[b]):
            np.testing.assert_array_equal(tokens[b, w], list(seq) + [PAD] * (N - len(seq)), err_msg=f"item {b}, beam {w}")
            assert abs(scores[b, w] - score) <= len(seq) * ATOL, (b, w, scores[b, w], score)


# A beam wider than the live candidates: with 4 target ids (PAD, BOS, EOS and one word) and
# W = 16, the first steps have fewer than W real extensions, so dead beams (log-probability
# near _NEG) fill the top W; alpha = 10 puts the length penalty past 2 at step 2, where a
# dead beam's EOS can score above _NEG / 2 and must not count as a finished hypothesis
# (counted, seeds 0 and 2 would return 32 and 16 phantom hypotheses scored -2.1e8).
@pytest.mark.parametrize("seed", [0, 2])
def test_a_beam_wider_than_the_vocabulary_finishes_only_real_hypotheses(seed):
    _, model, source = wide_beam_case(seed)
    N, W, alpha = WIDE_BEAM["max_new_tokens"], WIDE_BEAM["beam_size"], WIDE_BEAM["alpha"]
    tokens, scores = map(np.asarray, decoding.beam_search(model, source, N, beam_size=W, alpha=alpha))
    expected = reference_beam_search(model, source, N, W, alpha)
    for b in range(source.shape[0]):
        assert len(expected[b]) == W  # the reference holds W real hypotheses: all must come back
        for w, (score, seq) in enumerate(expected[b]):
            np.testing.assert_array_equal(tokens[b, w], list(seq) + [PAD] * (N - len(seq)), err_msg=f"item {b}, beam {w}")
            assert abs(scores[b, w] - score) <= len(seq) * ATOL, (b, w, scores[b, w], score)


PEAKED = 4.0


@pytest.fixture(scope="module")
def peaked_model():
    """The test model with its output layer scaled by PEAKED: logits 4x sharper, closer to a
    trained model's than the near-uniform ones of random weights."""
    torch_model, model = make_pair()
    with torch.no_grad():
        torch_model.decoder.fc.weight *= PEAKED
        torch_model.decoder.fc.bias *= PEAKED
    torch_to_flax(torch_model.state_dict(), model)
    return model


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_search_scores_at_least_as_well_as_greedy(peaked_model, source, alpha):
    # No theorem: beam search can prune the greedy path, and a wider beam can do worse. On
    # the near-uniform random model it does (item 4, alpha 0: beam of 4 -14.52, greedy
    # -10.40), and the plain reference above does the same, so that is beam search, not a
    # bug. On sharper logits it must hold; a search that loses good hypotheses breaks it.
    greedy = np.asarray(decoding.greedy_decode(peaked_model, source, N))
    greedy_score, n = recomputed_score(peaked_model, source, greedy, alpha)
    best = np.asarray(decoding.beam_search(peaked_model, source, N, beam_size=4, alpha=alpha)[1])[:, 0]
    assert np.all(best >= greedy_score - n * ATOL), (best, greedy_score)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_search_emits_only_pad_after_eos(beams, alpha):
    tokens = beams[alpha][0]
    assert (tokens == EOS).any()
    assert_pad_after_eos(tokens)


def test_length_penalty_is_gnmt():
    assert decoding.length_penalty(1, 0.0) == 1.0
    assert decoding.length_penalty(7, 1.0) == 2.0  # (5 + 7) / 6
    assert decoding.length_penalty(13, 0.5) == pytest.approx(3**0.5)


# --- sampling -------------------------------------------------------------------------


TOP_K = 3


@pytest.fixture(scope="module")
def sampled(model, source):
    return np.asarray(decoding.sample(model, source, N, seed=0))


def test_sampling_same_seed_gives_same_tokens(model, source, sampled):
    np.testing.assert_array_equal(np.asarray(decoding.sample(model, source, N, seed=0)), sampled)


def test_sampling_different_seed_gives_different_tokens(model, source, sampled):
    # The logits are spread out (random weights: std ~0.6 over 19 tokens), so two seeds
    # agreeing on every one of the sampled tokens would mean the seed is ignored.
    assert not np.array_equal(np.asarray(decoding.sample(model, source, N, seed=1)), sampled)


def test_sampling_with_top_k_1_equals_greedy(model, source, greedy):
    np.testing.assert_array_equal(np.asarray(decoding.sample(model, source, N, top_k=1, seed=3)), greedy)


def test_sampling_at_tiny_temperature_equals_greedy(model, source, greedy):
    temperature = 1e-4
    # Logits / temperature put the greedy choice >= 10 ahead of the runner-up: Gumbel noise
    # overturns a lead of m with probability 1 / (1 + e^m) < 5e-5 per token.
    assert greedy_margin(model, source, greedy) / temperature >= 10
    np.testing.assert_array_equal(np.asarray(decoding.sample(model, source, N, temperature=temperature, seed=3)), greedy)


def test_another_temperature_runs_the_same_compiled_loop(model, source, sampled):
    # The temperature is a traced value, not part of the program: a sampling server that
    # varies it per request compiles the loop once. Only the rule (greedy, or sampling with
    # its top_k, a shape) and the number of tokens make another program.
    compiled = decoding._token_by_token._cache_size()
    hot = np.asarray(decoding.sample(model, source, N, temperature=50.0, seed=0))
    assert decoding._token_by_token._cache_size() == compiled
    assert not np.array_equal(hot, sampled)  # the value reaches the loop: the same seed draws otherwise


def test_sampled_tokens_are_within_top_k(model, source):
    tokens = np.asarray(decoding.sample(model, source, N, temperature=1.5, top_k=TOP_K, seed=5))
    logits = teacher_forced_logits(model, source, tokens)  # the full forward, along the sample
    picked = np.take_along_axis(logits, tokens[..., None], -1)[..., 0]  # (B, N)
    kth = np.sort(logits, -1)[..., -TOP_K]
    on = live(tokens)
    # The cached logits that chose the token equal these within ATOL (incremental parity),
    # so a token at the k-th place may sit up to ATOL below the recomputed k-th logit.
    assert np.all(picked[on] >= kth[on] - ATOL)
    # Not vacuous: some sampled tokens are not the argmax.
    assert np.any(picked[on] < logits.max(-1)[on])
    assert_pad_after_eos(tokens)


def test_sampling_emits_only_pad_after_eos(sampled):
    assert (sampled == EOS).any(-1).sum() >= 2
    assert_pad_after_eos(sampled)


# --- bad input ------------------------------------------------------------------------


FLAX_DECODERS = {
    "greedy_decode": decoding.greedy_decode,
    "greedy_decode_uncached": decoding.greedy_decode_uncached,
    "sample": decoding.sample,
    "beam_search": decoding.beam_search,
}


def torch_decode(pair, source, max_new_tokens):
    return torch_greedy_decode(pair[0], torch.as_tensor(np.asarray(source)), max_new_tokens)


def flax_decode(name):
    return lambda pair, source, max_new_tokens: FLAX_DECODERS[name](pair[1], source, max_new_tokens)


DECODERS = {"torch_greedy_decode": torch_decode, **{name: flax_decode(name) for name in FLAX_DECODERS}}
BAD_INPUTS = {
    "empty source": (np.zeros((2, 0), np.int64), 3, "empty input"),
    "source longer than max_len": (np.ones((2, CONFIG.max_len + 1), np.int64), 3, "exceeds max_len=17"),
    "max_new_tokens > max_len": (np.ones((2, 4), np.int64), CONFIG.max_len + 1, "exceeds max_len=17"),
    "max_new_tokens = 0": (np.ones((2, 4), np.int64), 0, "must be >= 1"),
    "max_new_tokens < 0": (np.ones((2, 4), np.int64), -3, "must be >= 1"),
    "source id outside the vocabulary": (np.full((2, 4), CONFIG.source_vocab_size, np.int64), 3, r"outside the vocabulary \[0, 23\)"),
}


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_a_clear_error(pair, decoder, case):
    source, max_new_tokens, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        DECODERS[decoder](pair, source, max_new_tokens)


def test_a_nested_list_source_decodes_as_its_array(model, source, greedy):
    # The model's forward takes nested lists (check_tokens converts them); so do the decoders.
    np.testing.assert_array_equal(np.asarray(decoding.greedy_decode(model, source.tolist(), N)), greedy)


# Options of the wrong type: each refused by name before anything is traced (a float count
# would reach JAX as a shape, a string fail inside a comparison naming no option).
WRONG_TYPES = {
    "beam_size=2.5": (decoding.beam_search, 3, dict(beam_size=2.5), "beam size must be an integer, got 2.5"),
    "beam_size=True": (decoding.beam_search, 3, dict(beam_size=True), "beam size must be an integer, got True"),
    "alpha='0.6'": (decoding.beam_search, 3, dict(alpha="0.6"), "length penalty alpha must be a number, got '0.6'"),
    "max_new_tokens=3.0": (decoding.greedy_decode, 3.0, {}, "max_new_tokens must be an integer, got 3.0"),
    "max_new_tokens=None": (decoding.greedy_decode, None, {}, "max_new_tokens must be an integer, got None"),
    "top_k=2.5": (decoding.sample, 3, dict(top_k=2.5), "top_k must be an integer, got 2.5"),
    "temperature='1'": (decoding.sample, 3, dict(temperature="1"), "temperature must be a number, got '1'"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_an_option_of_the_wrong_type_is_refused_by_name(model, source, case):
    decoder, max_new_tokens, kwargs, message = WRONG_TYPES[case]
    with pytest.raises(OptionError, match=re.escape(message)):
        decoder(model, source, max_new_tokens, **kwargs)


def test_numpy_integers_are_counts_like_ints(model, source, greedy):
    compiled = decoding._token_by_token._cache_size()  # the int count's loop is compiled (`greedy`)
    np.testing.assert_array_equal(np.asarray(decoding.greedy_decode(model, source, np.int64(N))), greedy)
    assert decoding._token_by_token._cache_size() == compiled, "a numpy count compiled the loop again"


def test_float_source_is_refused(pair, source):
    with pytest.raises(TypeError, match="integers"):
        torch_decode(pair, source.astype(np.float32), 3)
    with pytest.raises(TypeError, match="integers"):
        decoding.greedy_decode(pair[1], source.astype(np.float32), 3)


@pytest.mark.parametrize("beam_size", [0, -1])
def test_beam_size_below_one_is_refused(model, source, beam_size):
    with pytest.raises(ValueError, match="beam size must be >= 1"):
        decoding.beam_search(model, source, 3, beam_size=beam_size)


@pytest.mark.parametrize("alpha", [-0.5, float("nan")])
def test_negative_length_penalty_is_refused(model, source, alpha):
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        decoding.beam_search(model, source, 3, alpha=alpha)


def test_a_length_penalty_float32_cannot_hold_is_refused_and_the_largest_allowed_still_ranks(model, source):
    # At max_len 17 the penalty is ((5 + 17) / 6) ** alpha: past 1e30 the scores (log p over it)
    # near float32's smallest normal number and round to 0; up to it they stay apart.
    most = MAX_LOG_LENGTH_PENALTY / np.log((5 + CONFIG.max_len) / 6)
    with pytest.raises(OptionError, match=r"alpha=60.0 makes the length penalty .* at 17 tokens: .*at most 53.17 here"):
        decoding.beam_search(model, source, N, alpha=60.0)
    # The `beams` fixture's beam size: alpha is a traced value, so this is its compiled search.
    _, scores = decoding.beam_search(model, source, N, beam_size=4, alpha=most)
    scores = np.asarray(scores)
    assert np.all(scores < 0) and np.all(scores[:, 0] > scores[:, 1])


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_temperature_not_positive_is_refused(model, source, temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        decoding.sample(model, source, 3, temperature=temperature)


@pytest.mark.parametrize("top_k", [0, -2, CONFIG.target_vocab_size + 1])
def test_top_k_outside_the_vocabulary_is_refused(model, source, top_k):
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 19\]"):
        decoding.sample(model, source, 3, top_k=top_k)


# --- exact match ----------------------------------------------------------------------


def test_exact_match_counts_every_labelled_position():
    target_out = np.array([[5, 6, EOS, PAD], [7, EOS, PAD, PAD], [8, EOS, PAD, PAD]])
    predicted = np.array([[5, 6, EOS], [7, 9, EOS], [8, EOS, PAD]])  # shorter: padded with PAD
    np.testing.assert_array_equal(exact_match(predicted, target_out), [True, False, True])


def test_a_narrow_integer_source_decodes_target_ids_past_its_range(source):
    # The output buffers are int32 whatever the source's integer dtype: an int8 source with a
    # target vocabulary past 127 would otherwise wrap the ids it emits. One layer a side: the
    # buffers' dtype does not depend on depth, and each of the four loops compiles in half the time.
    # Torch's random weights converted (transformer_pair): a Flax random init would compile its
    # initialisers for the new vocabulary's shapes.
    config = CONFIG.replace(target_vocab_size=300, num_layers=1)
    model = transformer_pair(config, seed=MODEL_SEED)[1]
    runs = {
        "greedy": lambda s: decoding.greedy_decode(model, s, N),
        "uncached": lambda s: decoding.greedy_decode_uncached(model, s, N),
        "sample": lambda s: decoding.sample(model, s, N, seed=3),
        "beam": lambda s: decoding.beam_search(model, s, N, beam_size=2)[0],
    }
    for name, run in runs.items():
        wide, narrow = np.asarray(run(source.astype(np.int32))), run(source.astype(np.int8))
        assert narrow.dtype == jnp.int32, name
        assert wide.max() > 127, f"{name}: no id past int8's range, so nothing could wrap"
        np.testing.assert_array_equal(np.asarray(narrow), wide, err_msg=name)
