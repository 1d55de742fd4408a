"""The IR: dtypes, Var/Literal, Eqn, Slot, Graph, the primitive typing rules, printing."""

from .dtypes import BF16, BOOL, F16, F32, I32, U32, DType, from_numpy
from .graph import Eqn, Graph, Literal, Params, Slot, SlotKind, Var
from .prims import check_graph, new_eqn, shape_rules, type_eqn

__all__ = [
    "BF16", "BOOL", "F16", "F32", "I32", "U32", "DType", "from_numpy",
    "Eqn", "Graph", "Literal", "Params", "Slot", "SlotKind", "Var",
    "check_graph", "new_eqn", "shape_rules", "type_eqn",
]
