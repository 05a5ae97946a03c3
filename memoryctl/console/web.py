"""The console's framework: sign-in, the session check, CSRF, the security headers, rendering, and
running an operation for the signed-in caller (the application itself: ``memoryctl.console.app``).

Mounted at ``/console`` on ``memoryctl serve``'s listeners (``memoryctl.serve.app.build``); the
bearer-token check of ``/v1`` and ``/mcp`` lets ``/console`` through, because a browser signs in
once with a form and then carries a session cookie (``memoryctl.console.session``) -- the token
itself is checked by the same function as a bearer token (``memoryctl.operations.access.caller_of``).

Every page calls operations as HTTP does: ``bind`` (the caller's access, the one check) then the
service's ``execute`` in a worker thread of the listener. Nothing here reads a store.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memoryctl.console.session import COOKIE, LOGIN_COOKIE, Session, Sessions, load_secret
from memoryctl.declaration.table import OPERATIONS
from memoryctl.errors import MemoryctlError
from memoryctl.operations.access import OPERATOR, Caller, bind, caller_of, issued_caller, status_for

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings
    from memoryctl.declaration.declare import Operation
    from memoryctl.operations.reply import Reply
    from memoryctl.operations.tokens import AgentTokens

T = TypeVar("T")

HERE = Path(__file__).parent
PREFIX = "/console"
MAX_FORM = 64 * 1024
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class Service(Protocol):
    """What the console asks of the service it is mounted in (``memoryctl.serve.server.Service``)."""

    settings: Settings
    token: str | None
    tokens: AgentTokens
    client: MemoryClient  # the console's actions are recorded in its runs log

    def execute(self, op: Operation, params: dict[str, Any], upload: Path | None) -> Reply: ...

    async def run_in_worker(self, trusted: bool, work: Callable[[], T]) -> T: ...


class SecurityHeaders:
    """Adds the CSP and its companions to every console response (static files and errors too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in HEADERS if h[0] not in names)]
            await send(message)

        await self.app(scope, receive, sending)


class Refused(Exception):
    """A console request answered with a page of its own status (a bad form, a wrong CSRF token)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(slots=True)
class Ctx:
    """One signed-in request: who, the session (for CSRF), the console to call operations with."""

    console: Console
    request: Request
    caller: Caller
    session: Session

    @property
    def csrf(self) -> str:
        return self.console.sessions.csrf(self.session.sid)

    async def call(self, name: str, params: dict[str, Any]) -> Reply:
        return await self.console.call(self.request, self.caller, name, params)

    async def act(self, name: str, params: dict[str, Any]) -> Reply:
        """An action of the console (retry, drop, forget): the operation, recorded in the runs log
        with the caller's name (``memoryctl runs`` shows it as ``console <operation>``)."""
        return await self.console.call(self.request, self.caller, name, params, record=True)

    async def form(self) -> dict[str, list[str]]:
        """The POSTed form, its CSRF token checked (403 otherwise)."""
        form = await read_form(self.request)
        if not self.console.sessions.csrf_ok(self.session.sid, first(form, "csrf")):
            raise Refused(403, "the form's CSRF token is missing or wrong: reload the page and send it again")
        return form

    def render(self, template: str, status: int = 200, **values: Any) -> Response:
        return self.console.render(template, status, ctx=self, **values)


Handler = Callable[[Ctx], Awaitable[Response]]


def first(form: dict[str, list[str]], key: str) -> str | None:
    values = form.get(key)
    return values[0] if values else None


