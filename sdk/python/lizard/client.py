"""``Lizard`` (blocking) and ``AsyncLizard`` (asyncio): a client pinned to one project, with
the account's namespaces; both are ``LizardBase``, whose calls are written once (``_ops``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from ._http import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, AsyncHttpClient, HttpClient
from ._ops import Async, F, Flavoured, Op, Sync, api
from .errors import ConflictError, NotFoundError
from .models import ApiKey, Project, Record, Region, SandboxInfo, Volume, WhoAmI, Workspace
from .sandbox import SandboxBase
from .services import Services
from .templates import Templates

Http = Union[HttpClient, AsyncHttpClient]


def _seg(value: str) -> str:
    return quote(value, safe="")


class Workspaces(Flavoured[F]):
    """``lizard.workspaces``: the units of isolation between your users."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def list(self) -> Op[List[Workspace]]:
        return [Workspace.from_json(w) for w in (yield from self._http.call("GET", "/v1/workspaces"))]

    @api
    def create(self, name: str) -> Op[Workspace]:
        return Workspace.from_json((yield from self._http.call("POST", "/v1/workspaces", {"name": name})))

    @api
    def find(self, name_or_slug_or_id: str) -> Op[Workspace]:
        """A workspace by id, slug or name; ``NotFoundError`` when there is none."""
        return Workspace.from_json((yield from self._http.call("GET", f"/v1/workspaces/{_seg(name_or_slug_or_id)}")))

    @api
    def delete(self, id: str, *, force: bool = False) -> Op[None]:
        """Delete an empty workspace; ``force=True`` deletes everything in it, irreversibly."""
        yield from self._http.call("DELETE", f"/v1/workspaces/{_seg(id)}", params={"force": force} if force else None)


class Projects(Flavoured[F]):
    """``lizard.projects``: what sandboxes and volumes live in and are billed to."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def list(self, *, workspace_id: Optional[str] = None) -> Op[List[Project]]:
        data = (yield from self._http.call("GET", "/v1/projects", params={"workspaceId": workspace_id}))
        return [Project.from_json(p) for p in data]

    @api
    def get(self, id: str) -> Op[Project]:
        """A project by id, slug or name."""
        return Project.from_json((yield from self._http.call("GET", f"/v1/projects/{_seg(id)}")))

    @api
    def create(self, *, workspace_id: str, name: str) -> Op[Project]:
        return Project.from_json((yield from self._http.call("POST", "/v1/projects", {"workspaceId": workspace_id, "name": name})))

    @api
    def update(self, id: str, *, name: str) -> Op[Project]:
        return Project.from_json((yield from self._http.call("PATCH", f"/v1/projects/{_seg(id)}", {"name": name})))

    @api
    def delete(self, id: str) -> Op[None]:
        yield from self._http.call("DELETE", f"/v1/projects/{_seg(id)}")


class ApiKeys(Flavoured[F]):
    """``lizard.api_keys``: keys, optionally scoped to workspaces and/or projects."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def list(self) -> Op[List[ApiKey]]:
        return [ApiKey.from_json(k) for k in (yield from self._http.call("GET", "/v1/api-keys"))]

    @api
    def create(
        self, *, name: str, workspaces: Optional[Sequence[str]] = None, projects: Optional[Sequence[str]] = None
    ) -> Op[ApiKey]:
        """A new key; ``key.key`` is the secret, returned this once. Without ``workspaces``
        or ``projects`` the key reaches everything the creating key reaches."""
        body: Dict[str, Any] = {"name": name}
        if workspaces is not None:
            body["workspaces"] = list(workspaces)
        if projects is not None:
            body["projects"] = list(projects)
        return ApiKey.from_json((yield from self._http.call("POST", "/v1/api-keys", body)))

    @api
    def delete(self, id: str) -> Op[None]:
        yield from self._http.call("DELETE", f"/v1/api-keys/{_seg(id)}")


