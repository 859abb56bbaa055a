"""`hicache explain`: one request sent to a server, its tier split beside the prompt's expected keys.

First the live diff (read-only, commands/inspect/live_diff.py) of the prompt's expected objects
against the Mooncake master, then one `POST /generate` (SGLang's API, docs/serve-api.md) with
`return_cached_tokens_details`; the reply's `meta_info.cached_tokens_details` (device / host /
storage tokens) is put in pages and beside the diff, so a short L3 hit names the object that ended
the contiguous prefix. Sending the request changes the server's cache (it inserts the prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import Field

from hicache_ops.commands.inspect.key_listing import KeyReport, expected_keys
from hicache_ops.commands.inspect.live_diff import LiveDiff, live_diff
from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.results import Result
from hicache_ops.sglang.page_keys import Deployment


class TierSplit(Result):
    device: int = Field(description="Prompt tokens the server found in device memory (L1).")
    host: int = Field(description="Prompt tokens the server loaded from host memory (L2).")
    storage: int = Field(description="Prompt tokens the server loaded from storage (L3).")
    recomputed: int = Field(description="Prompt tokens of whole pages found in no tier, so prefilled.")


class ExplainResult(Result):
    server: str = Field(description="The server the request went to.")
    master: str = Field(description="The Mooncake master of the live diff (HOST:METRICS_PORT).")
    sglang_version: str = Field(description="The key scheme applied (the server's SGLang release).")
    page_size: int = Field(description="Tokens per page, from the server's /server_info.")
    key_prefix: str = Field(description="The prefix of the prompt's object keys.")
    prompt_tokens: int = Field(description="Tokens in the prompt.")
    pages: int = Field(description="Whole pages of the prompt (the storage path writes no partial page).")
    tokens: TierSplit = Field(description="The reply's cached_tokens_details, in tokens.")
    page_split: TierSplit = Field(description="The same split in pages (tokens // page size).")
    l3_contiguous_pages: int = Field(
        description="Leading pages whose objects the master held before the request (SGLang's batch_exists)."
    )
    present_objects: int = Field(description="Expected objects the master held before the request.")
    expected_objects: int = Field(description="Objects SGLang derives for the prompt's whole pages.")
    first_missing: str | None = Field(description="The object that ends the L3 prefix; null when all exist.")
    first_missing_page: int | None = Field(description="The page of first_missing; null when all exist.")
    diagnosis: list[dict[str, Any]] = Field(description="The live diff's diagnosis entries (kind, message, hint).")
    summary: str = Field(description="One sentence: the split and why pages were recomputed.")
    meta_info: dict[str, Any] = Field(description="The server's meta_info for the request, as it sent it.")


def send_generate(
    url: str, tokens: Sequence[int], *, extra_key: str | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """One `POST /generate` of `tokens` (one new token) asking for the cached tokens' tier split."""
    body: dict[str, Any] = {
        "input_ids": list(tokens),
        "sampling_params": {"max_new_tokens": 1},
        "return_cached_tokens_details": True,
    }
    if extra_key is not None:
        body["extra_key"] = extra_key
    try:
        reply = httpx.post(url.rstrip("/") + "/generate", json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise UnreachableError(
            f"the server at {url} did not answer POST /generate within {timeout:g} s: {exc}."
        ) from None
    if reply.status_code >= 400:
        raise InputError(f"the server at {url} refused the request ({reply.status_code}): {reply.text[:300]}")
    try:
        meta = reply.json()["meta_info"]
    except (ValueError, KeyError, TypeError):
        raise InputError(f"the server at {url} answered /generate without a meta_info: {reply.text[:200]}") from None
    return meta


def _suffix(report: KeyReport, key: str, page: int) -> str:
    head = report.key_prefix + report.pages[page].page_key
    return key[len(head) :] if key.startswith(head) else key


def summarise(report: KeyReport, diff: LiveDiff, split: TierSplit) -> tuple[str, int | None]:
    """The one-sentence explanation and the page of the first missing object."""
    pages = len(report.pages)
    text = (
        f"{pages} pages: {split.device} from device, {split.host} from host, "
        f"{split.storage} from L3, {split.recomputed} recomputed"
    )
    missing_page = None
    if diff.first_missing is not None:
        missing_page = next(
            (i for i, row in enumerate(report.pages) if diff.first_missing in row.object_keys), diff.contiguous_pages
        )
    if split.recomputed == 0:
        return text + ".", missing_page
    cached = split.device + split.host + split.storage
    if missing_page is not None and missing_page == cached:
        assert diff.first_missing is not None
        suffix = _suffix(report, diff.first_missing, missing_page)
        return text + f" because page {missing_page}'s `{suffix}` is missing.", missing_page
    if cached < diff.contiguous_pages:
        return (
            text + f": L3 held {diff.contiguous_pages} leading pages before the request, the server loaded "
            f"{cached} (prefetch cut short or below its threshold: hicache playbook run short-storage-hit).",
            missing_page,
        )
    return text + ".", missing_page


def explain(
    tokens: Sequence[int],
    page_size: int,
    deployment: Deployment,
    url: str,
    admin: AdminClient,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    timeout: float = 30.0,
) -> ExplainResult:
    """The live diff of `tokens` at `admin`, then one request to the server at `url`, explained."""
    report = expected_keys(tokens, page_size, deployment, extra_key=extra_key, cache_salt=cache_salt)
    if not report.pages:
        raise InputError(f"the prompt has {len(tokens)} tokens, less than one page of {page_size}: nothing to explain.")
    diff = live_diff(tokens, page_size, deployment, admin, extra_key=extra_key, cache_salt=cache_salt, report=report)
    meta = send_generate(url, tokens, extra_key=extra_key, timeout=timeout)
    details = meta.get("cached_tokens_details") or {}
    device, host, storage = (int(details.get(k) or 0) for k in ("device", "host", "storage"))
    whole = len(report.pages) * page_size
    tokens_split = TierSplit(
        device=device, host=host, storage=storage, recomputed=max(0, whole - device - host - storage)
    )
    pages = len(report.pages)
    page_split = TierSplit(
        device=device // page_size, host=host // page_size, storage=storage // page_size, recomputed=0
    )
    page_split.recomputed = max(0, pages - page_split.device - page_split.host - page_split.storage)
    summary, missing_page = summarise(report, diff, page_split)
    return ExplainResult(
        server=url,
        master=diff.master,
        sglang_version=report.sglang_version,
        page_size=page_size,
        key_prefix=report.key_prefix,
        prompt_tokens=len(tokens),
        pages=pages,
        tokens=tokens_split,
        page_split=page_split,
        l3_contiguous_pages=diff.contiguous_pages,
        present_objects=sum(sum(p) for p in diff.present),
        expected_objects=len(report.object_keys),
        first_missing=diff.first_missing,
        first_missing_page=missing_page,
        diagnosis=diff.diagnosis,
        summary=summary,
        meta_info=meta,
    )
