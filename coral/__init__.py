"""Coral: serve many LLMs on a mixed, multi-region GPU fleet at the lowest hourly cost that meets every SLO."""

__version__ = "0.1.0"
