"""image: pictures from a prompt, each kept as an artifact with its size and sha256.

Providers are tried in `CLAWQ_IMAGE_PROVIDERS` order: `openai` (`CLAWQ_IMAGE_MODEL`,
gpt-image-1, at `CLAWQ_OPENAI_BASE_URL` with `CLAWQ_OPENAI_API_KEY`) or the name of an
OpenAI-compatible endpoint in `CLAWQ_IMAGE_ENDPOINTS` (its key from the environment
variable it names). One that is not configured, fails, or is over its daily quota is
skipped for the next. A content-policy refusal is not: the next provider would be asked
the same thing, so the model is told it was refused and why. Answers come as `b64_json` or
as URLs, fetched through the egress client; every image is opened with Pillow, so only
real PNG, JPEG or WebP pictures become artifacts.

Permission "allow": a call only makes artifacts in the cluster; what it can spend is
bounded by `CLAWQ_IMAGE_MAX_N` a call and `CLAWQ_MEDIA_QUOTA_PER_DAY` a day (a rule
`ask: ["image"]` makes every call wait for a person instead).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from broker.config.settings import Settings
from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.media.providers import (
    ProviderError,
    Refused,
    check,
    send,
    take_quota,
    vendor_error,
)

if TYPE_CHECKING:
    from workers.egress.client import Fetched

MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
REFUSAL_CODES = ("content_policy_violation", "moderation_blocked")
REFUSAL_TYPES = ("image_generation_user_error",)


class ImageInput(ToolInput):
    prompt: str = Field(min_length=1, max_length=32_000, description="what to draw")
    size: Literal["auto", "1024x1024", "1536x1024", "1024x1536"] = Field(
        "auto", description="width x height: square, landscape, portrait, or auto"
    )
    quality: Literal["auto", "low", "medium", "high"] = "auto"
    n: int = Field(1, ge=1, le=10, description="how many images (at most 4 by default)")


@dataclass
class Endpoint:
    name: str
    base_url: str
    api_key: str
    model: str


def endpoint(settings: Settings, name: str) -> Endpoint:
    """Where provider `name` is, or a `ProviderError` saying why it cannot be used."""
    if name == "openai":
        if not settings.openai_api_key:
            raise ProviderError("not configured (CLAWQ_OPENAI_API_KEY is empty)")
        return Endpoint(
            name, settings.openai_base_url, settings.openai_api_key, settings.image_model
        )
    found = settings.image_endpoints.get(name)
    if found is None:
        raise ProviderError("not configured (no such entry in CLAWQ_IMAGE_ENDPOINTS)")
    key = os.environ.get(found.api_key_env, "") if found.api_key_env else ""
    if found.api_key_env and not key:
        raise ProviderError(
            f"not configured (the environment variable {found.api_key_env} is empty)"
        )
    return Endpoint(name, found.base_url, key, found.model)


def refusal(fetched: Fetched) -> str | None:
    """The provider's message when it refused the prompt on content grounds."""
    if fetched.status != 400:
        return None
    message, kind, code = vendor_error(fetched.body)
    if code in REFUSAL_CODES or kind in REFUSAL_TYPES:
        return message or "no reason given"
    return None


