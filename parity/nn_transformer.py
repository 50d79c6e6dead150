"""PyTorch's own ``nn.Transformer`` as the seed model: the rename map, and what must match.

Seed 001's model is PyTorch's post-LayerNorm ``nn.Transformer`` (ReLU, ``dim_feedforward`` =
the feed-forward width, no final encoder or decoder norm) plus token and position embeddings
and an output projection: ``Seq2SeqTransformer`` below, whose keys ``NN_TRANSFORMER_RENAME``
maps onto the seed's (``in_proj_weight`` split into W_q, W_k, W_v; ``norm1/2/3`` to the seed's
names). ``parity check --torch-checkpoint`` and ``parity convert`` detect such a state dict by
its keys and apply the map.

Differences, and how ``Seq2SeqTransformer`` removes them (see tests/test_parity_nn_transformer.py):
- nn.Transformer builds final LayerNorms after the encoder and the decoder; the seed has none.
  ``custom_encoder`` / ``custom_decoder`` with ``norm=None``. A state dict holding
  ``transformer.encoder.norm.*`` is refused by name.
- masking: the seed fills masked scores with -1e20 and then scales by 1/sqrt(K); torch adds
  -inf (a boolean mask) to scaled scores. Both give masked keys a weight of exactly 0 unless
  every key of a row is masked: then the seed attends uniformly and torch returns NaN.
- ``enable_nested_tensor=False``: with it, torch's eval fast path returns zeros at padded source
  positions; the seed computes them (they are masked out downstream either way).
- ``bias=False`` leaves keys out, which ``check_module`` names once rather than the conversion
  key by key.
- ``norm_first=True``, GELU and a ``layer_norm_eps`` other than 1e-5 are not in a state dict:
  ``check_module`` refuses them on the module; from a checkpoint alone ``parity check`` shows
  them as a divergence at the first norm (an epsilon slip only when it is large enough).
"""

import torch
from torch import nn

from flaxformer_mini.model.primitives import LAYER_NORM_EPS  # the twins' epsilon, nn.LayerNorm's default
from parity.engine import ConversionError
from parity.rename import Rename


def _attention(src, dst):
    return {
        f"{src}.in_proj_weight": tuple(f"{dst}.{w}.weight" for w in ("W_q", "W_k", "W_v")),
        f"{src}.in_proj_bias": tuple(f"{dst}.{w}.bias" for w in ("W_q", "W_k", "W_v")),
        f"{src}.out_proj.weight": f"{dst}.fc.weight",
        f"{src}.out_proj.bias": f"{dst}.fc.bias",
    }


def _pairs(src, dst, names):
    return {f"{src}.{a}.{p}": f"{dst}.{b}.{p}" for a, b in names for p in ("weight", "bias")}


_ENC, _DEC = "transformer.encoder.layers.{}", "transformer.decoder.layers.{}"
_SEED_ENC, _SEED_DEC = "encoder.transformer_layers.{}", "decoder.decoder_layers.{}"

NN_TRANSFORMER_RENAME = {
    "src_embed.weight": "encoder.embedding_layer.weight",
    "src_pos.weight": "encoder.positional_encoding.weight",
    "tgt_embed.weight": "decoder.embedding_layer.weight",
    "tgt_pos.weight": "decoder.positional_embedding.weight",
    "out.weight": "decoder.fc.weight",
    "out.bias": "decoder.fc.bias",
    **_attention(f"{_ENC}.self_attn", f"{_SEED_ENC}.attention"),
    **_pairs(_ENC, _SEED_ENC, [("linear1", "fc.0"), ("linear2", "fc.2"), ("norm1", "norm1"), ("norm2", "norm2")]),
    **_attention(f"{_DEC}.self_attn", f"{_SEED_DEC}.attention"),
    **_attention(f"{_DEC}.multihead_attn", f"{_SEED_DEC}.transformer_block.attention"),
    **_pairs(_DEC, f"{_SEED_DEC}", [("norm1", "norm"), ("norm2", "transformer_block.norm1"),
                                   ("norm3", "transformer_block.norm2")]),
    **_pairs(_DEC, f"{_SEED_DEC}.transformer_block", [("linear1", "fc.0"), ("linear2", "fc.2")]),
}

