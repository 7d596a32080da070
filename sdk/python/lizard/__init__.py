"""Lizard: microVM sandboxes for AI agents.

    from lizard import Lizard
    lizard = Lizard(project="my-project")      # api_key: LIZARD_API_KEY
    sandbox = lizard.create("base")
    print(sandbox.process.exec_("uname -a").stdout)
    sandbox.kill()

The same surface in asyncio, on ``httpx.AsyncClient``:

    from lizard import AsyncLizard
    async with AsyncLizard(project="my-project") as lizard:
        sandbox = await lizard.create("base")
        print((await sandbox.process.exec_("uname -a")).stdout)
        await sandbox.kill()
"""

from ._http import AsyncHttpClient, AsyncWatchHandle, HttpClient, WatchHandle
from .code import Context, Execution, ExecutionError, Logs, Result
from .client import AsyncLizard, ApiKeys, Billing, Lizard, LizardBase, Metrics, Projects, Regions, Volumes, Workspaces
from .errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadGatewayError,
    BuildError,
    ConflictError,
    ContextError,
    InternalServerError,
    InvalidArgumentError,
    LizardError,
    NotFoundError,
    NotImplementedByServerError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    TimedOutError,
    UnavailableError,
)
from .models import (
    ApiKey,
    ArchiveResult,
    BuildEvent,
    BuildFailure,
    BuildStepInfo,
    FileEntry,
    FileInfo,
    FsEvent,
    ListeningPort,
    ProcessInfo,
    ProcessResult,
    Project,
    Record,
    Region,
    SandboxInfo,
    TemplateBuildInfo,
    TemplateInfo,
    Volume,
    WhoAmI,
    Workspace,
)
from .desktop import Desktop, DesktopError, DesktopStream
from .processes import ProcessHandle, Pty, PtyHandle
from .sandbox import AsyncSandbox, Filesystem, Process, Sandbox, SandboxBase
from .services import DeployError, ServiceInfo, Services
from .templates import Templates

__version__ = "0.1.0"

__all__ = [
    "Lizard", "Sandbox", "Filesystem", "Process", "ProcessHandle", "Pty", "PtyHandle", "HttpClient", "Desktop", "DesktopStream", "DesktopError",
    "AsyncLizard", "AsyncSandbox", "AsyncHttpClient", "LizardBase", "SandboxBase",
    "WatchHandle", "AsyncWatchHandle", "FileInfo", "FsEvent", "ArchiveResult",
    "DeployError", "ServiceInfo", "Services",
    "Execution", "Result", "Logs", "ExecutionError", "Context",
    "Workspaces", "Projects", "ApiKeys", "Regions", "Volumes", "Billing", "Metrics", "Templates",
    "ApiKey", "FileEntry", "ListeningPort", "ProcessInfo", "ProcessResult", "Project", "Record", "Region", "SandboxInfo", "Volume", "WhoAmI", "Workspace",
    "TemplateInfo", "TemplateBuildInfo", "BuildStepInfo", "BuildFailure", "BuildEvent",
    "LizardError", "APIError", "APIConnectionError", "APITimeoutError", "AuthenticationError", "BadGatewayError",
    "ConflictError", "InternalServerError", "InvalidArgumentError", "NotFoundError", "NotImplementedByServerError",
    "PaymentRequiredError", "PermissionDeniedError", "RateLimitError", "TimedOutError", "UnavailableError", "BuildError", "ContextError",
]
