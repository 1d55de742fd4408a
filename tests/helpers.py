"""Shared helpers for tests: random inputs for a graph, the tolerance measure, and the
independent float64 attention reference that kernel tests compare the device against."""

from __future__ import annotations

import math
import os

import numpy as np

from pootvk.ir import Graph, SlotKind

#: DESIGN.md's kernel tolerance: normalised squared error against the reference.
TOL = 5e-4


def nse(got: np.ndarray, ref: np.ndarray, floor: float = 1e-30) -> float:
    """Normalised squared error sum (a-b)^2 / sum a^2 (DESIGN.md's tolerance measure), the
    denominator at least ``floor``."""
    d = got.astype(np.float64) - ref
    return float((d**2).sum() / max((ref.astype(np.float64) ** 2).sum(), floor))


def assert_close(got: np.ndarray, ref: np.ndarray, tol: float = TOL,
                 scale: float = 0.0) -> float:
    """Same shape, NaN in the same places, and nse over the rest <= tol; returns the nse.

    ``scale``: the error is normalised by at least ``scale`` squared an element. For a
    result that cancels far below its operands (``tanh(s) - s`` at a small sum ``s``: a
    few 1e-8 from values of ~1e-2), whose error is the operands' rounding (a device's
    ``tanh`` near 0 is only as exact as its ``exp``, as Vulkan allows), not the result's."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg="NaN positions differ")
    g, r = got[~nan], ref[~nan]
    e = nse(g, r, max(r.size * scale**2, 1e-30))
    assert e <= tol, (
        f"normalised squared error {e:.2e} > {tol:.0e} "
        f"(max abs {np.abs(g - r).max(initial=0.0):.2e})"
    )
    return e


def random_inputs(g: Graph, rng: np.random.Generator, pos: int = 0) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for s in g.slots:
        if s.kind is SlotKind.POS:
            out[s.name] = np.int32(pos)
        elif s.var.dtype.is_float:
            out[s.name] = rng.standard_normal(s.var.shape).astype(s.var.dtype.numpy)
        else:
            out[s.name] = rng.integers(0, 4, s.var.shape).astype(s.var.dtype.numpy)
    return out


# --- the independent attention reference ---------------------------------------------------
# Written from the definition, in float64, sharing no code with pootvk (not the oracle, which
# computes in f32 by the traced chain's own rules).


def reference_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
) -> np.ndarray:
    """softmax(cap(q k^T * scale) + mask) v in float64.

    q [B,Hq,Lq,Dk], k [B,Hkv,Lk,Dk], v [B,Hkv,Lk,Dv]; GQA by repeating each kv head
    Hq/Hkv times; mask additive, broadcast to [B,Hq,Lq,Lk]; cap(s) = c * tanh(s / c);
    a -inf score has zero weight and a row that sees no key is NaN.
    """
    b, hq, lq, dk = q.shape
    hkv = k.shape[1]
    n_rep = hq // hkv
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    # GQA: query head h reads kv head h // n_rep (np.repeat(k, n_rep, axis=1)), written as
    # a broadcast over the n_rep query heads of each kv group so nothing is copied n_rep times
    qg = np.asarray(q, np.float64).reshape(b, hkv, n_rep, lq, dk)
    k64 = np.asarray(k, np.float64)[:, :, None]  # [B, Hkv, 1, Lk, Dk]
    v64 = np.asarray(v, np.float64)[:, :, None]
    s = (qg @ k64.swapaxes(-1, -2)).reshape(b, hq, lq, -1) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    row_max = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(row_max)
    w = np.exp(s - np.where(seen, row_max, 0.0))  # exp(-inf) = 0: no weight
    with np.errstate(invalid="ignore", divide="ignore"):
        p = w / w.sum(axis=-1, keepdims=True)
        out = (p.reshape(b, hkv, n_rep, lq, -1) @ v64).reshape(b, hq, lq, -1)
    return np.where(seen, out, np.nan)


def reference_decode_step(
    ins: dict[str, np.ndarray], scale: float | None = None, softcap: float | None = None
) -> dict[str, np.ndarray]:
    """What ``trace_decode_step`` computes, from the definition: k_new/v_new written into
    the caches at ``pos`` (exactly), then row i attends to keys 0..pos+i, plus the optional
    ``alibi`` additive mask. Returns out (float64), k_cache, v_cache (the input dtype)."""
    pos = int(ins["pos"])
    kc, vc = ins["k_cache"].copy(), ins["v_cache"].copy()
    lq = ins["q"].shape[2]
    kc[:, :, pos : pos + lq] = ins["k_new"]
    vc[:, :, pos : pos + lq] = ins["v_new"]
    cap = kc.shape[2]
    visible = np.arange(cap)[None, :] <= pos + np.arange(lq)[:, None]
    mask = np.where(visible, 0.0, -np.inf)[None, None]
    if "alibi" in ins:
        mask = mask + ins["alibi"].astype(np.float64)
    out = reference_attention(ins["q"], kc, vc, mask, scale=scale, softcap=softcap)
    return {"out": out, "k_cache": kc, "v_cache": vc}


def examples(n: int) -> int:
    """Hypothesis examples for a device sweep: ``n``, scaled by POOTVK_SWEEP_SCALE (CI's
    second driver, whose compiler is slower, runs a quarter of each sweep)."""
    return max(2, round(n * float(os.environ.get("POOTVK_SWEEP_SCALE", "1"))))


def planned_requests(plan) -> list:
    """Every planned kernel request, a group launch's parts in place of the group
    (``plan.group``)."""
    from pootvk.plan import GroupRequest

    return [p for k in plan.kernels
            for p in (k.request.parts if isinstance(k.request, GroupRequest) else (k.request,))]


def load_bench(name: str):
    """``bench/<name>.py`` as a module (the benchmarks are scripts, not a package), so a
    test can call its ``main`` with the CI device."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def without_regfed(profile):
    """``profile`` without the cooperative-matrix layout read back from its device: the
    planner's choices there are the scalar and staged kernels' (the register-fed one needs
    the layout, ``pootvk.plan.decode_schedule.regfed_supported``)."""
    from dataclasses import replace

    return replace(profile, extra={k: v for k, v in profile.extra.items()
                                   if k != "coopmat_layout"})
