"""EC2's errors into this package's: the one translation of botocore's errors, and the boundary
(:class:`.boundary.Boundary`) every AWS call goes through.

::

    InsufficientInstanceCapacity, InsufficientHostCapacity,
    InsufficientCapacity, SpotMaxPriceTooLow, Unsupported (in that AZ)  -> NoCapacity
    VcpuLimitExceeded, InstanceLimitExceeded, MaxSpotInstanceCountExceeded -> QuotaExceeded
    AuthFailure, UnauthorizedOperation, expired or bad credentials      -> AuthError
    throttling, 5xx, endpoint and connection errors,
    an answer that is not EC2's XML (ResponseParserError)               -> ProviderUnavailable
    anything else during a launch or purchase                          -> LaunchFailed
"""

from __future__ import annotations

from typing import Any

from jupyter_portable.compute.boundary import Boundary
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    NoCapacity,
    ProviderUnavailable,
    QuotaExceeded,
)

_NO_CAPACITY = {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                "SpotMaxPriceTooLow"}
_QUOTA = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
_AUTH = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken",
         "RequestExpired", "OptInRequired"}
_UNAVAILABLE = {"RequestLimitExceeded", "Throttling", "ServiceUnavailable", "Unavailable", "InternalError",
                "InternalFailure"}

def _library_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    # ResponseParserError is not a BotoCoreError: a proxy's HTML page would otherwise
    # escape as a foreign error and take every provider's listing down with it
    return ClientError, BotoCoreError, ResponseParserError


def error_code(exc: Any) -> str:
    """The error code of a botocore ClientError (empty for anything else)."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _quota_hint(offer: str | None) -> str:
    machine = (offer or "").partition("@")[0]
    spot = (offer or "").endswith(":spot")
    family = "P" if machine.startswith("p") else "G and VT"
    codes = {("P", False): "L-417A185B", ("G and VT", False): "L-DB2E81BA", ("P", True): "L-7212CCBC",
             ("G and VT", True): "L-3819A6DF"}
    market = "Spot" if spot else "On-Demand"
    return (f"ask AWS for more vCPU quota: Service Quotas, EC2, '{market} {family} instances' "
            f"({codes[family, spot]})")


def _translate(exc: Exception, *, what: str, offer: str | None, default: type[ComputeError]) -> ComputeError:
    """One botocore error -> one error of this package (see the module docstring)."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.parsers import ResponseParserError

    ctx: dict[str, Any] = {"provider": "aws", "offer": offer}
    if isinstance(exc, ResponseParserError):
        # its text quotes the raw answer (an HTML page, a proxy's login form): never shown
        return ProviderUnavailable(f"aws {what}: EC2's answer could not be read (not its API's XML; "
                                   "a proxy, captive portal or outage answered instead)", **ctx,
                                   hint="check the network path to EC2 (proxy, AWS_ENDPOINT_URL) and try again")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = str(exc.response.get("Error", {}).get("Message", "")) or code
        text = f"aws {what}: {code}: {message}"
        if code in _NO_CAPACITY or (code == "Unsupported" and "Availability Zone" in message):
            return NoCapacity(text, **ctx)
        if code in _QUOTA:
            return QuotaExceeded(text, hint=_quota_hint(offer), **ctx)
        if code in _AUTH:
            return AuthError(text, hint="check the AWS credentials (AWS_PROFILE or ~/.aws) and that the IAM "
                                        "policy allows ec2:RunInstances, ec2:Describe* and ec2:CreateTags", **ctx)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _UNAVAILABLE or status >= 500:
            return ProviderUnavailable(text, hint="try again in a minute", **ctx)
        return default(text, **ctx)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AuthError(f"aws {what}: no usable AWS credentials", **ctx,
                         hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws configure`")
    if isinstance(exc, NoRegionError):
        return ProviderUnavailable(f"aws {what}: no AWS region configured", **ctx,
                                   hint="set AWS_DEFAULT_REGION or pass region= to AwsProvider")
    if isinstance(exc, (EndpointConnectionError, ConnectionError)):
        return ProviderUnavailable(f"aws {what}: could not reach EC2: {type(exc).__name__}", **ctx,
                                   hint="check the network and try again")
    if isinstance(exc, ParamValidationError):
        # Its text repeats parameter values, and user data can carry env secrets.
        return default(f"aws {what}: invalid request parameters (botocore ParamValidationError)", **ctx)
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return ProviderUnavailable(f"aws {what}: {type(exc).__name__}: {first}", **ctx)


ec2_boundary = Boundary(_library_errors, _translate)

__all__ = ["ec2_boundary", "error_code"]
