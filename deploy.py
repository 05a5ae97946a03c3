"""The memoryctl stack: ``pyinfra inventory/<name>.py deploy.py`` (what runs where: deploy/roles.py).

A second run changes nothing. Never run it with ``--diff``: some rendered files hold secrets.
"""

from pyinfra import state

from deploy.roles import everything

if state.config.DIFF:
    raise SystemExit("deploy.py: --diff would print rendered secrets (WireGuard keys, passwords); run without it")

everything()
