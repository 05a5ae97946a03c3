"""Facts the deploys check on every run, so one-shot steps converge after a failed run.

A step that only ran "when its package was just installed" is lost for good when the run that
installed the package fails before it. These facts ask the node for the state itself instead:
which extensions a database has, which libraries the *running* PostgreSQL preloaded, whether the
NVIDIA kernel driver is loaded. pyinfra gathers them before any operation runs; a missing program
(``psql`` before PostgreSQL is installed) gives the fact's default, i.e. "not there yet".
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, TypeVar

from pyinfra.api.facts import FactBase

_T = TypeVar("_T")


class PsqlFact(FactBase[_T]):
    """A fact ``psql`` reads from the local server. Before PostgreSQL is installed there is no
    ``psql``, and pyinfra gives the fact's default without running it."""

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "psql"


class PsqlAnswer(PsqlFact[_T | None]):
    """A query's rows, or None when the server does not answer: ``&& echo ok`` after the query tells
    an empty answer (an ``ok`` line alone) from a server that is down (no line)."""

    sql: str

    def command(self) -> str:
        return f"psql -XAtc '{self.sql}' 2>/dev/null && echo ok || true"

    def process(self, output: list[str]) -> _T | None:
        if not output or output[-1] != "ok":
            return None
        return self.rows(output[:-1])

    def rows(self, rows: list[str]) -> _T:
        raise NotImplementedError


class PostgresExtensions(PsqlFact[dict[str, str]]):
    """``{extension: version}`` installed in ``database`` (empty when it or the server is not there).

    Run it as the ``postgres`` OS user (``_sudo=True, _sudo_user="postgres"``): peer authentication.
    """

    def default(self) -> dict[str, str]:
        return {}

    def command(self, database: str) -> str:
        sql = "SELECT extname || ' ' || extversion FROM pg_extension"
        return f'psql -d {database} -XAtc "{sql}" 2>/dev/null || true'

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.split(" ", 1) for line in output if " " in line)


class PostgresPreloaded(PsqlAnswer[list[str]]):
    """``shared_preload_libraries`` of the running server; None when it does not answer.

    The config file saying ``timescaledb`` is not enough: only a restart loads it, and a run that
    failed between writing the file and restarting would otherwise leave it unloaded for good.
    """

    sql = "SHOW shared_preload_libraries"

    def rows(self, rows: list[str]) -> list[str]:
        value = rows[0] if rows else ""
        return [lib.strip() for lib in value.split(",") if lib.strip()]


class PostgresRoleMemberships(PsqlFact[dict[str, list[str]]]):
    """``{role: [roles it is a member of]}`` (empty when the server is not there yet)."""

    def default(self) -> dict[str, list[str]]:
        return {}

    def command(self) -> str:
        sql = (
            "SELECT r.rolname || ' ' || g.rolname FROM pg_auth_members m"
            " JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles r ON r.oid = m.member"
        )
        return f'psql -XAtc "{sql}" 2>/dev/null || true'

    def process(self, output: list[str]) -> dict[str, list[str]]:
        memberships: dict[str, list[str]] = {}
        for line in output:
            member, _, group = line.partition(" ")
            if group:
                memberships.setdefault(member, []).append(group)
        return memberships


class NvidiaBoot(FactBase[list[str]]):
    """What decides a reboot for the NVIDIA driver (:mod:`deploy.gpuboot`): its ``key=value`` report."""

    def command(self) -> str:
        from deploy.gpuboot import REPORT

        return REPORT

    def process(self, output: list[str]) -> list[str]:
        return output

    def default(self) -> list[str]:
        return []


# What vLLM does first on the GPU (NVML alone is not it): import vllm, fp16 and bf16 GEMMs, the
# device's capability against the locked torch's architectures; one ``ok``/``FAIL`` line per check.
CUDA_CHECK = (Path(__file__).resolve().parent / "node" / "gpu_check.py").read_text(encoding="utf-8")


class CudaDevice(FactBase[str | None]):
    """The lines of :data:`CUDA_CHECK` run by ``python`` (vLLM's venv): all ``ok ...`` when vLLM's first
    steps on the GPU work; None while that Python or its torch is not installed."""

    def command(self, python: str) -> str:
        check = shlex.quote(CUDA_CHECK)
        has_torch = f'test -x {python} && {python} -c "import torch" 2>/dev/null'
        return f"{has_torch} && {python} -c {check} 2>&1 || true"

    def process(self, output: list[str]) -> str | None:
        return "\n".join(output) if output else None


