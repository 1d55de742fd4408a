"""The IR: dtypes, Var/Literal, Eqn, Slot, Graph, the primitive set and its typing rules,
the Attention form, the one rule-table registrar, printing."""

from . import fused, prims
from .attention_form import (
    AttentionForm,
    KeyLayout,
    MaskKind,
    attention_operands,
    check_attention,
    form_for,
)
from .dtypes import BF16, BOOL, F16, F32, I32, U32, DType, from_numpy
from .graph import Eqn, Graph, Literal, Params, Slot, SlotKind, UseInfo, Var
from .linear_form import LinearForm, LinearPrologue
from .prims import (
    PRIMS,
    CompareOp,
    Prim,
    ReduceOp,
    UnaryOp,
    check_graph,
    new_eqn,
    shape_rules,
    type_eqn,
)
from .rules import RuleTable
from .slotmap import NO_SLOT, ForwardSlotMap
from .sparse_form import SelectedForm

__all__ = [
    "BF16", "BOOL", "F16", "F32", "I32", "U32", "DType", "from_numpy",
    "AttentionForm", "LinearForm", "LinearPrologue", "KeyLayout", "MaskKind", "attention_operands",
    "check_attention", "form_for",
    "Eqn", "Graph", "Literal", "Params", "Slot", "SlotKind", "UseInfo", "Var",
    "PRIMS", "CompareOp", "Prim", "ReduceOp", "UnaryOp", "fused", "prims",
    "check_graph", "new_eqn", "shape_rules", "type_eqn", "RuleTable",
    "NO_SLOT", "ForwardSlotMap", "SelectedForm",
]
