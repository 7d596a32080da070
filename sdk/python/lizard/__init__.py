"""Lizard: microVM sandboxes for AI agents.

    from lizard import Lizard
    lizard = Lizard(project="my-project")      # api_key: LIZARD_API_KEY
    sandbox = lizard.create("base")
    print(sandbox.process.exec_("uname -a").stdout)
    sandbox.kill()
"""

from ._http import HttpClient
from .client import ApiKeys, Billing, Lizard, Metrics, Projects, Regions, Volumes, Workspaces
from .errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadGatewayError,
    ConflictError,
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
from .models import ApiKey, FileEntry, ProcessResult, Project, Record, Region, SandboxInfo, Volume, WhoAmI, Workspace
from .sandbox import Filesystem, Process, Sandbox

__version__ = "0.1.0"

__all__ = [
    "Lizard", "Sandbox", "Filesystem", "Process", "HttpClient",
    "Workspaces", "Projects", "ApiKeys", "Regions", "Volumes", "Billing", "Metrics",
    "ApiKey", "FileEntry", "ProcessResult", "Project", "Record", "Region", "SandboxInfo", "Volume", "WhoAmI", "Workspace",
    "LizardError", "APIError", "APIConnectionError", "APITimeoutError", "AuthenticationError", "BadGatewayError",
    "ConflictError", "InternalServerError", "InvalidArgumentError", "NotFoundError", "NotImplementedByServerError",
    "PaymentRequiredError", "PermissionDeniedError", "RateLimitError", "UnavailableError",
]
