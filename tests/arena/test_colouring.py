import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pootvk.arena import Item, colour
from pootvk.errors import BindingRange
from pootvk.ir import Prim
from pootvk.ir.prims import COMPARE, SELECT
from pootvk.ops import Builder, attention_masked
from pootvk.passes import compile_graph
from pootvk.plan import plan_graph, recorded_profile

items_st = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)), min_size=1,
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(items_st, st.sampled_from([4, 16, 256]))
def test_live_items_never_share_bytes(raw, align):
    items = [Item(f"v{i}", n, s, s + d) for i, (n, s, d) in enumerate(raw)]
    lay = colour(items, alignment=align, max_binding=1 << 20, max_buffer=1 << 20)
    ps = list(lay.placements.values())
    assert len(ps) == len(items)
    for p in ps:
        assert p.offset % align == 0
        assert p.offset + p.item.nbytes <= lay.sizes[p.arena]
    for i, a in enumerate(ps):
        for b in ps[i + 1 :]:
            if a.arena == b.arena and a.item.overlaps(b.item):
                assert a.offset + a.item.nbytes <= b.offset or b.offset + b.item.nbytes <= a.offset
    assert lay.peak_bytes <= lay.naive_bytes


def test_disjoint_lifetimes_share_one_slot():
    lay = colour([Item("a", 100, 0, 1), Item("b", 100, 2, 3), Item("c", 100, 4, 5)],
                 alignment=16, max_binding=1 << 20, max_buffer=1 << 20)
    assert {p.offset for p in lay.placements.values()} == {0}
    assert lay.peak_bytes == 112


def test_limits_split_arenas_and_refuse_wide_values():
    lay = colour([Item("a", 600, 0, 1), Item("b", 600, 0, 1)], alignment=4, max_binding=1000,
                 max_buffer=1000)
    assert len(lay.sizes) == 2
    with pytest.raises(BindingRange) as e:
        colour([Item("a", 2000, 0, 1)], alignment=4, max_binding=1000, max_buffer=1 << 20)
    assert (e.value.nbytes, e.value.limit) == (2000, 1000)


def layers(n: int):
    """n decode layers stacked: each layer's output is the next layer's query."""
    b = Builder()
    x = b.input("q", (1, 8, 1, 64))
    pos = b.pos("pos", 0, 127)
    for i in range(n):
        kn = b.input(f"k{i}", (1, 2, 1, 64))
        vn = b.input(f"v{i}", (1, 2, 1, 64))
        kc = b.state(f"kc{i}", (1, 2, 128, 64))
        vc = b.state(f"vc{i}", (1, 2, 128, 64))
        x, kc2, vc2 = attention_masked(b, x, kn, vn, kc, vc, pos)
        b.set_state(f"kc{i}", kc2)
        b.set_state(f"vc{i}", vc2)
    b.export("out", x)
    return b.build()


def test_arena_does_not_grow_with_layer_count():
    """From 3 layers on, two layer outputs are alive at once (one feeds the next layer while
    that layer's output is written); a 2-layer plan has one, so its arena is smaller. Past
    that the arena is flat: values of layer i reuse the slots of layer i - 2, and every layer
    reads the one causal mask (CSE merged the layers' masks; its Iota is a folded constant)."""
    prof = recorded_profile("lavapipe")
    plans = {n: plan_graph(compile_graph(layers(n)), prof, group=False)  # labels as planned
             for n in (2, 3, 8, 20)}
    sizes = {n: p.arena.peak_bytes for n, p in plans.items()}
    assert sizes[3] == sizes[8] == sizes[20] == 2 * 2048 + 512
    assert sizes[2] == 2048 + 512  # one layer output + the shared mask
    for n, p in plans.items():  # one mask chain, not n: no Iota kernel, one Compare/Select
        labels = [k.label for k in p.kernels]  # (fused into one kernel)
        assert labels.count("fused") == 1, labels
        fused = next(k.request for k in p.kernels if k.label == "fused")
        assert [n.op for n in fused.body.nodes if isinstance(n.op, Prim)] == [COMPARE, SELECT]
        assert "Iota" not in labels and len(p.kernels) == 3 * n + 1