async def read_form(request: Request) -> dict[str, list[str]]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise Refused(415, "a console form is sent as application/x-www-form-urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, f"a console form is at most {MAX_FORM} bytes")
    try:
        return urllib.parse.parse_qs(body.decode(), keep_blank_values=True, max_num_fields=1000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, f"the form is not readable: {exc}") from None


def environment() -> jinja2.Environment:
    """The templates, autoescaped: every value is escaped (memories' text first, SVG labels too)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,  # a component's absent figure reads as nothing
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["prefix"] = PREFIX
    env.filters["ms"] = milliseconds
    env.filters["age"] = age
    return env


class Console:
    """The console of one service: its sessions, templates and operations."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.sessions = Sessions(load_secret(service.settings.data_dir))
        self.env = environment()

    # ---- who calls ------------------------------------------------------------------------------
    def caller_of_session(self, session: Session) -> Caller | None:
        """The caller a session stands for, asked again on every request (revocation ends it)."""
        token = self.service.token
        if token is not None and hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), session.token_sha256):
            return OPERATOR
        entry = self.service.tokens.by_digest(session.token_sha256)
        return None if entry is None else issued_caller(entry)

    # ---- operations -----------------------------------------------------------------------------
    async def call(
        self, request: Request, caller: Caller, name: str, params: dict[str, Any], *, record: bool = False
    ) -> Reply:
        op = OPERATIONS[name]
        bound = bind(op, params, caller)  # the access check of HTTP and MCP, no other
        service = self.service
        trusted = False  # the console is a remote caller whatever the listener

        def work() -> Reply:
            if not record:
                return service.execute(op, bound, None)
            from memoryctl.maintenance.runs import recorded_action

            runs = service.client.stack.runs
            actor = f"console {caller.name}"
            return recorded_action(runs, f"console {name}", actor, bound, lambda: service.execute(op, bound, None))

        return await service.run_in_worker(trusted, work)

    # ---- pages ----------------------------------------------------------------------------------
    def render(self, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(**values)
        return HTMLResponse(html, status)

    def error(self, status: int, message: str, hint: str | None = None, ctx: Ctx | None = None) -> HTMLResponse:
        return self.render("error.html", status, ctx=ctx, code=status, message=message, hint=hint)

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A route that needs a session: a visitor without one is sent to sign in."""

        async def endpoint(request: Request) -> Response:
            session = self.sessions.read(request.cookies.get(COOKIE))
            caller = self.caller_of_session(session) if session is not None else None
            if session is None or caller is None:
                if request.method != "GET":
                    return self.error(401, "not signed in (or the session ended)", "sign in again")
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?{urllib.parse.urlencode({'next': target})}", 303)
            ctx = Ctx(self, request, caller, session)
            try:
                return await handler(ctx)
            except Refused as exc:
                return self.error(exc.status, exc.message, ctx=ctx)
            except MemoryctlError as exc:
                return self.error(status_for(exc), exc.message, exc.hint, ctx=ctx)

        return endpoint

    # ---- sign-in --------------------------------------------------------------------------------
    async def login_form(self, request: Request, message: str | None = None, status: int = 200) -> Response:
        nonce = secrets.token_urlsafe(16)
        nxt = safe_next(request.query_params.get("next"))
        response = self.render(
            "login.html", status, ctx=None, csrf=self.sessions.csrf(nonce), next=nxt, message=message
        )
        response.set_cookie(LOGIN_COOKIE, nonce, max_age=600, path=PREFIX, **cookie_flags(request))
        return response

    async def login(self, request: Request) -> Response:
        try:
            form = await read_form(request)
        except Refused as exc:
            return self.error(exc.status, exc.message)
        if not self.sessions.csrf_ok(request.cookies.get(LOGIN_COOKIE), first(form, "csrf")):
            return await self.login_form(request, "the sign-in form expired: send it again", 403)
        token = (first(form, "token") or "").strip()
        if not token or caller_of(token, self.service.token, self.service.tokens) is None:
            return await self.login_form(request, "that token is not valid here", 401)
        _, cookie = self.sessions.start(token)
        response = RedirectResponse(safe_next(first(form, "next")), 303)
        response.set_cookie(COOKIE, cookie, max_age=int(self.sessions.max_age_s), path=PREFIX, **cookie_flags(request))
        response.delete_cookie(LOGIN_COOKIE, path=PREFIX)
        return response

    async def logout(self, ctx: Ctx) -> Response:
        await ctx.form()
        self.sessions.end(ctx.session)
        response = RedirectResponse(f"{PREFIX}/login", 303)
        response.delete_cookie(COOKIE, path=PREFIX, **cookie_flags(ctx.request))
        return response


def cookie_flags(request: Request) -> dict[str, Any]:
    """HttpOnly, SameSite=Strict, Secure when the request came over TLS."""
    return {"httponly": True, "samesite": "strict", "secure": request.scope.get("scheme") == "https"}


def safe_next(value: str | None) -> str:
    """Where to go after sign-in: a console path only (never another site: ``//host``, ``/\\host``)."""
    if value and value.startswith(f"{PREFIX}/") and "//" not in value and "\\" not in value:
        return value
    return f"{PREFIX}/overview"


def milliseconds(value: Any) -> str:
    """A figure in ms, or "-" where a component reports none."""
    if value is None or isinstance(value, jinja2.Undefined):
        return "-"
    return f"{float(value):,.1f}"


def age(seconds: Any) -> str:
    """An age in seconds as a person reads it (``3 h 12 min``)."""
    if seconds is None or isinstance(seconds, jinja2.Undefined):
        return "-"
    s = float(seconds)
    for (unit, size), (sub, sub_size) in itertools.pairwise(AGES):
        if s >= size:
            whole, rest = int(s // size), int(s % size // sub_size)
            return f"{whole} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{s:.0f} s"


AGES = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
