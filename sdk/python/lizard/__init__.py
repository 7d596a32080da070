"""Lizard: microVM sandboxes for AI agents.

    from lizard import Lizard
    lizard = Lizard(project="my-project")      # api_key: LIZARD_API_KEY
    sandbox = lizard.create("base")
    print(sandbox.process.exec_("uname -a").stdout)
    sandbox.kill()
"""

from ._http import HttpClient
from .code import Context, Execution, ExecutionError, Logs, Result
from .client import ApiKeys, Billing, Lizard, Metrics, Projects, Regions, Volumes, Workspaces
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
    UnavailableError,
)
from .models import (
    ApiKey,
    BuildEvent,
    BuildFailure,
    BuildStepInfo,
    FileEntry,
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
from .sandbox import Filesystem, Process, Sandbox
from .services import DeployError, ServiceInfo, Services
from .templates import Templates

__version__ = "0.1.0"

__all__ = [
    "DeployError",
    "ServiceInfo",
    "Services",
    "Lizard", "Sandbox", "Filesystem", "Process", "HttpClient", "Desktop", "DesktopStream", "DesktopError",
    "Execution", "Result", "Logs", "ExecutionError", "Context",
    "Workspaces", "Projects", "ApiKeys", "Regions", "Volumes", "Billing", "Metrics", "Templates",
    "ApiKey", "FileEntry", "ProcessResult", "Project", "Record", "Region", "SandboxInfo", "Volume", "WhoAmI", "Workspace",
    "TemplateInfo", "TemplateBuildInfo", "BuildStepInfo", "BuildFailure", "BuildEvent",
    "LizardError", "APIError", "APIConnectionError", "APITimeoutError", "AuthenticationError", "BadGatewayError",
    "ConflictError", "InternalServerError", "InvalidArgumentError", "NotFoundError", "NotImplementedByServerError",
    "PaymentRequiredError", "PermissionDeniedError", "RateLimitError", "UnavailableError", "BuildError", "ContextError",
]
