"""The live state of WireGuard interfaces, from ``wg show`` on a node.

The one parser and the one staleness rule, for both sides: the deploy's pyinfra fact
(``wireguard.facts``, as root) reads one interface's ``dump``; ``memoryctl health`` on a node reads
only the public fields of ``wg show all <field>`` (:func:`parse_public`), never a dump, so that
the unprivileged user it runs as needs sudo for nothing that prints a key.

A dump's first line is the interface (private key, public key, listen port, fwmark); each further
line is a peer: public key, preshared key, endpoint, allowed ips, latest handshake (unix seconds,
0 = never), rx bytes, tx bytes, persistent keepalive. The private and preshared keys are dropped
while parsing: they never leave this module.
"""

from __future__ import annotations

from dataclasses import dataclass

# A handshake older than this means the peer is not talking to us (WireGuard rekeys every 2 min).
STALE_AFTER_S = 180


@dataclass(frozen=True)
class PeerStatus:
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake: int  # unix seconds, 0 = never
    rx_bytes: int
    tx_bytes: int

    def handshake_age(self, now: float) -> float | None:
        """Seconds since the last handshake, None if there never was one."""
        return None if self.latest_handshake == 0 else max(0.0, now - self.latest_handshake)

    def is_up(self, now: float, stale_after: float = STALE_AFTER_S) -> bool:
        age = self.handshake_age(now)
        return age is not None and age <= stale_after


@dataclass(frozen=True)
class InterfaceStatus:
    public_key: str
    listen_port: int
    peers: tuple[PeerStatus, ...]

    def as_dict(self, now: float) -> dict[str, object]:
        return {
            "public_key": self.public_key,
            "listen_port": self.listen_port,
            "peers": [
                {
                    "public_key": p.public_key,
                    "endpoint": p.endpoint,
                    "allowed_ips": list(p.allowed_ips),
                    "handshake_age_s": p.handshake_age(now),
                    "up": p.is_up(now),
                }
                for p in self.peers
            ],
        }


def parse_dump(text: str) -> InterfaceStatus | None:
    """Parse ``wg show <iface> dump``; None for empty output (no such interface)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return _interface(lines) if lines else None


PUBLIC_FIELDS = ("latest-handshakes", "endpoints", "allowed-ips", "transfer")


def parse_public(outputs: dict[str, str]) -> dict[str, tuple[PeerStatus, ...]]:
    """Peers by interface from ``wg show interfaces`` (key ``interfaces``) and ``wg show all F``
    for F in :data:`PUBLIC_FIELDS`: lines of interface, peer public key, value(s). wg-tools prints
    the interface only on the first line of each interface for some fields (endpoints): a line
    without it belongs to the interface of the line before."""
    values: dict[tuple[str, str], dict[str, list[str]]] = {}
    for field in PUBLIC_FIELDS:
        interface = ""
        for line in outputs.get(field, "").splitlines():
            cells = line.split("\t")
            width = 3 if field == "transfer" else 2  # peer key + value(s), without the interface
            if len(cells) == width + 1:
                interface, cells = cells[0], cells[1:]
            elif len(cells) != width:
                continue
            values.setdefault((interface, cells[0]), {})[field] = cells[1:]
    peers: dict[str, list[PeerStatus]] = {name: [] for name in outputs.get("interfaces", "").split()}
    for (interface, key), v in values.items():
        endpoint = (v.get("endpoints") or ["(none)"])[0]
        allowed = (v.get("allowed-ips") or [""])[0]
        handshake = (v.get("latest-handshakes") or ["0"])[0]
        rx, tx = ((v.get("transfer") or []) + ["0", "0"])[:2]
        peers.setdefault(interface, []).append(
            PeerStatus(
                public_key=key,
                endpoint=None if endpoint == "(none)" else endpoint,
                allowed_ips=tuple(a for a in allowed.replace(",", " ").split() if a != "(none)"),
                latest_handshake=int(handshake) if handshake.isdigit() else 0,
                rx_bytes=int(rx) if rx.isdigit() else 0,
                tx_bytes=int(tx) if tx.isdigit() else 0,
            )
        )
    return {name: tuple(p) for name, p in peers.items()}


def _interface(lines: list[str]) -> InterfaceStatus:
    head = lines[0].split("\t")
    if len(head) < 3:
        raise ValueError("not a `wg show <iface> dump` output: interface line has too few fields")
    peers = []
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) < 8:
            raise ValueError("not a `wg show <iface> dump` output: peer line has too few fields")
        public_key, _psk, endpoint, allowed, handshake, rx, tx, _keepalive = fields[:8]
        peers.append(
            PeerStatus(
                public_key=public_key,
                endpoint=None if endpoint == "(none)" else endpoint,
                allowed_ips=tuple(a for a in allowed.split(",") if a and a != "(none)"),
                latest_handshake=int(handshake),
                rx_bytes=int(rx),
                tx_bytes=int(tx),
            )
        )
    return InterfaceStatus(public_key=head[1], listen_port=int(head[2]), peers=tuple(peers))
