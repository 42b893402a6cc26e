"""Batch readers: :mod:`.delta_reader` (format ``lakedelta``)."""

__all__ = ["delta_reader"]
