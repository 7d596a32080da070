"""What the API returns, as typed objects with snake_case attributes. Each keeps the
server's JSON in ``raw``, so fields added by a newer server are never lost."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar

T = TypeVar("T", bound="Model")


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass
class Model:
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls: Type[T], data: Dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {snake(k): v for k, v in data.items() if snake(k) in names and snake(k) != "raw"}
        return cls(raw=data, **values)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


@dataclass
class Workspace(Model):
    id: str = ""
    name: str = ""
    slug: str = ""
    created_at: str = ""


@dataclass
class Project(Model):
    id: str = ""
    workspace_id: str = ""
    name: str = ""
    slug: str = ""
    created_at: str = ""


@dataclass
class ApiKey(Model):
    """An API key as listed; ``key`` (the secret) is set only on the answer to ``create``."""

    id: str = ""
    name: str = ""
    prefix: str = ""
    workspaces: Optional[List[str]] = None
    projects: Optional[List[str]] = None
    created_at: str = ""
    key: Optional[str] = None


@dataclass
class WhoAmI(Model):
    account_id: str = ""
    key_id: str = ""
    key_name: str = ""
    scoped: bool = False
    email: Optional[str] = None
    plan: Optional[str] = None
    workspaces: Optional[List[str]] = None
    projects: Optional[List[str]] = None


@dataclass
class Region(Model):
    id: str = ""
    name: str = ""
    sandbox_domain: str = ""


@dataclass
class Volume(Model):
    id: str = ""
    name: str = ""
    project_id: str = ""
    size_gb: Optional[int] = None
    region: Optional[str] = None
    created_at: Optional[str] = None


@dataclass
class SandboxInfo(Model):
    sandbox_id: str = ""
    template: str = ""
    state: str = ""
    vcpus: int = 0
    memory_mib: int = 0
    started_at: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)
    project_id: Optional[str] = None
    end_at: Optional[str] = None
    domain: Optional[str] = None
    #: Only in a create's answer with ``public_urls=False``: the token its URLs require.
    access_token: Optional[str] = None


@dataclass
class FileEntry(Model):
    name: str = ""
    path: str = ""
    type: str = ""
    size: int = 0
    mode: int = 0


@dataclass
class FileInfo(Model):
    """What is at a path (``lstat``: a symlink is described, with ``symlink_target``, not
    followed). ``type``: ``file``, ``dir``, ``symlink`` or ``other``; ``mtime_ms``:
    milliseconds since the Unix epoch."""

    name: str = ""
    path: str = ""
    type: str = ""
    size: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    owner: str = ""
    group: str = ""
    mtime_ms: int = 0
    symlink_target: Optional[str] = None


@dataclass
class FsEvent(Model):
    """A change in a watched directory: ``type`` is ``create``, ``write``, ``remove``,
    ``rename`` (from ``path`` to ``new_path``) or ``overflow`` (the guest's event queue
    overflowed and events were lost; the watch goes on: rescan what matters)."""

    type: str = ""
    path: str = ""
    new_path: Optional[str] = None
    is_dir: bool = False


@dataclass
class ArchiveResult(Model):
    """An unpacked archive: the directory, how many entries it held and the bytes of file
    content written."""

    path: str = ""
    entries: int = 0
    bytes_written: int = 0


@dataclass
class ProcessResult(Model):
    """How a command ended: its whole stdout and stderr (UTF-8) and exit code (124 when its
    timeout killed it)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timed_out: bool = False


@dataclass
class ProcessInfo(Model):
    """A process the sandbox keeps (``process.list()``): its pid, command line, start
    (milliseconds since the epoch, the guest's clock), whether it runs on a terminal, and
    its exit code once it ended."""

    pid: int = 0
    cmd: str = ""
    started_at_ms: int = 0
    pty: bool = False
    exit_code: Optional[int] = None


