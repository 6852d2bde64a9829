"""Batched slot copy (clone / restore): rows of the state pools copied from source slots to destination slots."""

from mini_engine.ops.slot_copy.reference import copy_slots

__all__ = ["copy_slots"]
