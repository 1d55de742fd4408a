"""The numpy oracle: the truth every stage is tested against."""

from .evaluate import eval_rules, evaluate

__all__ = ["eval_rules", "evaluate"]
