"""The Llama test model built with block-sparse attention: every layer's selection and
attention fused, the device's logits the oracle's (prefill and decode, past many blocks),
and with top_k at least the block count the sparse model is the dense one."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import InvalidArgument
from pootvk.ir import prims as P
from pootvk.llm import LlamaConfig, LlamaModel, OracleLlama, random_weights
from tests.helpers import nse

SMALL = dict(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=128,
             vocab=96, capacity=128)


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_sparse_model_matches_the_oracle(device, kv_dtype):
    cfg = LlamaConfig(**SMALL, kv_dtype=kv_dtype, sparse_block=16, sparse_top_k=2)
    w = random_weights(cfg, seed=3)
    oracle = OracleLlama(cfg, w)
    prompt = [5, 9, 2, 7, 1, 3, 8, 4, 6, 0, 11, 12, 13, 2, 5, 9, 1, 4, 7, 3]  # 20 tokens
    with LlamaModel(cfg, w, device) as model:
        g = model.program.plan.graph
        assert g.count(P.SELECTED_ATTENTION) == cfg.layers
        assert g.count(P.BLOCK_TOPK) == cfg.layers
        errs, got, want = [], [], []
        for (t_dev, l_dev), (t_ref, l_ref) in zip(model.generate(prompt, 60),
                                                  oracle.generate(prompt, 60), strict=True):
            got.append(t_dev)
            want.append(t_ref)
            errs.append(nse(l_dev, l_ref))
        assert model.position == 79  # four blocks complete: the selection has choices
        assert got == want
        assert max(errs) <= 5e-4, max(errs)


def test_top_k_over_every_block_is_dense_attention(device):
    """A row's complete blocks all selected plus its own block up to its position is the
    causal attention the dense model runs: the same logits."""
    dense_cfg = LlamaConfig(**SMALL)
    sparse_cfg = LlamaConfig(**SMALL, sparse_block=16, sparse_top_k=8)
    w = random_weights(dense_cfg, seed=4)
    with LlamaModel(dense_cfg, w, device) as dense, LlamaModel(sparse_cfg, w, device) as sp:
        for tok in [3, 1, 4, 1, 5, 9, 2, 6] * 5:
            np.testing.assert_allclose(sp.step(tok), dense.step(tok), rtol=2e-4, atol=2e-5)


def test_sparse_config_is_checked():
    with pytest.raises(InvalidArgument, match="sparse_top_k"):
        LlamaConfig(**SMALL, sparse_block=16)
    with pytest.raises(InvalidArgument, match="divisor of capacity=128"):
        LlamaConfig(**SMALL, sparse_block=48, sparse_top_k=1)
