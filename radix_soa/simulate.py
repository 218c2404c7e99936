"""Deprecated: moved to :mod:`radix_soa.studies.replay` (this path goes in 0.3)."""

from ._deprecated import moved

moved(__name__)
