"""Local servers run as processes: layer 3, over the core.

- :mod:`.seaweedfs`: a SeaweedFS S3 server on 127.0.0.1 with least-privilege identities (``lake infra``).
- :mod:`.spark_cluster`: a Spark standalone master and workers on 127.0.0.1 (``lake infra spark``).
- :mod:`.processes`: what both share: PID files, stopping a daemon's process group.
"""

__all__ = ["processes", "seaweedfs", "spark_cluster"]
