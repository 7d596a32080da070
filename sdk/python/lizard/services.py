"""``lizard.services``: deploy a directory as a persistent service (what ``lizard up``
does), list, read, roll back and delete services, and read their logs.

A deploy uploads the directory's files the server lacks (by content hash, ``.gitignore``
and ``.lizardignore`` honoured, ``.git`` left out), then creates the service or deploys a
new version of it; the server builds the version (base template + files + ``build``
step) and moves the traffic once its instances pass their health checks."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional
from urllib.parse import quote

from ._context import scan
from ._ops import Emit, F, Flavoured, Items, Op, Sleep, api, api_items
from .errors import APIConnectionError, APITimeoutError, LizardError, NotFoundError

if TYPE_CHECKING:
    from .client import LizardBase

#: How often a deploy asks how its version is doing.
POLL_INTERVAL_S = 0.5
#: How long a deploy waits for its version to go live or fail, by default.
DEPLOY_TIMEOUT_S = 900.0


def _path(name: str, rest: str = "") -> str:
    return f"/v1/services/{quote(name, safe='')}{rest}"


@dataclass
class ServiceInfo:
    """A service: ``url``, ``status`` (``deploying``, ``live``, ``failing``, ``failed``),
    ``live_version``, ``versions`` (newest first: ``version``, ``status``, ``error``) and
    ``instances`` (``sandboxId``, ``version``, ``state``, ``restarts``), as the server
    answered (``raw``)."""

    service_id: str
    name: str
    url: str
    status: str
    live_version: Optional[int]
    versions: List[Dict[str, Any]]
    instances: List[Dict[str, Any]]
    error: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "ServiceInfo":
        return cls(
            service_id=j["serviceId"],
            name=j["name"],
            url=j["url"],
            status=j["status"],
            live_version=j.get("liveVersion"),
            versions=j.get("versions", []),
            instances=j.get("instances", []),
            error=j.get("error"),
            raw=j,
        )

    def version(self, n: int) -> Optional[Dict[str, Any]]:
        return next((v for v in self.versions if v["version"] == n), None)


class DeployError(LizardError):
    """A version did not go live: ``code`` (``START_NOT_READY``, ``UNHEALTHY``,
    ``BUILD_FAILED``, …), ``message``, the app's last output (``log_tail``) and the
    service as it stands (``service``: the previous version, if any, still serves)."""

    def __init__(self, service: ServiceInfo, version: int) -> None:
        error = (service.version(version) or {}).get("error") or {}
        self.service = service
        self.code = error.get("code", "FAILED")
        self.message = error.get("message", f"version {version} failed")
        self.log_tail = error.get("logTail")
        text = f"{self.code}: {self.message}"
        if self.log_tail:
            text += "\n" + self.log_tail
        super().__init__(text)


class Services(Flavoured[F]):
    """``lizard.services``: services of the client's project (its workspace holds the
    uploaded files)."""

    def __init__(self, client: "LizardBase[F]") -> None:
        self._client: LizardBase[F] = client
        self._http = client.platform

    @api
    def deploy(
        self,
        dir: str,
        name: str,
        *,
        cmd: str,
        port: int,
        template: str = "base",
        build: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        health: Optional[Mapping[str, Any]] = None,
        scale: Optional[Mapping[str, Any]] = None,
        wait: bool = True,
        timeout: float = DEPLOY_TIMEOUT_S,
    ) -> Op[ServiceInfo]:
        """Deploy ``dir`` as the service ``name``: a new service, or a new version of the
        project's service of that name. ``health`` (``path``, ``intervalMs``,
        ``timeoutMs``, ``graceMs``) and ``scale`` (``min``, ``max``, ``idle``: ``pause``
        or ``keep``, ``idleAfterMs``) as the API takes them. With ``wait``, returns once
        the version is live and raises ``DeployError`` when it failed."""
        spec: Dict[str, Any] = {"template": template, "cmd": cmd, "port": port}
        if build:
            spec["build"] = build
        if env:
            spec["env"] = dict(env)
        if health:
            spec["health"] = dict(health)
        if scale:
            spec["scale"] = dict(scale)
        project_id = yield from self._client._project_id()
        manifest = scan(dir, app=True)
        yield from self._client.templates._upload_missing(manifest, {"project": project_id})
        try:
            yield from self._get(name)
            exists = True
        except NotFoundError:
            exists = False
        # Not retried on a broken connection: a second POST would start a second deploy.
        if exists:
            answer = yield from self._http.call("POST", _path(name, "/versions"), {"spec": spec, "files": manifest.entries})
        else:
            body = {"name": name, "projectId": project_id, "spec": spec, "files": manifest.entries}
            answer = yield from self._http.call("POST", "/v1/services", body)
        info = ServiceInfo.from_json(answer)
        version = max(v["version"] for v in info.versions)
        if not wait:
            return info
        return (yield from self._settle(name, version, timeout))

    def _settle(self, name: str, version: int, timeout: float) -> Op[ServiceInfo]:
        deadline = time.monotonic() + timeout
        while True:
            info = yield from self._get(name)
            status = (info.version(version) or {}).get("status")
            if status == "live":
                return info
            if status not in ("building", "starting"):
                raise DeployError(info, version)
            if time.monotonic() >= deadline:
                raise APITimeoutError(f"version {version} of {name} still deploying after {timeout} s")
            yield Sleep(POLL_INTERVAL_S)

    @api
    def list(self) -> Op[List[ServiceInfo]]:
        """The services of the client's project (all the key reaches without one)."""
        params = {"projectId": (yield from self._client._project_id())} if self._client.project else None
        return [ServiceInfo.from_json(s) for s in (yield from self._http.call("GET", "/v1/services", params=params))]

    def _get(self, name: str) -> Op[ServiceInfo]:
        return ServiceInfo.from_json((yield from self._http.call("GET", _path(name))))

    get = api(_get)
    """A service by name; ``NotFoundError`` for a service the key does not reach."""

    @api
    def rollback(self, name: str, version: Optional[int] = None, *, timeout: float = DEPLOY_TIMEOUT_S) -> Op[ServiceInfo]:
        """Back to ``version`` (default: the one live before), once it is live again."""
        body = {} if version is None else {"version": version}
        info = ServiceInfo.from_json((yield from self._http.call("POST", _path(name, "/rollback"), body)))
        target = next((v["version"] for v in info.versions if v["status"] == "starting"), None)
        if target is None:
            return info
        return (yield from self._settle(name, target, timeout))

    @api
    def delete(self, name: str) -> Op[None]:
        """Stop every instance, delete every version's layer, free the name."""
        yield from self._http.call("DELETE", _path(name))

    @api
    def logs(self, name: str, *, tail: Optional[int] = None) -> Op[List[Dict[str, Any]]]:
        """The last ``tail`` bytes of each running instance's output: ``sandboxId``,
        ``version`` and ``data`` per instance."""
        lines: List[Dict[str, Any]] = []

        def keep(line: Dict[str, Any]) -> Op[None]:
            lines.append(line)
            return
            yield

        yield from self._lines(name, keep, tail=tail, follow=False, read_timeout=None)
        return lines

    @api_items
    def follow_logs(self, name: str, *, tail: Optional[int] = None, read_timeout: float = 3600.0) -> Items[Dict[str, Any]]:
        """The logs, then new output as it comes (until the service is deleted)."""

        def emit(line: Dict[str, Any]) -> Op[None]:
            yield Emit(line)

        yield from self._lines(name, emit, tail=tail, follow=True, read_timeout=read_timeout)

    def _lines(
        self,
        name: str,
        on_line: Any,
        *,
        tail: Optional[int],
        follow: bool,
        read_timeout: Optional[float],
    ) -> Op[None]:
        params: Dict[str, Any] = {}
        if tail is not None:
            params["tail"] = tail
        if follow:
            params["follow"] = "true"
        path = _path(name, "/logs")
        stream = yield from self._http.open("GET", path, params=params, timeout=read_timeout, lines=True)
        while True:
            line = yield from self._http.next(stream)
            if line is None:
                return
            if not line.strip():
                continue
            try:
                parsed = json.loads(line)
            except ValueError as e:
                raise APIConnectionError(f"logs of {name}: a line that is not JSON: {e}") from e
            yield from on_line(parsed)
