"""Streaming sinks: :mod:`.delta_sink` (format ``lakebronze``)."""

__all__ = ["delta_sink"]
