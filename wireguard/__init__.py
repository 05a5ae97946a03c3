"""WireGuard mesh planning for the memoryctl cluster.

- :mod:`wireguard.plan`: the address plan (one mesh address per node) and each node's peer table.
- :mod:`wireguard.keys`: X25519 key pairs generated on the controller, stored outside git (0600),
  reused on every later run, never printed.
- :mod:`wireguard.status`: parses ``wg show <iface> dump`` into peers and handshake ages.
- :mod:`wireguard.facts`: the pyinfra fact for the live interface (imports pyinfra).
"""

from wireguard.plan import MeshNode, MeshPlan, Peer
from wireguard.status import InterfaceStatus, PeerStatus, parse_dump

# Key management (wireguard.keys) needs `cryptography` and the fact (wireguard.facts) needs pyinfra:
# both are controller-side and imported from their modules, so that `memoryctl health` on a node can
# use the status parser with neither installed.
__all__ = [
    "InterfaceStatus",
    "MeshNode",
    "MeshPlan",
    "Peer",
    "PeerStatus",
    "parse_dump",
]
