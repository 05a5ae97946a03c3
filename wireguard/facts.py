"""pyinfra facts for the live WireGuard interface.

``host.get_fact(WireguardInterface, interface="wg0")`` gives the interface's public key, listen
port and its peers with handshake ages, or None when the interface does not exist. The command
prints the dump and the node's clock in one go so handshake ages use the node's time, not the
controller's.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from memoryctl.wgstatus import parse_dump


class WireguardInterface(FactBase[dict[str, Any] | None]):
    """Peers and handshake ages of a WireGuard interface (needs root: ``wg show`` reads keys)."""

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "wg"

    def command(self, interface: str = "wg0") -> str:
        # The dump's first field is the private key: blank it on the node, before it is sent back.
        return f"date +%s && (wg show {interface} dump 2>/dev/null | sed '1s/^[^\\t]*/-/' || true)"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        if not output:
            return None
        now = float(output[0])
        status = parse_dump("\n".join(output[1:]))
        return None if status is None else status.as_dict(now)