def picture(data: bytes) -> tuple[str, int, int]:
    """(mime, width, height) of an image, or a `ProviderError` when it is none."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            kind, (width, height) = str(image.format), image.size
            image.verify()
    except Exception:  # Pillow raises several kinds for what is not a (whole) image
        raise ProviderError("an answer is not a readable image") from None
    if kind not in MIMES:
        raise ProviderError(f"an answer is a {kind} image, not PNG, JPEG or WebP")
    return MIMES[kind], width, height


def _images(ctx: ToolContext, at: Endpoint, args: ImageInput) -> tuple[list[bytes], str]:
    """The images one provider made, and its revised prompt if it gave one."""
    s = ctx.settings
    take_quota(ctx, at.name)
    headers = {"Authorization": f"Bearer {at.api_key}"} if at.api_key else {}
    fetched = send(
        ctx,
        "POST",
        f"{at.base_url.rstrip('/')}/images/generations",
        headers=headers,
        json_body={
            "model": at.model,
            "prompt": args.prompt,
            "size": args.size,
            "quality": args.quality,
            "n": args.n,
        },
        timeout_s=s.image_timeout_s,
        max_bytes=2 * s.artifact_max_bytes,  # base64 is 4/3 of the bytes, for every image
    )
    if why := refusal(fetched):
        raise Refused(why)
    try:
        items = json.loads(check(fetched).body).get("data")
    except (ValueError, AttributeError):
        raise ProviderError("the answer is not the images API's JSON") from None
    if not isinstance(items, list) or not items:
        raise ProviderError("the answer has no images")
    images, revised = [], ""
    for item in items[: args.n]:
        if not isinstance(item, dict):
            raise ProviderError("the answer is not the images API's JSON")
        revised = revised or str(item.get("revised_prompt") or "")
        if item.get("b64_json"):
            try:
                images.append(base64.b64decode(item["b64_json"], validate=True))
            except (binascii.Error, ValueError, TypeError):
                raise ProviderError("an image's b64_json is not base64") from None
        elif item.get("url"):
            got = send(
                ctx,
                "GET",
                str(item["url"]),
                timeout_s=s.image_timeout_s,
                max_bytes=s.artifact_max_bytes,
            )
            images.append(check(got).body)
        else:
            raise ProviderError("an image has neither b64_json nor url")
    return images, revised


class ImageTool(Tool[ImageInput]):
    name = "image"
    description = (
        "Generate images from a text prompt. Returns one artifact per image with its size "
        "and sha256. size: 1024x1024, 1536x1024 (landscape), 1024x1536 (portrait) or auto; "
        "quality: low, medium, high or auto; n: how many."
    )
    group = Group.media
    input_model = ImageInput
    side_effect = SideEffect.idempotent
    default_permission = "allow"
    timeout_s = 150.0

    def summary(self, args: ImageInput) -> str:
        return f"image({args.prompt[:60]})"

    def concurrency_safe(self, args: ImageInput) -> bool:
        return True

    def timeout(self, args: ImageInput, settings: Settings) -> float:
        """A generation and its URL fetches per provider that may be tried."""
        providers = max(len(settings.image_providers), 1)
        return min(30.0 + 2 * settings.image_timeout_s * providers, 1800)

    def run(self, args: ImageInput, ctx: ToolContext) -> ToolResult:
        settings = ctx.settings
        if args.n > settings.image_max_n:
            raise ToolError(f"n is {args.n}; at most {settings.image_max_n} images a call")
        reasons: list[str] = []
        for name in settings.image_providers:
            try:
                at = endpoint(settings, name)
                images, revised = _images(ctx, at, args)
                shapes = [picture(data) for data in images]
            except Refused as exc:
                return ToolResult.error(
                    f"refused by the provider's content policy: {exc}", provider=name
                )
            except ProviderError as exc:
                reasons.append(f"{name}: {exc}")
                continue
            return _result(ctx, at, images, shapes, revised, reasons)
        none = "no provider is configured (CLAWQ_IMAGE_PROVIDERS)"
        return ToolResult.error("image failed: " + ("; ".join(reasons) or none))


def _result(
    ctx: ToolContext,
    at: Endpoint,
    images: list[bytes],
    shapes: list[tuple[str, int, int]],
    revised: str,
    reasons: list[str],
) -> ToolResult:
    stored = [
        ctx.keep_artifact(data, mime, f"image-{n}.{mime.split('/')[1]}", width=w, height=h)
        for n, (data, (mime, w, h)) in enumerate(zip(images, shapes, strict=True), 1)
    ]
    count = len(stored)
    lines = [f"{count} image{'s' if count != 1 else ''} by {at.name} ({at.model}):"]
    lines += [f"{n}. {a.describe()} sha256 {a.hash}" for n, a in enumerate(stored, 1)]
    if revised:
        lines.append(f"revised prompt: {revised}")
    if reasons:
        lines.append("[note: skipped before it: " + "; ".join(reasons) + "]")
    return ToolResult(
        for_llm="\n".join(lines),
        for_user=f"{count} image{'s' if count != 1 else ''} ({at.name})",
        metadata={
            "provider": at.name,
            "model": at.model,
            "artifacts": [
                {"id": a.id, "sha256": a.hash, "mime": a.mime, "width": a.width, "height": a.height}
                for a in stored
            ],
            "skipped": reasons,
        },
    )


TOOLS: list[type[Tool[Any]]] = [ImageTool]
