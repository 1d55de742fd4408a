"""The Llama graph over a paged KV cache (``llm.paged_model``) against the fixed-capacity
model: two sequences of different lengths share one batch, their K/V in scattered blocks
of one pool (``llm.blocks``); every row's logits must equal what the fixed-capacity oracle
model gives for that sequence alone, token by token (decode) and for a prefill chunk. The
compiled graph must form the paged-key attention (no gather of the pools) and give the same
logits on the device."""

from __future__ import annotations

import numpy as np
import pytest

import pootvk
from pootvk.ir import KeyLayout
from pootvk.ir import prims as P
from pootvk.llm.blocks import BLOCK_SIZE, BlockPool, BlockTable, read_map, write_map
from pootvk.llm.model import LlamaConfig, OracleLlama, model_params, random_weights
from pootvk.llm.paged_model import pool_names, trace_llama_paged
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from tests.helpers import assert_close

CFG = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=96,
                  vocab=80, capacity=64, weight_dtype="float16", tied_embeddings=True,
                  kv_dtype="float16")
BLOCKS, KEYS = 6, 48
PROMPTS = ([5, 17, 3, 60, 2, 9, 11, 4, 4, 28, 51, 0, 79, 15, 16, 36, 8, 23],
           [7, 1, 42, 42, 8, 30, 12, 77, 64, 3, 19, 5, 2, 40, 41, 22, 13, 6])


class PagedRun:
    """Drives the paged graphs with block tables (scattered: the pool's blocks are handed
    out to the two rows alternately), through the oracle or a compiled Program."""

    def __init__(self, device=None):
        self.params = model_params(CFG, random_weights(CFG, seed=3))
        self.pool = BlockPool(BLOCKS)
        self.tables = [BlockTable(self.pool), BlockTable(self.pool)]
        shape = (BLOCKS * BLOCK_SIZE, CFG.kv_heads, CFG.head_dim)
        self.pools = {n: np.full(shape, np.nan, CFG.cache_dtype.numpy) for n in pool_names(CFG)}
        self.device = device
        self.programs: dict[int, object] = {}

    def run(self, tokens: int, values: dict) -> np.ndarray:
        g = trace_llama_paged(CFG, 2, tokens, BLOCKS * BLOCK_SIZE, KEYS)
        if self.device is None:
            out = evaluate(g, {**self.params, **self.pools, **values})
            self.pools = {n: out[n] for n in self.pools}
            return out["logits"]
        prog = self.programs.get(tokens)
        if prog is None:
            first = next(iter(self.programs.values()), None)
            prog = pootvk.compile(g, self.device) if first is None else \
                pootvk.Program(g, share=first)
            if first is None:
                prog.set_params(**self.params)
                for n, v in self.pools.items():
                    prog.set_state(n, v)
            self.programs[tokens] = prog
        return prog(**values)["logits"]

    def step(self, toks: list[int]) -> np.ndarray:
        """One decode token per row."""
        pos = np.array([t.length for t in self.tables], np.int32)
        for t in self.tables:
            t.append(1)
        return self.run(1, {
            "tokens": np.array(toks, np.int32), "pos": pos,
            "write": write_map(self.tables, pos[:, None]),
            "read": read_map(self.tables, KEYS), "len": pos + 1})

    def chunk(self, toks: list[list[int]]) -> np.ndarray:
        """A prefill chunk of len(toks[0]) tokens per row (rows of equal chunk length)."""
        n = len(toks[0])
        start = np.array([t.length for t in self.tables], np.int32)
        for t in self.tables:
            t.append(n)
        pos = start[:, None] + np.arange(n, dtype=np.int32)[None, :]
        visible = np.arange(KEYS)[None, None, :] <= pos[:, :, None]
        mask = np.where(visible, 0.0, -np.inf).astype(np.float32)[:, None]
        return self.run(n, {
            "tokens": np.array(toks, np.int32).reshape(-1), "pos": pos.reshape(-1),
            "write": write_map(self.tables, pos), "read": read_map(self.tables, KEYS),
            "mask": mask, "last": np.array([n - 1, 2 * n - 1], np.int32)})

    def close(self):
        for p in self.programs.values():
            p.close()


def fixed_logits(prompt: list[int]) -> list[np.ndarray]:
    """The fixed-capacity oracle model's logits after each token of ``prompt``."""
    m = OracleLlama(CFG, random_weights(CFG, seed=3))
    return [m.step(t) for t in prompt]


def test_the_paged_graph_forms_paged_attention():
    c = compile_graph(trace_llama_paged(CFG, 2, 1, BLOCKS * BLOCK_SIZE, KEYS))
    atts = [e for e in c.eqns if e.prim is P.ATTENTION]
    assert len(atts) == CFG.layers
    assert all(e.params["form"].keys is KeyLayout.PAGED and e.params["form"].live for e in atts)
    assert c.count(P.GATHER) == 0 or all(e.inputs[0].shape[0] != BLOCKS * BLOCK_SIZE
                                          for e in c.eqns if e.prim is P.GATHER)


@pytest.mark.parametrize("where", ["oracle", "device"])
def test_paged_decode_and_prefill_match_the_fixed_capacity_model(where, device):
    """Row 0 and row 1 decode 14 tokens each in one batch, then a 4-token prefill chunk
    each (18 positions: two blocks a row, handed out alternately, so each row's blocks are
    not adjacent in the pool): every row's logits equal the fixed-capacity model's for that
    sequence alone."""
    a, b = PROMPTS
    tail = 4
    want = [fixed_logits(a), fixed_logits(b)]
    run = PagedRun(None if where == "oracle" else device)
    try:
        for i in range(len(a) - tail):
            got = run.step([a[i], b[i]])
            assert_close(got[0], want[0][i], 1e-9)
            assert_close(got[1], want[1][i], 1e-9)
        got = run.chunk([a[len(a) - tail:], b[len(a) - tail:len(a)]])
        assert_close(got[0], want[0][len(a) - 1], 1e-9)
        assert_close(got[1], want[1][len(a) - 1], 1e-9)
        blocks = [list(t.block_array()) for t in run.tables]
        assert blocks == [[0, 2], [1, 3]], blocks  # interleaved: a row's keys are scattered
    finally:
        run.close()
