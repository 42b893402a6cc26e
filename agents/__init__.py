"""Producers of metric events: layer 3, over the core (never Spark, quality or the application).

- :mod:`.host`: :class:`~.host.HostAgent`, this machine's metrics via psutil;
- :mod:`.simulator`: :class:`~.simulator.FleetSimulator`, a seeded fleet of fake servers;
- :mod:`.file_import`: :func:`~.file_import.import_jsonl`, JSON Lines files in the event contract;
- :mod:`.gateway_client`: :class:`~.gateway_client.GatewaySender`, durable sending to a gateway through a disk spool.
"""

__all__ = ["file_import", "gateway_client", "host", "simulator"]
