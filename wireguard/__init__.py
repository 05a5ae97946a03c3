"""WireGuard mesh planning for the memoryctl cluster.

- :mod:`wireguard.plan`: the address plan (one mesh address per node) and each node's peer table.
- :mod:`wireguard.keys`: X25519 key pairs generated on the controller, stored outside git (0600),
  reused on every later run, never printed.
- :mod:`wireguard.status`: parses ``wg show <iface> dump`` into peers and handshake ages.
- :mod:`wireguard.facts`: the pyinfra fact for the live interface (imports pyinfra).
"""

from wireguard.keys import KeyPair, KeyStore, SecretDir, public_key_for
from wireguard.plan import MeshNode, MeshPlan, Peer
from wireguard.status import InterfaceStatus, PeerStatus, parse_dump

__all__ = [
    "InterfaceStatus",
    "KeyPair",
    "KeyStore",
    "MeshNode",
    "MeshPlan",
    "Peer",
    "PeerStatus",
    "SecretDir",
    "parse_dump",
    "public_key_for",
]
