"""Local servers run as processes: layer 3, over the core.

- :mod:`.seaweedfs`: a SeaweedFS S3 server on 127.0.0.1 with least-privilege identities (``lake infra``).
"""

__all__ = ["seaweedfs"]