class Regions(Flavoured[F]):
    """``lizard.regions``: where sandboxes and volumes can be placed."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def list(self) -> Op[List[Region]]:
        return [Region.from_json(r) for r in (yield from self._http.call("GET", "/v1/regions"))]


class Volumes(Flavoured[F]):
    """``lizard.volumes``: disks that outlive sandboxes, mounted at ``/workspace``; named
    within the client's project."""

    def __init__(self, client: "LizardBase[F]") -> None:
        self._client: LizardBase[F] = client
        self._http = client.platform

    def _call(self, method: str, path: str, body: Any = None) -> Op[Any]:
        """A call in the client's project."""
        project = {"projectId": (yield from self._client._project_id())}
        return (yield from self._http.call(method, path, body, params=project))

    def _create(self, name: str, *, size_gb: Optional[int] = None, region: Optional[str] = None) -> Op[Volume]:
        """Create a volume; ``ConflictError`` if the name is taken in the project."""
        body: Dict[str, Any] = {"name": name, "projectId": (yield from self._client._project_id())}
        if size_gb is not None:
            body["sizeGb"] = size_gb
        if region is not None:
            body["region"] = region
        return Volume.from_json((yield from self._http.call("POST", "/v1/volumes", body)))

    create = api(_create)

    def _get(self, name_or_id: str) -> Op[Volume]:
        return Volume.from_json((yield from self._call("GET", f"/v1/volumes/{_seg(name_or_id)}")))

    get = api(_get)

    @api
    def get_or_create(self, name: str, *, size_gb: Optional[int] = None, region: Optional[str] = None) -> Op[Volume]:
        """The volume with this name, created if absent."""
        try:
            return (yield from self._get(name))
        except NotFoundError:
            pass
        try:
            return (yield from self._create(name, size_gb=size_gb, region=region))
        except ConflictError:
            # Created by someone else between the two calls.
            return (yield from self._get(name))

    @api
    def list(self) -> Op[List[Volume]]:
        return [Volume.from_json(v) for v in (yield from self._call("GET", "/v1/volumes"))]

    @api
    def delete(self, name_or_id: str) -> Op[None]:
        yield from self._call("DELETE", f"/v1/volumes/{_seg(name_or_id)}")


class Billing(Flavoured[F]):
    """``lizard.billing``: the account's balance and ledger. Unscoped keys only: a scoped key
    gets ``PermissionDeniedError`` with code ``ACCOUNT_SCOPE_REQUIRED``."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def balance(self) -> Op[Record]:
        return Record.from_json((yield from self._http.call("GET", "/v1/billing/balance")))

    @api
    def transactions(
        self, *, limit: Optional[int] = None, cursor: Optional[str] = None, include_usage: Optional[bool] = None
    ) -> Op[Record]:
        params = {"limit": limit, "cursor": cursor, "includeUsage": include_usage}
        return Record.from_json((yield from self._http.call("GET", "/v1/billing/transactions", params=params)))

    @api
    def summary(self, *, granularity: Optional[str] = None, periods: Optional[int] = None) -> Op[Record]:
        """Credits and usage per UTC period (``granularity``: ``month`` or ``day``)."""
        params = {"granularity": granularity, "periods": periods}
        return Record.from_json((yield from self._http.call("GET", "/v1/billing/summary", params=params)))

    @api
    def live(self) -> Op[Record]:
        return Record.from_json((yield from self._http.call("GET", "/v1/billing/live")))


class Metrics(Flavoured[F]):
    """``lizard.metrics``: usage within the key's scope (what you bill a user from)."""

    def __init__(self, http: Http) -> None:
        self._http = http

    @api
    def get(
        self,
        *,
        workspace_id: Optional[str] = None,
        project_id: Optional[str] = None,
        from_: Optional[str] = None,
        to: Optional[str] = None,
    ) -> Op[Record]:
        """Sandbox-seconds, cost and running count per project and workspace the key
        reaches (``from_``/``to``: RFC 3339)."""
        params = {"workspaceId": workspace_id, "projectId": project_id, "from": from_, "to": to}
        return Record.from_json((yield from self._http.call("GET", "/v1/metrics", params=params)))

    __call__ = get


