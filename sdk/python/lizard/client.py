"""``Lizard``: a client pinned to one project, with the account's namespaces."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

from ._http import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, HttpClient
from .errors import NotFoundError
from .models import ApiKey, Project, Record, Region, SandboxInfo, Volume, WhoAmI, Workspace
from .sandbox import Sandbox
from .services import Services
from .templates import Templates


def _seg(value: str) -> str:
    return quote(value, safe="")


class Workspaces:
    """``lizard.workspaces``: the units of isolation between your users."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def list(self) -> List[Workspace]:
        return [Workspace.from_json(w) for w in self._http.get("/v1/workspaces")]

    def create(self, name: str) -> Workspace:
        return Workspace.from_json(self._http.post("/v1/workspaces", json={"name": name}))

    def find(self, name_or_slug_or_id: str) -> Workspace:
        """A workspace by id, slug or name; ``NotFoundError`` when there is none."""
        return Workspace.from_json(self._http.get(f"/v1/workspaces/{_seg(name_or_slug_or_id)}"))

    def delete(self, id: str, *, force: bool = False) -> None:
        """Delete an empty workspace; ``force=True`` deletes everything in it, irreversibly."""
        self._http.delete(f"/v1/workspaces/{_seg(id)}", params={"force": force} if force else None)


class Projects:
    """``lizard.projects``: what sandboxes and volumes live in and are billed to."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def list(self, *, workspace_id: Optional[str] = None) -> List[Project]:
        data = self._http.get("/v1/projects", params={"workspaceId": workspace_id})
        return [Project.from_json(p) for p in data]

    def get(self, id: str) -> Project:
        """A project by id, slug or name."""
        return Project.from_json(self._http.get(f"/v1/projects/{_seg(id)}"))

    def create(self, *, workspace_id: str, name: str) -> Project:
        return Project.from_json(self._http.post("/v1/projects", json={"workspaceId": workspace_id, "name": name}))

    def update(self, id: str, *, name: str) -> Project:
        return Project.from_json(self._http.patch(f"/v1/projects/{_seg(id)}", json={"name": name}))

    def delete(self, id: str) -> None:
        self._http.delete(f"/v1/projects/{_seg(id)}")


class ApiKeys:
    """``lizard.api_keys``: keys, optionally scoped to workspaces and/or projects."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def list(self) -> List[ApiKey]:
        return [ApiKey.from_json(k) for k in self._http.get("/v1/api-keys")]

    def create(
        self, *, name: str, workspaces: Optional[Sequence[str]] = None, projects: Optional[Sequence[str]] = None
    ) -> ApiKey:
        """A new key; ``key.key`` is the secret, returned this once. Without ``workspaces``
        or ``projects`` the key reaches everything the creating key reaches."""
        body: Dict[str, Any] = {"name": name}
        if workspaces is not None:
            body["workspaces"] = list(workspaces)
        if projects is not None:
            body["projects"] = list(projects)
        return ApiKey.from_json(self._http.post("/v1/api-keys", json=body))

    def delete(self, id: str) -> None:
        self._http.delete(f"/v1/api-keys/{_seg(id)}")


class Regions:
    """``lizard.regions``: where sandboxes and volumes can be placed."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def list(self) -> List[Region]:
        return [Region.from_json(r) for r in self._http.get("/v1/regions")]


class Volumes:
    """``lizard.volumes``: disks that outlive sandboxes, mounted at ``/workspace``; named
    within the client's project."""

    def __init__(self, client: "Lizard") -> None:
        self._client = client

    def _project(self) -> Dict[str, str]:
        return {"projectId": self._client.project_id()}

    def create(self, name: str, *, size_gb: Optional[int] = None, region: Optional[str] = None) -> Volume:
        """Create a volume; ``ConflictError`` if the name is taken in the project."""
        body: Dict[str, Any] = {"name": name, **self._project()}
        if size_gb is not None:
            body["sizeGb"] = size_gb
        if region is not None:
            body["region"] = region
        return Volume.from_json(self._client.platform.post("/v1/volumes", json=body))

    def get(self, name_or_id: str) -> Volume:
        return Volume.from_json(self._client.platform.get(f"/v1/volumes/{_seg(name_or_id)}", params=self._project()))

    def get_or_create(self, name: str, *, size_gb: Optional[int] = None, region: Optional[str] = None) -> Volume:
        """The volume with this name, created if absent."""
        from .errors import ConflictError

        try:
            return self.get(name)
        except NotFoundError:
            pass
        try:
            return self.create(name, size_gb=size_gb, region=region)
        except ConflictError:
            # Created by someone else between the two calls.
            return self.get(name)

    def list(self) -> List[Volume]:
        return [Volume.from_json(v) for v in self._client.platform.get("/v1/volumes", params=self._project())]

    def delete(self, name_or_id: str) -> None:
        self._client.platform.delete(f"/v1/volumes/{_seg(name_or_id)}", params=self._project())


