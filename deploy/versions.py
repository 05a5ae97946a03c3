"""The versions the bundle installs, stated once.

The local nodes run exactly these (from the release artefacts, see ``inventory/local.yaml``) and
the Hetzner example pins the same ones from upstream's own distribution, so what CI deployed and
exercised is what production gets. Source URLs, artefact file names and apt version pins are
derived from here; ``tests/deploy/unit/test_hetzner.py`` checks that no inventory states another.

PostgreSQL's major version is a per-inventory setting (``components.postgres.version``): Debian
12's 15 on the local nodes (the only one reachable here), a current major from the PostgreSQL
project's repository on Hetzner. TimescaleDB 2.28.3 supports PostgreSQL 15 to 18 (2.29 dropped 15),
so the same TimescaleDB runs on both.
"""

from __future__ import annotations

QDRANT = "1.19.0"
NEO4J = "5.26.30"  # the 5.26 LTS line, the last on Java 17
TIMESCALEDB = "2.28.3"
VLLM = "0.33.0"  # GPU node only (Hetzner); the local nodes run a named stand-in
POSTGRES_MAJORS = (15, 16, 17, 18)  # the majors TIMESCALEDB supports

# Upstream distribution (Hetzner): apt version strings. Inventories write ``{version}`` (and
# ``{pg}``) in their source URLs and artefact names; deploy/artefacts.py fills them in from here.
NEO4J_APT = "1:{version}"  # debian.neo4j.com carries an epoch
TIMESCALEDB_APT = "{version}~debian12"  # packagecloud's bookworm builds

# The Neo4j archive scripts/neo4j-artefact assembles from Maven Central (the local nodes install it).
NEO4J_ARTEFACT = "neo4j-community-{version}-maven.tar.gz"

DEFAULTS = {"qdrant": QDRANT, "neo4j": NEO4J, "timescaledb": TIMESCALEDB}


def version(component: str, settings: dict[str, object]) -> str:
    """The version to install: this module's, unless the inventory overrides it explicitly."""
    return str(settings.get("version") or DEFAULTS[component])
