"""Base system: admin user with sudo, SSH hardening, time sync, unattended security upgrades.

Time sync is systemd-timesyncd, enabled by its package preset. (In a container it skips itself,
ConditionVirtualization=!container, the host keeps the clock; pyinfra's ``enabled=True`` check
then reports a change on every run, so the deploy relies on the preset instead.)
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from deploy.common import components, sudoers, template
from deploy.settings import resolve_path

# curl, ca-certificates: release archives and apt keys are fetched by URL on the node.
PACKAGES = [
    "sudo",
    "openssh-server",
    "systemd-timesyncd",
    "unattended-upgrades",
    "cron",
    "logrotate",
    "curl",
    "ca-certificates",
]


class AdminKeyError(ValueError):
    """An ``admin_keys`` entry that is not a readable public key on the controller."""


def admin_key(path: str) -> str:
    """One public key from a controller path (``~`` expanded, relative to the repository)."""
    resolved = resolve_path(path)
    try:
        key = resolved.read_text().strip()
    except OSError as exc:
        raise AdminKeyError(f"base.admin_keys: {path} ({resolved}) cannot be read: {exc.strerror}") from None
    if not key.startswith(("ssh-", "ecdsa-", "sk-")):
        raise AdminKeyError(f"base.admin_keys: {resolved} is not an OpenSSH public key (the .pub file)")
    return key


@deploy("Base system")
def base() -> None:
    settings = components().base
    admin = settings.admin_user
    keys = [admin_key(key) for key in settings.admin_keys]

    apt.update(name="Refresh apt lists (at most hourly)", cache_time=3600)
    apt.packages(name="Base packages", packages=PACKAGES, no_recommends=True)

    server.user(
        name=f"Admin user {admin}",
        user=admin,
        shell="/bin/bash",
        groups=["sudo"],
        public_keys=keys,
        create_home=True,
    )
    sudoers("base/sudoers.j2", f"/etc/sudoers.d/90-{admin}", admin_user=admin)

    sshd = template(
        "base/sshd_hardening.conf.j2",
        "/etc/ssh/sshd_config.d/50-memoryctl.conf",
        permit_root_login=settings.permit_root_login,
    )
    server.shell(name="Check sshd config", commands=["sshd -t"], _if=sshd.did_change)
    systemd.service(name="Reload sshd", service="ssh", reloaded=True, _if=sshd.did_change)

    template("base/20auto-upgrades.j2", "/etc/apt/apt.conf.d/20auto-upgrades")
    template("base/50unattended-upgrades-memoryctl.j2", "/etc/apt/apt.conf.d/52unattended-upgrades-memoryctl")
