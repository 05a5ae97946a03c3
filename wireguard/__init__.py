"""WireGuard mesh planning for the memoryctl cluster.

- :mod:`wireguard.plan`: the address plan (one mesh address per node) and each node's peer table.
- :mod:`wireguard.keys`: X25519 key pairs generated on the controller, stored outside git (0600),
  reused on every later run, never printed.
- :mod:`wireguard.facts`: the pyinfra fact for the live interface (imports pyinfra); it reads the
  dump with ``memoryctl.wgstatus``, the parser ``memoryctl health`` uses on the nodes.

All of it runs on the controller, from the repository (``deploy.py``); none of it is installed on
the nodes. Key management needs ``cryptography`` and the fact needs pyinfra: both are imported from
their modules, not here.
"""

from wireguard.plan import MeshNode, MeshPlan, Peer

__all__ = ["MeshNode", "MeshPlan", "Peer"]
