"""``memoryctl health``'s ``alerting`` component: do alerts still reach a person?

Every other component says whether a part of the stack works; this one says whether anyone would
hear about it if it did not. Prometheus scrapes Alertmanager, so it holds the answer: how many
notifications Alertmanager sent and how many failed over the last ``window_s`` (its
``alertmanager_notifications_total`` / ``..._failed_total`` counters, by integration), whether
each Alertmanager is up and how long it has run, and which alerts fire now. Asked of Prometheus,
not of Alertmanager: Alertmanager keeps no delivery history an API returns, and Prometheus is
the part that must be alive for any rule to fire at all. ``prometheus_url`` may list every
Prometheus of an HA pair (docs/monitoring.md): they are asked in order and the first that answers
is read (both scrape and evaluate the same, so either knows); one that does not answer makes the
component ``degraded`` (alerts still fire from the other), none answering makes it ``down``.

``degraded`` when a notification failed in the window (a receiver refuses, SMTP is down, the
heartbeat URL is wrong), when an Alertmanager is down or not scraped, or when a dead-man's switch
is configured (``heartbeat``) and nothing was delivered in the window although Alertmanager has
run long enough to have sent three pings after Prometheus re-sent it the Watchdog (``RESEND_S``
plus ``3 * heartbeat_interval_s``; a restarted Alertmanager knows no alert until then, and an
empty window says nothing). Alerts firing now are listed, never a
status: what they are about is reported by the components they are about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from memoryctl.errors import StoreUnavailable

if TYPE_CHECKING:
    from memoryctl.config import Settings

WATCHDOG = "Watchdog"
RESEND_S = 60.0  # Prometheus re-sends firing alerts every minute (--rules.alert.resend-delay)


@dataclass(slots=True)
class Observed:
    """What Prometheus answered, per Alertmanager instance and per integration."""

    up: dict[str, float] = field(default_factory=dict)  # instance -> 0/1
    uptime_s: dict[str, float] = field(default_factory=dict)  # instance -> seconds since its start
    sent: dict[str, float] = field(default_factory=dict)  # integration -> notifications in the window
    failed: dict[str, float] = field(default_factory=dict)  # integration -> failed in the window
    firing: list[str] = field(default_factory=list)  # alert names firing now, the Watchdog left out


def _queries(window_s: float) -> dict[str, str]:
    w = f"{max(1, round(window_s))}s"
    return {
        "up": 'up{job="alertmanager"}',
        "uptime": 'time() - process_start_time_seconds{job="alertmanager"}',
        "sent": f"sum by (integration) (increase(alertmanager_notifications_total[{w}]))",
        "failed": f"sum by (integration) (increase(alertmanager_notifications_failed_total[{w}]))",
        "firing": 'ALERTS{alertstate="firing"}',
    }


def _vector(answer: Any, label: str) -> dict[str, float]:
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise ValueError(f"not a successful query answer: {str(answer)[:200]}")
    return {str(r["metric"].get(label, "")): float(r["value"][1]) for r in answer["data"]["result"]}


def observe(url: str, *, window_s: float, timeout_s: float) -> Observed:
    """Five instant queries of Prometheus' HTTP API at ``url``; StoreUnavailable when it does not answer."""
    seen: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s) as http:
            for name, query in _queries(window_s).items():
                resp = http.get("/api/v1/query", params={"query": query})
                resp.raise_for_status()
                seen[name] = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise StoreUnavailable("prometheus", f"{url}: {type(exc).__name__}: {exc}") from exc
    return Observed(
        up=_vector(seen["up"], "instance"),
        uptime_s=_vector(seen["uptime"], "instance"),
        sent=_vector(seen["sent"], "integration"),
        failed=_vector(seen["failed"], "integration"),
        firing=sorted({n for n in _vector(seen["firing"], "alertname") if n != WATCHDOG}),
    )


def judge(seen: Observed, *, window_s: float, heartbeat: bool, heartbeat_interval_s: float) -> dict[str, Any]:
    """The component's report from what Prometheus answered (pure: the unit tests' subject)."""
    failed = {k: round(v) for k, v in seen.failed.items() if v > 0}
    delivered = {k: max(0, round(v - seen.failed.get(k, 0.0))) for k, v in seen.sent.items()}
    res: dict[str, Any] = {
        "window_s": window_s,
        "alertmanagers": {i: {"up": bool(u), "uptime_s": round(seen.uptime_s.get(i, 0.0))} for i, u in seen.up.items()},
        "delivered": {k: v for k, v in delivered.items() if v},
        "failed": failed,
        "heartbeat": heartbeat,
        "firing": seen.firing,
    }
    problems = []
    if not seen.up:
        problems.append("Prometheus scrapes no Alertmanager (job alertmanager): alerts have nowhere to go")
    down = sorted(i for i, u in seen.up.items() if not u)
    if down:
        problems.append(f"Alertmanager down: {', '.join(down)}")
    if failed:
        by = ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
        problems.append(f"notifications failed in the last {window_s:.0f}s ({by}): see Alertmanager's log")
    settled = [u for i, u in seen.uptime_s.items() if seen.up.get(i)]
    if heartbeat and settled and min(settled) >= RESEND_S + 3 * heartbeat_interval_s and not sum(delivered.values()):
        problems.append(
            f"nothing delivered in the last {window_s:.0f}s although the heartbeat sends every"
            f" {heartbeat_interval_s:.0f}s: the dead-man's switch will page"
        )
    if problems:
        res.update(status="degraded", error="; ".join(problems))
    return res


def observe_first(urls: list[str], *, window_s: float, timeout_s: float) -> tuple[str, Observed, dict[str, str]]:
    """The first Prometheus of ``urls`` that answers: its URL, its answer, and the error of each one
    asked before it; StoreUnavailable naming every error when none answers."""
    errors: dict[str, str] = {}
    for url in urls:
        try:
            return url, observe(url, window_s=window_s, timeout_s=timeout_s), errors
        except StoreUnavailable as exc:
            errors[url] = exc.message.removeprefix("prometheus: ")
    raise StoreUnavailable("prometheus", "; ".join(errors.values()) or "no prometheus_url")


def alerting_probe(settings: Settings, *, timeout_s: float) -> dict[str, Any]:
    """The component: ``disabled`` without ``[alerting] prometheus_url`` (the embedded default)."""
    a = settings.alerting
    if not a.prometheus_url:
        return {"status": "disabled", "detail": "[alerting] prometheus_url is not configured"}
    urls = [a.prometheus_url] if isinstance(a.prometheus_url, str) else list(a.prometheus_url)
    url, seen, unanswered = observe_first(urls, window_s=a.window_s, timeout_s=timeout_s)
    res = judge(seen, window_s=a.window_s, heartbeat=a.heartbeat, heartbeat_interval_s=a.heartbeat_interval_s)
    if unanswered:
        res["unanswered"] = unanswered
        problem = f"Prometheus does not answer: {', '.join(unanswered)} (read {url} instead)"
        res.update(status="degraded", error="; ".join(filter(None, [res.get("error"), problem])))
    return {"prometheus": url, **res}


def summary(comp: dict[str, Any]) -> str:
    """One line for the health table: what was delivered in the window, what fires now."""
    delivered = ", ".join(f"{k} {v}" for k, v in sorted(comp.get("delivered", {}).items())) or "nothing"
    line = f"delivered in the last {comp.get('window_s', 0):.0f}s: {delivered}"
    if comp.get("firing"):
        line += f"; firing: {', '.join(comp['firing'])}"
    return line
