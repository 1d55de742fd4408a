"""``print(graph)``: one eqn a line, in the spirit of a jaxpr. Names are given at print time."""

from __future__ import annotations

from enum import Enum

from .attention_form import AttentionForm
from .graph import Graph, Literal, Var
from .linear_form import LinearForm
from .sparse_form import SelectedForm


class Namer:
    def __init__(self) -> None:
        self.names: dict[Var, str] = {}

    def __call__(self, v: Var) -> str:
        if isinstance(v, Literal):
            return f"{v.value!r}:{v.dtype.value}"
        if v not in self.names:
            n, s = len(self.names), ""
            while True:
                s = chr(ord("a") + n % 26) + s
                n = n // 26 - 1
                if n < 0:
                    break
            self.names[v] = s
        return self.names[v]


def _fmt_param(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, Enum):
        return str(v.value)
    return str(v)


def format_graph(g: Graph) -> str:
    name = Namer()
    lines = ["{ lambda"]
    for s in g.slots:
        rng = f" in [{s.range[0]}, {s.range[1]}]" if s.range else ""
        lines.append(f"    {name(s.var)}:{s.var.aval()} <- {s.kind.value} {s.name}{rng}")
    lines.append("  let")
    for e in g.eqns:
        outs = " ".join(f"{name(o)}:{o.aval()}" for o in e.outputs)
        ps = " ".join(
            v.describe() if isinstance(v, AttentionForm | LinearForm | SelectedForm)
            else f"{k}={_fmt_param(v)}"
            for k, v in e.params.items()
        )
        ins = " ".join(name(v) for v in e.inputs)
        head = f"{e.prim}[{ps}]" if ps else e.prim
        lines.append(f"    {outs} = {head} {ins}".rstrip())
    outs = [f"{k}={name(v)}" for k, v in g.exports.items()]
    outs += [f"state {k}={name(v)}" for k, v in g.states.items()]
    outs += [f"witness {k}={name(v)}" for k, v in g.validations.items()]
    lines.append(f"  in ( {', '.join(outs)} ) }}")
    return "\n".join(lines)
