"""GGUF loading (issue 10 item 1): the real SmolLM2 file's config, dequantization checked by
hand, the Q/K un-permutation checked three ways (exact round trip on a written file, RoPE
equivalence, and the whole model against the independent numpy forward), and the typed
refusals of files pootvk cannot run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pootvk.errors import (
    InvalidArgument,
    MissingMetadata,
    MissingTensor,
    ModelNotFound,
    TensorShapeMismatch,
    TensorTypeUnsupported,
    UnsupportedModel,
)
from pootvk.llm.gguf import (
    ORIENTATION,
    GGUFFile,
    llama_config,
    load_gguf,
    permute_qk,
    unpermute_qk,
)
from tests.helpers import nse
from tests.llm.numpy_llama import NumpyLlama

# --- a tiny llama GGUF written here --------------------------------------------------------

TINY = dict(layers=2, hidden=32, heads=4, kv_heads=2, ff=48, vocab=40, ctx=64)
LAYER = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
         "ffn_up", "ffn_down"]


def hf_weights(seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """Random weights in HF's layout and row order, named by GGUF (Q/K not yet permuted)."""
    rng = np.random.default_rng(seed)
    h, d = TINY["hidden"], TINY["hidden"] // TINY["heads"]
    shapes = {"attn_norm": (h,), "ffn_norm": (h,), "attn_q": (TINY["heads"] * d, h),
              "attn_k": (TINY["kv_heads"] * d, h), "attn_v": (TINY["kv_heads"] * d, h),
              "attn_output": (h, h), "ffn_gate": (TINY["ff"], h), "ffn_up": (TINY["ff"], h),
              "ffn_down": (h, TINY["ff"])}
    w = {"token_embd.weight": rng.standard_normal((TINY["vocab"], h)),
         "output_norm.weight": 1 + 0.1 * rng.standard_normal(h)}
    if not tied:
        w["output.weight"] = rng.standard_normal((TINY["vocab"], h)) / np.sqrt(h)
    for i in range(TINY["layers"]):
        for k in LAYER:
            s = shapes[k]
            w[f"blk.{i}.{k}.weight"] = (1 + 0.1 * rng.standard_normal(s) if len(s) == 1
                                        else rng.standard_normal(s) / np.sqrt(s[1]))
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_tiny(path: Path, weights: dict[str, np.ndarray], *, arch: str = "llama",
               skip: str | None = None, override: dict[str, np.ndarray] | None = None,
               meta: bool = True) -> Path:
    """A llama GGUF as llama.cpp's converter writes one: Q/K rows permuted."""
    import gguf

    wr = gguf.GGUFWriter(str(path), arch)
    if meta:
        wr.add_block_count(TINY["layers"])
    wr.add_context_length(TINY["ctx"])
    wr.add_embedding_length(TINY["hidden"])
    wr.add_feed_forward_length(TINY["ff"])
    wr.add_head_count(TINY["heads"])
    wr.add_head_count_kv(TINY["kv_heads"])
    wr.add_rope_freq_base(5000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    for name, a in weights.items():
        if name == skip:
            continue
        if name.endswith("attn_q.weight"):
            a = permute_qk(a, TINY["heads"])
        elif name.endswith("attn_k.weight"):
            a = permute_qk(a, TINY["kv_heads"])
        wr.add_tensor(name, (override or {}).get(name, a))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


TINY_META = {"llama.block_count": TINY["layers"], "llama.embedding_length": TINY["hidden"],
             "llama.attention.head_count": TINY["heads"],
             "llama.attention.head_count_kv": TINY["kv_heads"],
             "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 5000.0}


def pootvk_to_gguf(weights: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """pootvk's names back to GGUF's (stated here again, independently of the loader)."""
    names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
             "wo": "attn_output", "mlp_norm": "ffn_norm", "w_gate": "ffn_gate",
             "w_up": "ffn_up", "w_down": "ffn_down"}
    out = {"token_embd.weight": weights["embed"], "output_norm.weight": weights["norm"],
           "output.weight": weights["lm_head"]}
    for i in range(layers):
        out |= {f"blk.{i}.{g}.weight": weights[f"l{i}.{p}"] for p, g in names.items()}
    return out


# --- the layout ----------------------------------------------------------------------------


def test_unpermute_inverts_the_converters_permute():
    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(6 * 8, 5)
    g = permute_qk(w, 6)
    assert not np.array_equal(g, w)
    np.testing.assert_array_equal(unpermute_qk(g, 6), w)
    # within head 1, GGUF row 2i is HF row i and row 2i+1 is HF row i + d/2 (d = 8)
    np.testing.assert_array_equal(g[8 + 2 * 3], w[8 + 3])
    np.testing.assert_array_equal(g[8 + 2 * 3 + 1], w[8 + 3 + 4])


def test_unpermuted_rows_with_half_rope_equal_stored_rows_with_adjacent_rope():
    """The claim the loader rests on: HF rows rotated HF's way are GGUF's rows rotated
    llama.cpp's way, reordered; so every q.k score (what attention sees) is unchanged."""
    heads, d, n_in = 3, 16, 24
    rng = np.random.default_rng(3)
    stored = rng.standard_normal((heads * d, n_in))  # as in the file
    x = rng.standard_normal((5, n_in))
    meta = {**TINY_META, "llama.embedding_length": heads * d,
            "llama.attention.head_count": heads, "llama.attention.head_count_kv": heads,
            "llama.block_count": 0}
    dummy = {"token_embd.weight": np.zeros((1, heads * d)),
             "output_norm.weight": np.zeros(heads * d)}
    adj = NumpyLlama.from_tensors(dummy, meta, "adjacent", np.float64)
    half = NumpyLlama.from_tensors(dummy, meta, "half", np.float64)
    pos = np.arange(7, 12)
    a = adj._rope((x @ stored.T).reshape(5, heads, d), pos)
    b = half._rope((x @ unpermute_qk(stored, heads).T).reshape(5, heads, d), pos)
    perm = unpermute_qk(np.arange(heads * d), heads).reshape(heads, d)[0]
    np.testing.assert_allclose(a[..., perm], b, rtol=1e-12, atol=1e-12)
    scores_a = np.einsum("nhd,mhd->hnm", a, a)
    scores_b = np.einsum("nhd,mhd->hnm", b, b)
    np.testing.assert_allclose(scores_a, scores_b, rtol=1e-10, atol=1e-10)
    # and the un-permutation is needed: the stored rows rotated HF's way differ
    c = half._rope((x @ stored.T).reshape(5, heads, d), pos)
    assert np.abs(np.einsum("nhd,mhd->hnm", c, c) - scores_a).max() > 1e-2


@pytest.mark.parametrize("tied", [True, False])
def test_written_file_loads_back_to_hf_layout(tmp_path, tied):
    w = hf_weights(1, tied)
    seen: list[tuple[int, int]] = []
    m = load_gguf(write_tiny(tmp_path / "t.gguf", w), weight_dtype="float32",
                  progress=lambda done, total, line: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    c = m.config
    assert (c.layers, c.hidden, c.q_heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab,
            c.capacity, c.rope_theta) == (2, 32, 4, 2, 8, 48, 40, 64, 5000.0)
    assert c.eps == pytest.approx(1e-5) and m.tied_embeddings is tied and ORIENTATION == "out_in"
    assert set(m.weights) == set(c.weight_shapes())
    back = pootvk_to_gguf(m.weights, c.layers)
    for name, ref in w.items():
        np.testing.assert_array_equal(back[name], ref, err_msg=name)
    if tied:
        assert back["output.weight"] is back["token_embd.weight"]
    with pytest.raises(InvalidArgument, match="capacity"):
        load_gguf(tmp_path / "t.gguf", capacity=0)
    f16 = load_gguf(tmp_path / "t.gguf", capacity=16)
    assert f16.config.capacity == 16 and f16.config.weight_dtype == "float16"
    assert all(a.dtype == np.float16 for a in f16.weights.values())
    np.testing.assert_array_equal(f16.weights["l1.wq"], m.weights["l1.wq"].astype(np.float16))


# --- the real file ---------------------------------------------------------------------------


def test_smollm2_config_is_the_issues(smollm2_f32):
    c = smollm2_f32.config
    assert (c.layers, c.hidden, c.q_heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab,
            c.rope_theta) == (30, 576, 9, 3, 64, 1536, 49152, 100000.0)
    assert c.eps == pytest.approx(1e-5) and smollm2_f32.tied_embeddings
    assert llama_config(smollm2_f32.file).capacity == 8192  # the file's context length
    assert smollm2_f32.weights["lm_head"] is smollm2_f32.weights["embed"]


def _q4_1_rows(raw: np.ndarray) -> np.ndarray:
    """ggml's Q4_1 by its definition: blocks of 32 as (f16 d, f16 m, 16 bytes); value j of
    a block is d * q + m, q the low nibble of byte j (j < 16) or the high one of j - 16."""
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[..., 4:20]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.float32)
    return (q * d + m).reshape(raw.shape[0], -1)


def _q8_0_rows(raw: np.ndarray) -> np.ndarray:
    """ggml's Q8_0: blocks of 32 as (f16 d, 32 int8); value = d * q."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:34].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(raw.shape[0], -1)


def test_smollm2_dequantization_by_hand(smollm2_f32):
    """Two tensors decoded from the raw bytes by the formats' definitions: the loader's
    values, shape (out, in) and the un-permutation of the real Q rows."""
    f = smollm2_f32.file
    raw_q = f.tensors["blk.3.attn_q.weight"]
    assert raw_q.tensor_type.name == "Q4_1"
    q = _q4_1_rows(np.asarray(raw_q.data))
    np.testing.assert_array_equal(smollm2_f32.weights["l3.wq"], unpermute_qk(q, 9))
    down = _q4_1_rows(np.asarray(f.tensors["blk.29.ffn_down.weight"].data))
    assert down.shape == (576, 1536)
    np.testing.assert_array_equal(smollm2_f32.weights["l29.w_down"], down)
    emb = f.tensors["token_embd.weight"]
    assert emb.tensor_type.name == "Q8_0"
    rows = np.asarray(emb.data)[[0, 1, 4093, 49151]]
    np.testing.assert_array_equal(smollm2_f32.weights["embed"][[0, 1, 4093, 49151]],
                                  _q8_0_rows(rows))


def test_loaded_weights_match_the_independent_forward(smollm2_f32, smollm2_reference):
    """pootvk's weights (HF rows, (out, in), tied head) run HF's way match the GGUF tensors
    run llama.cpp's way: 16 prompt tokens, then 4 greedy steps, logits nse <= 1e-6."""
    cfg = smollm2_f32.config
    meta = {"llama.block_count": cfg.layers, "llama.embedding_length": cfg.hidden,
            "llama.attention.head_count": cfg.q_heads,
            "llama.attention.head_count_kv": cfg.kv_heads,
            "llama.attention.layer_norm_rms_epsilon": cfg.eps,
            "llama.rope.freq_base": cfg.rope_theta}
    ours = NumpyLlama.from_tensors(pootvk_to_gguf(smollm2_f32.weights, cfg.layers), meta,
                                   "half", capacity=64)
    # "Once upon a time, there was a little girl who lived in a small village" (SmolLM2's
    # tokenizer; the ids only need to be real tokens)
    prompt = [6403, 1980, 253, 655, 28, 665, 436, 253, 1838, 8180, 617, 4161, 281, 253, 1165,
              6560]
    ref = smollm2_reference
    ref.reset()
    a, b = ours.prefill(prompt), ref.prefill(prompt)
    assert a.shape == (16, cfg.vocab)
    assert nse(a, b) <= 1e-6, nse(a, b)
    for _ in range(4):
        tok = int(np.argmax(b[-1]))
        assert int(np.argmax(a[-1])) == tok
        a, b = ours.step(tok)[None], ref.step(tok)[None]
        assert nse(a, b) <= 1e-6, nse(a, b)


# --- refusals --------------------------------------------------------------------------------


def test_another_architecture_is_refused_naming_it(tmp_path):
    p = write_tiny(tmp_path / "g.gguf", hf_weights(), arch="gpt2")
    with pytest.raises(UnsupportedModel, match="general.architecture = 'gpt2'") as e:
        GGUFFile(p)
    assert e.value.value == "gpt2" and e.value.supported == ["llama"]


def test_missing_tensor_is_refused_naming_it(tmp_path):
    p = write_tiny(tmp_path / "m.gguf", hf_weights(), skip="blk.1.ffn_up.weight")
    with pytest.raises(MissingTensor, match="blk.1.ffn_up.weight") as e:
        load_gguf(p)
    assert e.value.count == 2 * 9 + 2 - 1


def test_missing_metadata_is_refused_naming_it(tmp_path):
    p = write_tiny(tmp_path / "k.gguf", hf_weights(), meta=False)
    with pytest.raises(MissingMetadata, match="llama.block_count"):
        load_gguf(p)


def test_undequantizable_tensor_type_is_refused_naming_it(tmp_path):
    w = hf_weights()
    bad = {"blk.0.ffn_gate.weight": np.zeros((48, 32), np.int32)}
    p = write_tiny(tmp_path / "i.gguf", w, override=bad)
    with pytest.raises(TensorTypeUnsupported, match="blk.0.ffn_gate.weight.*I32") as e:
        load_gguf(p)
    assert e.value.ggml_type == "I32"


def test_wrong_tensor_shape_is_refused_with_both_shapes(tmp_path):
    p = write_tiny(tmp_path / "s.gguf", hf_weights(),
                   override={"blk.1.attn_v.weight": np.zeros((16, 31), np.float32)})
    with pytest.raises(TensorShapeMismatch) as e:
        load_gguf(p)
    assert (e.value.tensor, e.value.expected, e.value.got) == (
        "blk.1.attn_v.weight", (16, 32), (16, 31))


def test_not_a_gguf_and_unknown_model_are_refused(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(UnsupportedModel, match="file format"):
        GGUFFile(junk)
    with pytest.raises(ModelNotFound, match="smollm2") as e:
        GGUFFile(tmp_path / "nope.gguf")
    assert "smollm2" in e.value.known