@dataclass
class ListeningPort(Model):
    """A TCP port something listens on in the sandbox (``sandbox.list_ports()``): the port,
    the address it listens on (``0.0.0.0``, ``::``, ``127.0.0.1``), and the process holding
    it where the sandbox's agent found it. The platform's own guest ports are never listed."""

    port: int = 0
    address: str = ""
    pid: Optional[int] = None
    cmd: Optional[str] = None


@dataclass
class Record(Model):
    """A JSON object the SDK has no dedicated type for (billing, metrics): read it through
    ``raw`` or item access (``r["balance"]``)."""

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("raw", {})
        for k, v in raw.items():
            if snake(k) == name:
                return v
        raise AttributeError(name)

    @classmethod
    def from_json(cls, data: Any) -> "Record":
        return cls(raw=data if isinstance(data, dict) else {"value": data})


@dataclass
class TemplateInfo(Model):
    """A template: a built-in (``builtin``, visible to every key) or one a workspace pushed.
    ``ready`` once a build succeeded; ``build_id`` is the build sandboxes are created from,
    ``latest_build_id`` the newest (maybe running or failed)."""

    name: str = ""
    description: str = ""
    builtin: bool = False
    ready: bool = False
    workspace_id: Optional[str] = None
    from_: Optional[str] = None
    build_id: Optional[str] = None
    latest_build_id: Optional[str] = None
    start_cmd: Optional[str] = None
    size_bytes: Optional[int] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "TemplateInfo":
        info = super().from_json(data)
        info.from_ = data.get("from")  # `from` is a keyword
        return info


@dataclass
class BuildStepInfo(Model):
    """One step of a build: ``index`` (1-based), its line, whether its layer came from the
    cache (it did not run), its status and how long it took."""

    index: int = 0
    description: str = ""
    cached: bool = False
    status: str = ""
    duration_ms: Optional[int] = None


@dataclass
class BuildFailure(Model):
    """Why a build failed: ``code`` (``STEP_FAILED``, ``TIMED_OUT``, ``START_NOT_READY``,
    ``CANCELLED``, ``INTERNAL``), the failing ``step`` and its ``output_tail``."""

    code: str = ""
    message: str = ""
    step: Optional[int] = None
    output_tail: Optional[str] = None


@dataclass
class TemplateBuildInfo(Model):
    """A build of a template: ``status`` is ``queued``, ``running``, ``ready``, ``failed``
    or ``cancelled``; ``log`` is its output so far (the last 64 KiB)."""

    build_id: str = ""
    template: str = ""
    status: str = ""
    steps: List[BuildStepInfo] = field(default_factory=list)
    error: Optional[BuildFailure] = None
    created_at: str = ""
    finished_at: Optional[str] = None
    log: str = ""

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "TemplateBuildInfo":
        info = super().from_json(data)
        info.steps = [BuildStepInfo.from_json(s) for s in data.get("steps") or []]
        info.error = BuildFailure.from_json(data["error"]) if data.get("error") else None
        return info

    @property
    def finished(self) -> bool:
        return self.status in ("ready", "failed", "cancelled")


@dataclass
class BuildEvent(Model):
    """One line of a build's event stream; ``type`` says which fields it has:
    ``step`` (``index``, ``total``, ``description``, ``cached``), ``output`` (``stream``:
    ``stdout``/``stderr``, ``data``), ``stepDone`` (``index``, ``duration_ms``), ``phase``
    (``message``), ``done`` (``status``, ``error``; always the last)."""

    type: str = ""
    index: Optional[int] = None
    total: Optional[int] = None
    description: Optional[str] = None
    cached: Optional[bool] = None
    stream: Optional[str] = None
    data: Optional[str] = None
    duration_ms: Optional[int] = None
    message: Optional[str] = None
    status: Optional[str] = None
    error: Optional[BuildFailure] = None

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "BuildEvent":
        event = super().from_json(data)
        event.error = BuildFailure.from_json(data["error"]) if data.get("error") else None
        return event