class Billing:
    """``lizard.billing``: the account's balance and ledger. Unscoped keys only: a scoped key
    gets ``PermissionDeniedError`` with code ``ACCOUNT_SCOPE_REQUIRED``."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def balance(self) -> Record:
        return Record.from_json(self._http.get("/v1/billing/balance"))

    def transactions(
        self, *, limit: Optional[int] = None, cursor: Optional[str] = None, include_usage: Optional[bool] = None
    ) -> Record:
        params = {"limit": limit, "cursor": cursor, "includeUsage": include_usage}
        return Record.from_json(self._http.get("/v1/billing/transactions", params=params))

    def summary(self, *, granularity: Optional[str] = None, periods: Optional[int] = None) -> Record:
        """Credits and usage per UTC period (``granularity``: ``month`` or ``day``)."""
        params = {"granularity": granularity, "periods": periods}
        return Record.from_json(self._http.get("/v1/billing/summary", params=params))

    def live(self) -> Record:
        return Record.from_json(self._http.get("/v1/billing/live"))


class Metrics:
    """``lizard.metrics``: usage within the key's scope (what you bill a user from)."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    def get(
        self,
        *,
        workspace_id: Optional[str] = None,
        project_id: Optional[str] = None,
        from_: Optional[str] = None,
        to: Optional[str] = None,
    ) -> Record:
        """Sandbox-seconds, cost and running count per project and workspace the key
        reaches (``from_``/``to``: RFC 3339)."""
        params = {"workspaceId": workspace_id, "projectId": project_id, "from": from_, "to": to}
        return Record.from_json(self._http.get("/v1/metrics", params=params))

    __call__ = get


class Lizard:
    """A client pinned to one project (its id, slug or name: resolved to an id on first use
    and cached). ``api_key`` defaults to ``LIZARD_API_KEY``, ``api_url`` to
    ``LIZARD_API_URL``. ``timeout`` (seconds) bounds each call; calls that cannot run twice
    (idempotent ones, and creates and execs, which carry an ``Idempotency-Key``) and 429
    answers are retried up to ``max_retries`` times with backoff."""

    def __init__(
        self,
        project: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        self.project = project
        self._project_id: Optional[str] = None
        self.platform = HttpClient(api_key=api_key, api_url=api_url, timeout=timeout, max_retries=max_retries)
        self.workspaces = Workspaces(self.platform)
        self.projects = Projects(self.platform)
        self.api_keys = ApiKeys(self.platform)
        self.regions = Regions(self.platform)
        self.volumes = Volumes(self)
        self.billing = Billing(self.platform)
        self.metrics = Metrics(self.platform)
        self.templates = Templates(self)
        self.services = Services(self)

    def close(self) -> None:
        self.platform.close()

    def __enter__(self) -> "Lizard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def project_id(self) -> str:
        """The pinned project's id (looked up once)."""
        if self._project_id is None:
            if not self.project:
                raise ValueError("this client has no project: pass Lizard(project=...)")
            self._project_id = self.projects.get(self.project).id
        return self._project_id

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
    ) -> Sandbox:
        """Boot a sandbox from ``template`` in the client's project (options as
        :meth:`Sandbox.create`)."""
        return Sandbox.create(
            template,
            project_id=self.project_id(),
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
            http=self.platform,
        )

    def connect(self, sandbox_id: str) -> Sandbox:
        return Sandbox.connect(sandbox_id, http=self.platform)

    def list(self) -> List[SandboxInfo]:
        """Running sandboxes of the client's project (all the key reaches without one)."""
        return Sandbox.list(project_id=self.project_id() if self.project else None, http=self.platform)

    def whoami(self) -> WhoAmI:
        """The account behind the key; a scoped key sees its identity and scopes only."""
        return WhoAmI.from_json(self.platform.get("/v1/whoami"))