class FilesystemSize(FactBase[int | None]):
    """The size in bytes of the filesystem that holds ``path`` (or would: the nearest existing parent,
    so it answers before the directory is created); None when ``df`` does not answer.

    Sizes derived from it (pgBackRest's archive queue limit) follow the disk, not its free space,
    so they stay the same from run to run while data comes and goes."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return f'p={p}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -B1 --output=size "$p" | tail -n 1 || true'

    def process(self, output: list[str]) -> int | None:
        try:
            return int(output[-1].strip())
        except (IndexError, ValueError):
            return None


class PgbackrestStanza(FactBase[dict[str, Any] | None]):
    """What pgBackRest's ``info`` says of a stanza: ``{"status": code, "backups": n}``; None when
    pgBackRest is not installed or does not answer. Status codes are pgBackRest's own: 0 ok,
    1 missing stanza path, 2 no valid backups, 3 missing stanza data ...
    Run it as the ``postgres`` OS user (``_sudo=True, _sudo_user="postgres"``)."""

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "pgbackrest"

    def command(self, stanza: str) -> str:
        return f"pgbackrest --stanza={stanza} --output=json --log-level-console=off info 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        try:
            (entry,) = json.loads("\n".join(output))
            return {"status": int(entry["status"]["code"]), "backups": len(entry.get("backup", []))}
        except (ValueError, KeyError, TypeError):
            return None


class PostgresSetting(PsqlFact[str | None]):
    """A setting of the *running* server (``SHOW setting``); None when it does not answer.

    Run it as the ``postgres`` OS user (``_sudo=True, _sudo_user="postgres"``).
    """

    def command(self, setting: str) -> str:
        return f"psql -XAtc 'SHOW {setting}' 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return output[0] if output else None


class PostgresAnswers(PsqlFact[bool]):
    """Whether the local server answers a query (as ``postgres``, on the socket).

    pyinfra's own PostgreSQL facts fail the whole run when the server is down; under Patroni a run
    can meet it down (a takeover that failed half-way): the deploy then starts Patroni and leaves
    the database-level checks to the next run instead of failing.
    """

    def default(self) -> bool:
        return False

    def command(self) -> str:
        return "psql -XAtc 'SELECT 1' 2>/dev/null || true"

    def process(self, output: list[str]) -> bool:
        return output == ["1"]


class PostgresRoleNames(PsqlAnswer[set[str]]):
    """The server's role names; None when it does not answer (pyinfra's PostgresRoles would fail
    the run instead), an empty set before PostgreSQL is installed."""

    sql = "SELECT rolname FROM pg_roles"

    def default(self) -> set[str]:
        return set()

    def rows(self, rows: list[str]) -> set[str]:
        return set(rows)


def _json_object(output: list[str]) -> dict[str, Any] | None:
    """A JSON object a REST API answered with; None for no answer or anything else."""
    text = "\n".join(output).strip()
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


class PatroniDynamicConfig(FactBase[dict[str, Any] | None]):
    """Patroni's cluster-wide settings as etcd holds them (``GET /config`` of this member's REST
    API); None when Patroni does not answer (not installed, not started yet, down)."""

    def default(self) -> None:
        return None

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "curl"

    def command(self, address: str, port: int) -> str:
        return f"curl -sf -m 5 http://{address}:{int(port)}/config || true"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        return _json_object(output)


class PatroniCluster(FactBase[dict[str, Any] | None]):
    """Patroni's view of the whole cluster (``GET /cluster``: every member's role, state and
    ``pending_restart``, and ``"pause": true`` while paused), from the first of ``addresses`` whose
    Patroni answers: a member whose own Patroni is stopped still sees the others' pause. None when
    no member answers."""

    def default(self) -> None:
        return None

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "curl"

    def command(self, addresses: list[str], port: int) -> str:
        urls = " ".join(shlex.quote(f"http://{address}:{int(port)}/cluster") for address in addresses)
        return f"for url in {urls}; do curl -sf -m 3 $url && exit 0; done; true"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        return _json_object(output)


class MaintenanceMarker(FactBase[str | None]):
    """What an operator wrote into the maintenance marker file (its reason and name; empty when
    nothing was written), or None when the file is not there (docs/ha.md, "Maintenance")."""

    def default(self) -> None:
        return None

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then echo set; head -c 300 {quoted}; echo; fi"

    def process(self, output: list[str]) -> str | None:
        if not output or output[0] != "set":
            return None
        return " ".join(line.strip() for line in output[1:] if line.strip())
