"""Streaming sources: :mod:`.log_source` (format ``lakelog``)."""

__all__ = ["log_source"]