class LizardBase(Flavoured[F]):
    """A client pinned to one project (its id, slug or name: resolved to an id on first use
    and cached), in either flavour: ``Lizard`` (blocking) or ``AsyncLizard`` (asyncio).
    ``api_key`` defaults to ``LIZARD_API_KEY``, ``api_url`` to ``LIZARD_API_URL``.
    ``timeout`` (seconds) bounds each call; calls that cannot run twice (idempotent ones,
    and creates and execs, which carry an ``Idempotency-Key``) and 429 answers are retried
    up to ``max_retries`` times with backoff."""

    def __init__(self, project: Optional[str], platform: Http) -> None:
        self.project = project
        self._resolved_project_id: Optional[str] = None
        self.platform = platform
        self._http = platform
        self.workspaces: Workspaces[F] = Workspaces(platform)
        self.projects: Projects[F] = Projects(platform)
        self.api_keys: ApiKeys[F] = ApiKeys(platform)
        self.regions: Regions[F] = Regions(platform)
        self.volumes: Volumes[F] = Volumes(self)
        self.billing: Billing[F] = Billing(platform)
        self.metrics: Metrics[F] = Metrics(platform)
        self.templates: Templates[F] = Templates(self)
        self.services: Services[F] = Services(self)

    def _project_id(self) -> Op[str]:
        if self._resolved_project_id is None:
            if not self.project:
                raise ValueError("this client has no project: pass Lizard(project=...)")
            project = yield from self._http.call("GET", f"/v1/projects/{_seg(self.project)}")
            self._resolved_project_id = str(project["id"])
        return self._resolved_project_id

    project_id = api(_project_id)
    """The pinned project's id (looked up once)."""

    @api
    def create(
        self,
        template: str = "base",
        *,
        timeout_ms: Optional[int] = None,
        envs: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        lizard_token: Optional[str] = None,
        volume_name: Optional[str] = None,
        vcpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        on_timeout: Optional[str] = None,
        allow_internet_access: Optional[bool] = None,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
        public_urls: Optional[bool] = None,
        resolution: Optional[Tuple[int, int]] = None,
        request_timeout: Optional[float] = None,
    ) -> Op[SandboxBase[F]]:
        """Boot a sandbox from ``template`` in the client's project (options as
        :meth:`Sandbox.create`)."""
        sandbox: SandboxBase[Any] = yield from SandboxBase._create(
                None,
                template,
                project_id=(yield from self._project_id()),
                timeout_ms=timeout_ms,
                envs=envs,
                metadata=metadata,
                lizard_token=lizard_token,
                volume_name=volume_name,
                vcpus=vcpus,
                memory_mib=memory_mib,
                on_timeout=on_timeout,
                allow_internet_access=allow_internet_access,
                allow_out=allow_out,
                deny_out=deny_out,
                public_urls=public_urls,
                resolution=resolution,
                request_timeout=request_timeout,
                http=self._http,
            )
        return sandbox  # of the client's flavour

    @api
    def connect(self, sandbox_id: str) -> Op[SandboxBase[F]]:
        sandbox: SandboxBase[Any] = yield from SandboxBase._connect(None, sandbox_id, http=self._http)
        return sandbox

    @api
    def list(self) -> Op[List[SandboxInfo]]:
        """Running sandboxes of the client's project (all the key reaches without one)."""
        project_id = (yield from self._project_id()) if self.project else None
        return (yield from SandboxBase._list(None, project_id=project_id, http=self._http))

    @api
    def whoami(self) -> Op[WhoAmI]:
        """The account behind the key; a scoped key sees its identity and scopes only."""
        return WhoAmI.from_json((yield from self._http.call("GET", "/v1/whoami")))


class Lizard(LizardBase[Sync]):
    __doc__ = LizardBase.__doc__

    def __init__(
        self,
        project: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        platform = HttpClient(api_key=api_key, api_url=api_url, timeout=timeout, max_retries=max_retries, transport=transport)
        super().__init__(project, platform)
        self.platform: HttpClient = platform

    def close(self) -> None:
        self.platform.close()

    def __enter__(self) -> "Lizard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLizard(LizardBase[Async]):
    """``Lizard`` on ``httpx.AsyncClient``: the same namespaces and calls, each a coroutine
    (``sandbox = await lizard.create("base")``). Use it as ``async with AsyncLizard(...)``
    or ``await lizard.close()``."""

    def __init__(
        self,
        project: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        platform = AsyncHttpClient(api_key=api_key, api_url=api_url, timeout=timeout, max_retries=max_retries, transport=transport)
        super().__init__(project, platform)
        self.platform: AsyncHttpClient = platform

    async def close(self) -> None:
        await self.platform.close()

    async def __aenter__(self) -> "AsyncLizard":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
