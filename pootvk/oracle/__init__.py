"""The numpy oracle: the truth every stage is tested against."""

from . import fused, linear, sparse  # noqa: F401  (register the fused primitives' rules)
from .evaluate import eval_rules, evaluate

__all__ = ["eval_rules", "evaluate"]
