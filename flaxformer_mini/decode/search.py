"""Autoregressive decoding with the key/value cache (cache.py): greedy, sampling and beam search.

The search loops (``lax.while_loop``) run inside ``jax.jit`` with fixed shapes, so one
compilation serves every step. ``greedy_decode_uncached`` recomputes the whole decoder for
every new token, the way the seed describes inference; tests use it as the reference the
cached path must match, and the benchmark compares the two.

Shapes: B batch, S source length, N decode positions, V target vocabulary, W beams.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_mini.data import BOS, EOS, PAD
from flaxformer_mini.decode.cache import decode_one_token, prefill
from flaxformer_mini.decode.options import DEFAULT_LENGTH_PENALTY, check_options, integer_option
from flaxformer_mini.model.token_checks import check_tokens

_NEG = -1e9  # a score no hypothesis reaches; finite, so no inf - inf = NaN anywhere
# beam_search's scores at or below this are no hypothesis (_NEG: a beam wider than the
# hypotheses that exist, as when W exceeds the vocabulary).
NO_HYPOTHESIS = _NEG / 2


# Each model structure's eval-mode graph definition, by the graph definition it was made from
# (a GraphDef is static and hashable: jit keys its programs by it). A decoding call then walks
# the model's graph once (nnx.split), where making an eval-mode view takes four walks (split,
# merge, eval, split), each a Python traversal of every module and variable.
_EVAL_GRAPHDEFS = {}
_EVAL_GRAPHDEFS_KEPT = 64  # structures a process decodes with: a few; the bound is for long-lived callers


def eval_split(model):
    """An eval-mode ``(graphdef, state)`` of ``model``, leaving the caller's model in the mode
    it was (``torch_ref``'s decoder restores it too). The state holds the model's arrays
    themselves (nothing is copied)."""
    graphdef, state = nnx.split(model)
    eval_graphdef = _EVAL_GRAPHDEFS.get(graphdef)
    if eval_graphdef is None:
        # merge(graphdef, state) is a new module tree over the same arrays: switching it to
        # eval mode leaves the caller's modules untouched.
        view = nnx.merge(graphdef, state)
        view.eval()
        if len(_EVAL_GRAPHDEFS) >= _EVAL_GRAPHDEFS_KEPT:
            _EVAL_GRAPHDEFS.clear()
        eval_graphdef = _EVAL_GRAPHDEFS[graphdef] = nnx.graphdef(view)
    return eval_graphdef, state


def _check(model, source, max_new_tokens):
    """Check the inputs; return ``(source as an array, the count as an int, *eval_split(model))``.
    ``source`` may be any array-like of ids, nested lists included, as the model's forward takes.
    The count is a static argument of the loops: a numpy integer would key a compilation of its
    own, though it equals the int."""
    model.check_has_arrays()
    c = model.config
    # Checked here first: check_options reads None as "not given", and decoding needs it.
    max_new_tokens = integer_option("max_new_tokens", max_new_tokens)
    check_options(c, max_new_tokens=max_new_tokens)
    check_tokens(source, c.source_vocab_size, c.max_len, "source")
    # int32 whatever integer dtype came in: the output buffers take the source's dtype, and an
    # int8 or uint8 one would wrap target ids past its range (the target vocabulary may be larger).
    source = jnp.asarray(source, jnp.int32)
    if source.shape[1] == 0:
        raise ValueError("source: empty input (length 0)")
    return source, max_new_tokens, *eval_split(model)


# Loop bodies (lax.while_loop, fori_loop) merge their own copy of the model from (graphdef,
# state) rather than closing over the model merged outside the loop: an nnx transform inside
# the model (the nnx.scan of scanned layers) refuses Variables of another trace level, and
# copy=True makes new ones in the body's. Merging costs nothing at run time: it happens
# once, while the body is traced.

# --- greedy and sampling --------------------------------------------------------------


def _pick(rule, logits, t, key, temperature):
    """The next token (B,) from logits (B, V). ``rule`` is ("greedy",) or ("sample", top_k):
    hashable and static, since top_k sets a shape. ``temperature`` is a traced scalar: every
    temperature runs the same compiled loop."""
    if rule[0] == "greedy":
        return jnp.argmax(logits, axis=-1)
    _, top_k = rule
    logits = logits.astype(jnp.float32)
    # Shift the largest logit to 0 before dividing: as temperature -> 0 the others go to
    # -inf and sampling becomes greedy, with no overflow to inf - inf = NaN on the way.
    scaled = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature
    if top_k:
        # The k most likely tokens by the logits themselves, not the scaled ones: an infinite
        # temperature scales every logit to 0, and top-k must still hold.
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]  # (B, 1): the k-th largest logit
        scaled = jnp.where(logits < kth, -jnp.inf, scaled)
    return jax.random.categorical(jax.random.fold_in(key, t), scaled, axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _token_by_token(graphdef, state, source, max_new_tokens, rule, key, temperature):
    model = nnx.merge(graphdef, state)
    B = source.shape[0]
    cache = prefill(model, source, max_new_tokens, check_inputs=False)  # _check checked both

    def cond(carry):
        t, _, _, _, done = carry
        return (t < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        t, tokens, cache, out, done = carry
        # The body's own copy of the model: nnx transforms refuse Variables of another trace.
        logits, cache = decode_one_token(nnx.merge(graphdef, state, copy=True), cache, tokens, t, check_inputs=False)
        token = jnp.where(done, PAD, _pick(rule, logits, t, key, temperature).astype(tokens.dtype))  # after EOS, padding
        return t + 1, token, cache, out.at[:, t].set(token), done | (token == EOS)

    init = (0, jnp.full((B,), BOS, source.dtype), cache, jnp.full((B, max_new_tokens), PAD, source.dtype),
            jnp.zeros((B,), jnp.bool_))
    return jax.lax.while_loop(cond, body, init)[3]


def greedy_decode(model, source, max_new_tokens):
    """Greedy tokens (B, max_new_tokens) for ``source`` (B, S), with the KV cache: EOS
    included, PAD after it. ``max_new_tokens`` may be at most ``max_len``."""
    source, max_new_tokens, graphdef, state = _check(model, source, max_new_tokens)
    return _token_by_token(graphdef, state, source, max_new_tokens, ("greedy",), jax.random.key(0),
                           jnp.float32(1.0))


def sample(model, source, max_new_tokens, *, temperature=1.0, top_k=None, seed=0):
    """Sampled tokens (B, max_new_tokens): softmax(logits / temperature), restricted to the
    ``top_k`` most likely tokens when given. The same seed gives the same tokens."""
    check_options(model.config, temperature=temperature, top_k=top_k)
    source, max_new_tokens, graphdef, state = _check(model, source, max_new_tokens)
    return _token_by_token(graphdef, state, source, max_new_tokens, ("sample", top_k),
                           jax.random.key(seed), jnp.float32(temperature))


# --- beam search ----------------------------------------------------------------------


def length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha (Wu et al. 2016), as in the Flax WMT example."""
    return ((5.0 + length) / 6.0) ** alpha


def _take(x, index):
    """x (B, M, ...) gathered along axis 1 by index (B, W) -> (B, W, ...)."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _beam(graphdef, state, source, max_new_tokens, beam_size, alpha):
    model = nnx.merge(graphdef, state)
    B, W, N = source.shape[0], beam_size, max_new_tokens
    cache = prefill(model, source, N, check_inputs=False).repeat_rows(W)  # beams of item b at rows b*W..b*W+W-1
    V = model.config.target_vocab_size

    def cond(carry):
        t, *_, fin_score = carry
        return (t < N) & ~jnp.all(fin_score[:, -1] > _NEG / 2)  # every item has W finished

    def body(carry):
        t, tokens, cache, alive_seq, alive_logp, fin_seq, fin_score = carry
        # (B*W, V); the body's own copy of the model: nnx transforms refuse Variables of another trace
        logits, cache = decode_one_token(nnx.merge(graphdef, state, copy=True), cache, tokens, t, check_inputs=False)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(B, W, V) + alive_logp[..., None]
        # 2W candidates: even if W of them end in EOS, W remain to continue.
        cand_logp, flat = jax.lax.top_k(logp.reshape(B, W * V), 2 * W)  # (B, 2W)
        beam, token = flat // V, (flat % V).astype(tokens.dtype)
        cand_seq = _take(alive_seq, beam).at[:, :, t].set(token)  # (B, 2W, N)
        is_eos = token == EOS

        # Finished hypotheses, as in fairseq: an EOS candidate is final only if it ranks among
        # the top W candidates, and an item is done once it has W final hypotheses (later
        # candidates do not enter). With W = 1 this is exactly greedy decoding.
        done = fin_score[:, -1] > _NEG / 2
        # (1, 2W), not (2W,): under jax_numpy_rank_promotion="raise" (the tests' setting) the
        # implicit (B, 2W) & (2W,) broadcast is an error, and beam search failed to trace.
        top_w = (jnp.arange(2 * W) < W)[None, :]
        # A candidate from a dead beam (log-probability near _NEG: fewer real candidates than W,
        # as when W exceeds the vocabulary) is never final: divided by a length penalty above 2
        # its score would pass _NEG / 2 and a phantom hypothesis would count as finished.
        real = cand_logp > _NEG / 2
        final = is_eos & top_w & real & ~done[:, None]
        cand_score = jnp.where(final, cand_logp / length_penalty(t + 1, alpha), _NEG)
        fin_score, keep = jax.lax.top_k(jnp.concatenate([fin_score, cand_score], axis=1), W)
        fin_seq = _take(jnp.concatenate([fin_seq, cand_seq], axis=1), keep)

        # Alive hypotheses: the best W that did not end.
        alive_logp, keep = jax.lax.top_k(jnp.where(is_eos, _NEG, cand_logp), W)
        alive_seq, parent = _take(cand_seq, keep), _take(beam, keep)  # (B, W, N), (B, W)
        rows = (jnp.arange(B)[:, None] * W + parent).reshape(-1)
        cache = cache.replace(self_k=cache.self_k[:, rows], self_v=cache.self_v[:, rows])
        return t + 1, _take(token, keep).reshape(-1), cache, alive_seq, alive_logp, fin_seq, fin_score

    alive_logp = jnp.full((B, W), _NEG).at[:, 0].set(0.0)  # one live beam at the start
    init = (0, jnp.full((B * W,), BOS, source.dtype), cache, jnp.full((B, W, N), PAD, source.dtype), alive_logp,
            jnp.full((B, W, N), PAD, source.dtype), jnp.full((B, W), _NEG))
    t, _, _, alive_seq, alive_logp, fin_seq, fin_score = jax.lax.while_loop(cond, body, init)

    # Items that ran out of positions before W hypotheses finished: their live beams compete,
    # scored at the length they reached.
    done = fin_score[:, -1] > _NEG / 2
    alive_score = jnp.where(done[:, None] | (alive_logp <= _NEG / 2), _NEG, alive_logp / length_penalty(t, alpha))
    scores, keep = jax.lax.top_k(jnp.concatenate([fin_score, alive_score], axis=1), W)
    return _take(jnp.concatenate([fin_seq, alive_seq], axis=1), keep), scores


def beam_search(model, source, max_new_tokens, *, beam_size=4, alpha=DEFAULT_LENGTH_PENALTY):
    """Beam search: (tokens (B, W, N), scores (B, W)), beams sorted best first. A score is
    the hypothesis's log-probability divided by ``length_penalty(length, alpha)``."""
    check_options(model.config, beam_size=beam_size, alpha=alpha)
    source, max_new_tokens, graphdef, state = _check(model, source, max_new_tokens)
    return _beam(graphdef, state, source, max_new_tokens, beam_size, float(alpha))


def decode(model, source, max_new_tokens, *, beam_size=1, alpha=DEFAULT_LENGTH_PENALTY, temperature=None,
           top_k=None, seed=0):
    """One output (B, N) per source row: the best beam with ``beam_size`` > 1, a sample when
    ``temperature`` or ``top_k`` is given, else greedy. (evaluate and generate use this.)"""
    check_options(model.config, beam_size=beam_size, alpha=alpha)  # a beam size of 0 is no greedy search
    if beam_size > 1:
        return beam_search(model, source, max_new_tokens, beam_size=beam_size, alpha=alpha)[0][:, 0]
    if temperature is not None or top_k is not None:
        return sample(model, source, max_new_tokens, temperature=1.0 if temperature is None else temperature,
                      top_k=top_k, seed=seed)
    return greedy_decode(model, source, max_new_tokens)


# --- the uncached reference -----------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy_uncached(graphdef, state, source, max_new_tokens):
    model = nnx.merge(graphdef, state)
    enc_out, source_mask = model.encode(source, check_inputs=False)  # _check checked it
    B, N = source.shape[0], max_new_tokens
    # buf[:, 0] is BOS, buf[:, t + 1] the token chosen at step t. The decoder reads the first N
    # slots only: the last token is emitted, never fed back, so N positions suffice.
    buf = jnp.full((B, N + 1), PAD, source.dtype).at[:, 0].set(BOS)
    target_mask = model.create_target_mask(buf[:, :N])

    def step(t, carry):
        buf, done = carry
        decoder = nnx.merge(graphdef, state, copy=True).decoder  # the body's own copy, as above
        logits = decoder(buf[:, :N], enc_out, source_mask, target_mask)  # (B, N, V)
        token = jnp.where(done, PAD, jnp.argmax(logits[:, t], axis=-1).astype(buf.dtype))
        return buf.at[:, t + 1].set(token), done | (token == EOS)

    buf, _ = jax.lax.fori_loop(0, N, step, (buf, jnp.zeros((B,), jnp.bool_)))
    return buf[:, 1:]


def greedy_decode_uncached(model, source, max_new_tokens):
    """Greedy decoding that runs the full decoder over the whole target buffer for every new
    token (no cache): the reference for ``greedy_decode``, and the benchmark's baseline."""
    source, max_new_tokens, graphdef, state = _check(model, source, max_new_tokens)
    return _greedy_uncached(graphdef, state, source, max_new_tokens)
