"""Random small elementwise graphs for the fusion tests (a hypothesis strategy), and the two
chains fusion is for: RMSNorm and SwiGLU, traced from their definitions."""

from __future__ import annotations

from hypothesis import strategies as st

from pootvk.ir import BOOL, F16, F32, Graph, Var
from pootvk.ops import Builder

BASE = (2, 3, 5)
#: shapes that broadcast against BASE (right-aligned)
SHAPES = [(2, 3, 5), (3, 5), (1, 5), (2, 1, 1), (5,), (2, 3, 1), ()]
#: ops whose device results track the oracle's closely (no overflow, no division by ~0)
TAME_UNARY = ["Tanh", "Sigmoid", "Neg", "Abs", "Silu"]
WILD_UNARY = ["Exp", "Rsqrt", "Sqrt", "Log", "Recip"]
BINARY = ["add", "sub", "mul", "max", "min"]


@st.composite
def elementwise_graphs(draw: st.DrawFn, tame: bool = False) -> Graph:
    """2-4 inputs of shapes broadcasting to BASE, then 3-14 random steps drawn from the
    elementwise prims, keepdim reductions (some read back by their rows, as a norm or a
    softmax does), broadcasts, rotations (slices and a concat), transpose and reshape
    round trips and an F16 round trip; some values are exported along the way (fusion must
    not hide them) and some reused (used twice)."""
    b = Builder()
    pool: list[Var] = []
    bools: list[Var] = []
    for i in range(draw(st.integers(2, 4))):
        pool.append(b.input(f"x{i}", draw(st.sampled_from(SHAPES))))
    unary = TAME_UNARY + ([] if tame else WILD_UNARY)
    binary = BINARY + ([] if tame else ["div"])
    pick = st.integers(0, 10**6)
    for step in range(draw(st.integers(3, 14))):
        x = pool[draw(pick) % len(pool)]
        y = pool[draw(pick) % len(pool)]
        kind = draw(st.sampled_from(
            ["binary", "binary", "unary", "unary", "literal", "compare", "select", "reduce",
             "row", "row", "broadcast", "f16", "move", "move", "permute"]
        ))
        if kind == "binary":
            v = getattr(b, draw(st.sampled_from(binary)))(x, y)
        elif kind == "unary":
            v = b.unary(draw(st.sampled_from(unary)), x)
        elif kind == "literal":
            c = draw(st.sampled_from([0.5, -2.0, 1e-5, 3.0, -0.0]))
            v = getattr(b, draw(st.sampled_from(BINARY)))(x, c)
        elif kind == "compare":
            bools.append(b.compare(draw(st.sampled_from(["Lt", "Ge", "Ne"])), x, y))
            continue
        elif kind == "select":
            if not bools:
                continue
            p = bools[draw(pick) % len(bools)]
            v = b.select(p, x, y if draw(st.booleans()) else -1.5)
        elif kind == "reduce":
            if x.ndim == 0:
                continue
            axis = draw(st.integers(0, x.ndim - 1))
            v = b.reduce(draw(st.sampled_from(["Sum", "Max"])), x, axis, keepdim=True)
        elif kind == "row":  # a reduction read back by its own rows (norm, softmax)
            if x.ndim == 0:
                continue
            r = b.reduce(draw(st.sampled_from(["Sum", "Max"])), x, draw(st.integers(0, x.ndim - 1)))
            v = getattr(b, draw(st.sampled_from(BINARY)))(x, b.unary("Tanh", r))
        elif kind == "broadcast":
            v = b.broadcast(x, BASE)
        elif kind == "move":  # a rotation along an axis: two slices and a concat (as RoPE)
            axes = [d for d in range(x.ndim) if x.shape[d] > 1]
            if not axes:
                continue
            axis = axes[draw(pick) % len(axes)]
            n = x.shape[axis]
            k = draw(st.integers(1, n - 1))
            lo = b.slice(x, (0,) * x.ndim, x.shape[:axis] + (k,) + x.shape[axis + 1:])
            hi = b.slice(x, (0,) * axis + (k,) + (0,) * (x.ndim - axis - 1), x.shape)
            if draw(st.booleans()):
                lo = b.unary(draw(st.sampled_from(unary)), lo)
            v = b.concat([hi, lo], axis)
        elif kind == "permute":  # a round trip through a transpose and a flat reshape
            if x.ndim < 2:
                continue
            perm = tuple(draw(st.permutations(range(x.ndim))))
            t = b.unary(draw(st.sampled_from(unary)), b.transpose(x, perm))
            flat = b.reshape(t, (x.size,))
            back = b.reshape(flat, t.shape)
            v = b.transpose(back, tuple(perm.index(d) for d in range(x.ndim)))
        else:
            v = b.convert(b.convert(x, F16), F32)
        pool.append(v)
        if draw(st.integers(0, 4)) == 0:
            b.export(f"e{step}", v)
    b.export("out", pool[-1])
    if bools and draw(st.booleans()):
        b.export("flag", b.convert(bools[-1], F32))
    assert all(v.dtype is not BOOL for v in b.exports.values())
    return b.build()


def rms_norm(b: Builder, x: Var, w: Var, eps: float = 1e-5) -> Var:
    """x * rsqrt(mean(x^2, -1) + eps) * w, traced primitive by primitive (7 eqns)."""
    n = x.shape[-1]
    ms = b.mul(b.reduce("Sum", b.mul(x, x), -1, keepdim=True), 1.0 / n)
    return b.mul(b.mul(x, b.unary("Rsqrt", b.add(ms, eps))), w)


def swiglu(b: Builder, x: Var, wg: Var, wu: Var, silu_prim: bool = True) -> Var:
    """silu(x @ wg) * (x @ wu); silu as the Silu unary or spelled g * sigmoid(g)."""
    g, u = b.matmul(x, wg), b.matmul(x, wu)
    s = b.unary("Silu", g) if silu_prim else b.mul(g, b.unary("Sigmoid", g))
    return b.mul(s, u)
