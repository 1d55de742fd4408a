"""Reshape is a view: no kernel, the operand's bytes under another shape. Its operand lives
until the view's last use; an exported view makes its operand's kernel write the export;
where both have homes of their own (an input, a state output) it is a copy."""

import numpy as np
import pytest

from pootvk.errors import UnsupportedPrimitive
from pootvk.ir import F16, F32
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.plan import BufferRole, plan_graph
from tests.values import assert_matches, run_on_device, values


def overlaps(a, b) -> bool:
    return a.buffer == b.buffer and a.offset < b.offset + b.nbytes and \
        b.offset < a.offset + a.nbytes


def check(device, g, ins, dt=F32):
    want, got = evaluate(g, ins), run_on_device(device, g, ins)
    for k in want:
        assert_matches(got[k], want[k], dt, err_msg=k)


@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.value)
def test_reshape_then_add_runs_no_reshape_kernel(device, dt):
    b = Builder()
    x = b.input("x", (4, 6), dt)
    v = b.exp(x)
    w = b.reshape(v, (2, 12))
    b.export("y", b.add(w, b.input("c", (12,), dt)))
    g = b.build()
    plan = plan_graph(g, device.profile, group=False)  # one kernel per eqn: the labels
    assert [k.label for k in plan.kernels] == ["Unary", "Add"]
    assert plan.locations[w] == plan.locations[v]  # the same bytes
    assert f"view [eqn 1] Reshape -> {dt.value}[2,12] shares {plan.locations[v]}" in str(plan)
    rng = np.random.default_rng(1)
    check(device, g, {"x": values((4, 6), dt, rng), "c": values((12,), dt, rng)}, dt)


def test_the_operand_lives_until_the_views_last_use(device):
    """v is last used directly by the Reshape; three same-sized temporaries come after it
    and would take its bytes if the view did not keep it alive."""
    b = Builder()
    x = b.input("x", (64,))
    v = b.exp(x)
    w = b.reshape(v, (8, 8))
    t1 = b.add(x, 1.0)
    t2 = b.mul(t1, 2.0)
    t3 = b.sub(t2, 3.0)
    b.export("y", b.add(b.reshape(t3, (8, 8)), w))
    g = b.build()
    plan = plan_graph(g, device.profile, group=False)  # one kernel per eqn: the labels
    assert g.count(P.RESHAPE) == 2 and len(plan.kernels) == 5
    assert plan.buffers["out:y"].nbytes == 256
    for t in (t1, t2):
        assert not overlaps(plan.locations[t], plan.locations[v]), t
    assert plan.locations[t3].buffer == plan.locations[v].buffer  # coloured, not exported
    check(device, g, {"x": np.random.default_rng(2).standard_normal(64).astype(np.float32)})


def test_an_exported_view_is_written_by_its_operands_kernel(device):
    b = Builder()
    x = b.input("x", (3, 5))
    e1 = b.add(x, 1.0)
    b.export("flat", b.reshape(e1, (15,)))  # e1 has no home: it takes out:flat
    b.export("e2", b.mul(x, 2.0))
    b.export("e2_view", b.reshape(b.exports["e2"], (5, 3)))
    b.export("x_view", b.reshape(x, (15, 1)))  # an input and an export: a copy
    g = b.build()
    plan = plan_graph(g, device.profile, group=False)  # one kernel per eqn: the labels
    labels = [k.label for k in plan.kernels]
    assert labels == ["Add", "Mul", "Reshape", "Reshape"]
    add = plan.kernels[0].bindings[-1]
    assert add.location.buffer == "out:flat" and add.role is BufferRole.EXPORT
    assert plan.outputs["flat"] == plan.locations[e1]
    check(device, g, {"x": np.arange(15, dtype=np.float32).reshape(3, 5)})


def test_a_state_read_through_a_view_after_its_update_is_refused():
    b = Builder()
    s = b.state("s", (4, 4))
    r = b.reshape(s, (16,))
    b.set_state("s", b.exp(s))
    b.export("z", b.add(r, 1.0))  # the old state, through the view, after the update
    with pytest.raises(UnsupportedPrimitive, match="after its in-place update"):
        plan_graph(b.build(), _lavapipe())


def test_a_state_output_that_is_a_reshape_is_copied_home(device):
    b = Builder()
    s = b.state("s", (16,))
    m = b.exp(b.reshape(s, (4, 4)))
    b.export("before", b.reshape(s, (2, 8)))  # a view of the old state, read back
    b.set_state("s", b.reshape(m, (16,)))
    g = b.build()
    plan = plan_graph(g, device.profile, group=False)  # one kernel per eqn: the labels
    assert [k.label for k in plan.kernels] == ["Unary", "Reshape", "Reshape"]
    check(device, g, {"s": np.linspace(-2, 2, 16, dtype=np.float32)})


def _lavapipe():
    from pootvk.plan import recorded_profile

    return recorded_profile("lavapipe")
