"""Deprecated: moved to :mod:`radix_soa.baselines.reference_prefix` (this path goes in 0.3)."""

from ._deprecated import moved

moved(__name__)
