"""The two images a workspace can pin, and the providers each one means something to.

A *container image* (``nvcr.io/nvidia/pytorch:24.05-py3``) is what RunPod and Vast.ai start
the machine's work in, and what the local market's machines say they run. A *machine image*
is what a virtual machine boots: on AWS an AMI (``ami-0123456789abcdef0``, or an SSM
parameter as ``resolve:ssm:/aws/service/...``), on Google Cloud an image or image family
(``projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570``).
An AMI means nothing to Google Cloud and an image path nothing to AWS, so a machine image
applies to the one cloud whose form it has; the other boots its default. Lambda (Lambda Stack)
and ssh hosts take neither.

A value of the wrong kind is refused when it is set, naming the providers each setting
affects; it never reaches a launch. Pure data and rules, no I/O.
"""

from __future__ import annotations

import re

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.validate import short_repr

CONTAINER_IMAGE_PROVIDERS = ("runpod", "vastai", "local")
MACHINE_IMAGE_PROVIDERS = ("aws", "gcp")
PROVIDER_WORDS = {"runpod": "RunPod", "vastai": "Vast.ai", "local": "the local market", "aws": "AWS",
                  "gcp": "Google Cloud", "lambda": "Lambda", "ssh": "ssh hosts"}
MAX_IMAGE = 200

# Docker's reference grammar: [registry[:port]/]path[:tag][@sha256:digest], path components in
# lower case. A tag may start with "@" for Vast's "vastai/base-image:@vastai-automatic-tag".
_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_CONTAINER_RE = re.compile(
    r"\A(?:(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|localhost|[A-Za-z0-9-]+:\d{1,5})(?::\d{1,5})?/)?"
    rf"{_PART}(?:/{_PART})*"
    r"(?::@?[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?\Z")
# EC2: an image id (8 or 17 hex digits), or an SSM parameter EC2 resolves at launch
_AWS_RE = re.compile(r"\A(?:ami-(?:[0-9a-f]{8}|[0-9a-f]{17})|resolve:ssm:/?[A-Za-z0-9_./-]{1,180}(?::\d{1,6})?)\Z")
# Compute Engine's sourceImage: an image or a family, in a project or this one, as a full or partial URL
_GCP_RE = re.compile(r"\A(?:https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta)/)?"
                     r"(?:projects/[a-z][a-z0-9.:-]{1,62}/)?global/images/(?:family/)?"
                     r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_AWS_LIKE = re.compile(r"\A(?:ami-|resolve:ssm:)", re.I)
_GCP_LIKE = re.compile(r"(?:\A|/)global/images/|googleapis\.com/compute/", re.I)


def providers_in_words(names: tuple[str, ...]) -> str:
    """("runpod", "vastai", "local") -> "RunPod, Vast.ai and the local market"."""
    words = [PROVIDER_WORDS.get(n, n) for n in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


CONTAINER_WORDS = providers_in_words(CONTAINER_IMAGE_PROVIDERS)
MACHINE_WORDS = providers_in_words(MACHINE_IMAGE_PROVIDERS)


def machine_image_provider(value: str) -> str | None:
    """The cloud a machine image belongs to by its form ("aws", "gcp"), or None when it has neither form."""
    if _AWS_RE.match(value):
        return "aws"
    if _GCP_RE.match(value):
        return "gcp"
    return None


def _kind_words(value: str) -> str | None:
    """What ``value`` looks like, in words, when it is a machine image."""
    if _AWS_LIKE.match(value):
        return "an AWS machine image (AMI)"
    if _GCP_LIKE.search(value):
        return "a Google Cloud machine image"
    return None


def check_container_image(value: str) -> str:
    """``value`` as a container image; a UsageError naming the providers otherwise (a machine
    image given here says which setting it belongs in)."""
    kind = _kind_words(value)
    if kind is not None:
        raise UsageError(f"setting container_image is the container image {CONTAINER_WORDS} start; "
                         f"{short_repr(value, MAX_IMAGE + 2)} is {kind}",
                         hint=f"set it as machine_image, the image {MACHINE_WORDS} boot")
    if len(value) > MAX_IMAGE or not _CONTAINER_RE.match(value):
        raise UsageError(f"setting container_image must be a container image such as nvcr.io/nvidia/pytorch:24.05-py3 "
                         f"(registry/path:tag, the path in lower case, at most {MAX_IMAGE} characters) for "
                         f"{CONTAINER_WORDS}, or \"\" for each provider's default, "
                         f"got {short_repr(value, MAX_IMAGE + 2)}")
    return value


def check_machine_image(value: str) -> str:
    """``value`` as a machine image of AWS or Google Cloud; a UsageError naming the providers
    otherwise (a container image given here says which setting it belongs in)."""
    if len(value) <= MAX_IMAGE and machine_image_provider(value) is not None:
        return value
    rule = (f"setting machine_image is the image {MACHINE_WORDS} boot: an AMI (ami-0123456789abcdef0, or "
            "resolve:ssm:/aws/service/...) for AWS, or a Google Cloud image or family "
            "(projects/PROJECT/global/images/family/FAMILY) for Google Cloud")
    if _kind_words(value) is None and _CONTAINER_RE.match(value):
        raise UsageError(f"{rule}; {short_repr(value, MAX_IMAGE + 2)} is a container image",
                         hint=f"set it as container_image, the image {CONTAINER_WORDS} start")
    raise UsageError(f"{rule}, or \"\" for each cloud's default; got {short_repr(value, MAX_IMAGE + 2)}")


def image_for(provider: str, container_image: str | None, machine_image: str | None) -> str | None:
    """The image a launch on ``provider`` is asked for: the container image where the provider starts
    containers, the machine image where it is that cloud's, else None (the provider's default)."""
    if provider in CONTAINER_IMAGE_PROVIDERS:
        return container_image
    if machine_image and provider in MACHINE_IMAGE_PROVIDERS and machine_image_provider(machine_image) == provider:
        return machine_image
    return None


def legacy_image(value: str) -> tuple[str, str]:
    """Where a value of the old single ``image`` setting belongs: ("machine_image" | "container_image", value)."""
    return ("machine_image", value) if machine_image_provider(value) else ("container_image", value)


__all__ = ["CONTAINER_IMAGE_PROVIDERS", "CONTAINER_WORDS", "MACHINE_IMAGE_PROVIDERS", "MACHINE_WORDS",
           "PROVIDER_WORDS", "check_container_image", "check_machine_image", "image_for", "legacy_image",
           "machine_image_provider", "providers_in_words"]
