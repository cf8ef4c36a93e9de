"""Fixes that act on a run: finding the largest micro-batch that fits, on the real device."""

from pitstop.fixes.batch_size import BatchSearch, find_batch_size, is_out_of_memory

__all__ = ["BatchSearch", "find_batch_size", "is_out_of_memory"]