_MARKER = "transformer.encoder.layers.0.self_attn.in_proj_weight"
_FINAL_NORMS = ("transformer.encoder.norm.", "transformer.decoder.norm.")


def is_nn_transformer(state_dict):
    """Whether ``state_dict`` has nn.Transformer's keys (``Seq2SeqTransformer``'s)."""
    return _MARKER in state_dict


def to_seed_state_dict(state_dict):
    """The seed's state dict (torch tensors, seed keys) of a ``Seq2SeqTransformer`` state dict."""
    final = sorted(k for k in state_dict if k.startswith(_FINAL_NORMS))
    if final:
        raise ConversionError(
            f"this nn.Transformer has final encoder/decoder LayerNorms ({', '.join(final)}), which the seed "
            f"model does not: build it with custom_encoder/custom_decoder whose norm is None")
    return Rename(NN_TRANSFORMER_RENAME).forward(state_dict, split=lambda v, n: torch.chunk(v, n, dim=0))


def from_seed_state_dict(state_dict):
    """A seed state dict renamed back to ``Seq2SeqTransformer``'s keys (in_proj concatenated)."""
    return Rename(NN_TRANSFORMER_RENAME).backward(state_dict, concat=lambda vs: torch.cat(list(vs), dim=0))


def check_module(transformer: nn.Transformer):
    """Refuse, naming each, the nn.Transformer settings the seed model does not compute."""
    problems = []
    for name, stack in (("encoder", transformer.encoder), ("decoder", transformer.decoder)):
        if stack.norm is not None:
            problems.append(f"a final {name} LayerNorm (pass custom_{name} with norm=None)")
        layer = stack.layers[0]
        if layer.norm_first:
            problems.append(f"norm_first=True in the {name} (the seed is post-LayerNorm)")
        if layer.activation is not torch.nn.functional.relu and not isinstance(layer.activation, nn.ReLU):
            problems.append(f"{name} activation {getattr(layer.activation, '__name__', layer.activation)} (the seed uses ReLU)")
        if layer.linear1.bias is None:
            problems.append(f"bias=False in the {name} (the seed's layers have biases)")
        # layer_norm_eps is in no state dict, and a slip there passes float32's tolerance at
        # small ones (the seed's nn.LayerNorm keeps torch's default).
        eps = sorted({norm.eps for norm in (layer.norm1, layer.norm2, getattr(layer, "norm3", layer.norm1))})
        if eps != [LAYER_NORM_EPS]:
            problems.append(f"layer_norm_eps={', '.join(map(str, eps))} in the {name} (the seed's LayerNorms use "
                            f"{LAYER_NORM_EPS})")
    if problems:
        raise ConversionError("this nn.Transformer differs from the seed model: " + "; ".join(problems))


class Seq2SeqTransformer(nn.Module):
    """Token + position embeddings around ``nn.Transformer``, then an output projection: the
    seed model's function, in PyTorch's own layers (batch_first, post-LN, ReLU, no final norms)."""

    def __init__(self, src_pad_idx, source_vocab_size, target_vocab_size, max_len, embed_size, heads, num_layers,
                 dropout, dim_feedforward=None):
        super().__init__()
        self.src_pad_idx = src_pad_idx
        ffn = dim_feedforward or embed_size  # the seed's feed-forward keeps width D
        self.src_embed = nn.Embedding(source_vocab_size, embed_size)
        self.src_pos = nn.Embedding(max_len, embed_size)
        self.tgt_embed = nn.Embedding(target_vocab_size, embed_size)
        self.tgt_pos = nn.Embedding(max_len, embed_size)
        kw = dict(d_model=embed_size, nhead=heads, dim_feedforward=ffn, dropout=dropout, batch_first=True)
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), num_layers, norm=None,
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), num_layers, norm=None)
        self.transformer = nn.Transformer(**kw, custom_encoder=encoder, custom_decoder=decoder)
        self.out = nn.Linear(embed_size, target_vocab_size)

    def forward(self, source, target):
        S, T = source.shape[1], target.shape[1]
        x = self.src_embed(source) + self.src_pos(torch.arange(S, device=source.device))
        y = self.tgt_embed(target) + self.tgt_pos(torch.arange(T, device=target.device))
        pad = source == self.src_pad_idx  # True: masked (torch's convention; the seed's masks keep with 1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=target.device), diagonal=1)
        h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return self.out(h)
