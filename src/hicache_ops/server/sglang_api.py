"""SGLang's HTTP API on `hicache serve`, as far as the cache is concerned (docs/serve-api.md).

`POST /generate` takes SGLang's request fields that matter to the cache (`input_ids` or `text`,
`sampling_params.max_new_tokens`, `extra_key`, `stream`) and answers in SGLang's shape per
`--sglang-version`: `text`, `output_ids`, `meta_info` with the prompt's cached tokens by tier.
The prompt goes through the tiered cache like a real request: matched, loaded back, prefetched
from L3, computed; the output tokens are deterministic filler whose KV is kept as SGLang keeps a
finished request's (docs/controller.md#finished-requests). The info routes (`/server_info`,
`/model_info`, 0.5.23's `/get_hicache_l3_cache_layout`) describe the serve in the fields the
toolkit's `--sglang-url` reads (src/hicache_ops/sglang/server_info.py).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from hicache_ops.errors import InputError
from hicache_ops.sglang.versions import V0_5_23

if TYPE_CHECKING:
    from hicache_ops.server.runtime import Runtime

# What SGLang's output streamer names the Mooncake backend in cached_tokens_details (its class name).
STORAGE_BACKEND_NAME = "MooncakeStore"
# docs/side-pools.md#l3-layout-endpoint: why 0.5.23 disables the layout for an MHA model.
MHA_LAYOUT_REASON = "External L3 lookup requires rank-replicated/MLA pools"
# The filler vocabulary without a tokenizer (docs/serve-api.md#output-tokens).
FILLER_VOCAB = 32000


class SamplingParams(BaseModel, extra="allow"):
    max_new_tokens: int = Field(128, ge=0, description="Output tokens to generate (SGLang's default 128).")


class GenerateRequest(BaseModel, extra="allow"):
    """The fields of SGLang's GenerateReqInput the serve acts on; the others are accepted and ignored."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    rid: str | None = None
    extra_key: str | None = None
    return_cached_tokens_details: bool = False  # /generate reports the details always, as SGLang's does


def parse_generate(body: bytes) -> GenerateRequest:
    """A /generate body: JSON whatever the content type, checked field by field (InputError, 400)."""
    from pydantic import ValidationError

    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise InputError("the body is not JSON.", hint='Send JSON such as {"input_ids": [1, 2, 3]}.') from None
    if not isinstance(data, dict):
        raise InputError("the body is not a JSON object.", hint='Send JSON such as {"input_ids": [1, 2, 3]}.')
    try:
        return GenerateRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise InputError(f"{where}: {first.get('msg', 'invalid')}.") from None


def load_tokenizer(path: str):
    """A local Hugging Face tokenizer folder (tokenizer.json): hicache_ops/tokens.py's Tokenizer."""
    from hicache_ops.tokens import Tokenizer

    return Tokenizer(path)


def filler_ids(prompt: list[int], n: int, vocab: int) -> list[int]:
    """The n output tokens of a prompt: deterministic, so the same prompt gets the same answer."""
    seed = (sum(prompt) + len(prompt)) % vocab
    return [(seed + 7 * i + 1) % vocab for i in range(n)]


def cached_details(result, l3: bool) -> dict | None:
    """The prompt's cached tokens by tier, shaped as SGLang's output streamer shapes them (both versions):
    None without a hit; device and host always; storage and the backend's name when an L3 is on."""
    if result.cached == 0:
        return None
    details: dict[str, Any] = {"device": result.device_hit, "host": result.host_hit}
    if l3 or result.storage_hit > 0:
        details["storage"] = result.storage_hit
    if l3:
        details["storage_backend"] = STORAGE_BACKEND_NAME
    return details


class Generation:
    """One /generate request served: the cache's result, then SGLang's reply (or its stream)."""

    def __init__(self, runtime: Runtime, req: GenerateRequest):
        if (req.text is None) == (req.input_ids is None):
            raise InputError("send exactly one of text and input_ids.", hint='For example {"input_ids": [1, 2, 3]}.')
        tokenizer = runtime.tokenizer
        if req.text is not None:
            if tokenizer is None:
                raise InputError(
                    "this serve has no tokenizer, so it takes input_ids, not text.",
                    hint="Send input_ids, or start the serve with --tokenizer PATH.",
                )
            prompt = tokenizer.encode(req.text)
        else:
            assert req.input_ids is not None  # exactly one of text and input_ids, checked above
            prompt = list(req.input_ids)
        n = req.sampling_params.max_new_tokens
        vocab = tokenizer.vocab_size if tokenizer is not None else FILLER_VOCAB
        self.runtime, self.req = runtime, req
        self.rid = req.rid or uuid.uuid4().hex
        self.version = runtime.spec.sglang_version
        self.output = filler_ids(prompt, n, vocab)
        cache = runtime.cache
        assert cache is not None, "a serve answers /generate only once its cache is built"
        # A request that generates nothing is a prefill only; otherwise the whole request, whose
        # finish inserts the prompt and all output tokens but the last.
        if n == 0:
            self.result = cache.prefill(prompt, req.extra_key)
        else:
            self.result = cache.request(prompt, self.output, req.extra_key)
        self.details = cached_details(self.result, runtime.store is not None)
        runtime.api_counters.record(
            req.stream, len(prompt), n, self.details, self.result.stored_pages * runtime.spec.page_size
        )

    def _text(self, ids: list[int]) -> str:
        tokenizer = self.runtime.tokenizer
        if tokenizer is not None:
            return tokenizer.decode(ids)
        return "".join(f" t{t}" for t in ids)

    def meta_info(self, completion: int, finished: bool) -> dict:
        r = self.result
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": completion} if finished else None,
            "prompt_tokens": r.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if self.version == V0_5_23:
            meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = completion
        meta["cached_tokens"] = r.cached
        if self.details is not None:
            meta["cached_tokens_details"] = self.details
        return meta

    def reply(self, completion: int | None = None, finished: bool = True) -> dict:
        completion = len(self.output) if completion is None else completion
        ids = self.output[:completion]
        return {"text": self._text(ids), "output_ids": ids, "meta_info": self.meta_info(completion, finished)}

    def stream(self):
        """SSE as SGLang streams by default (cumulative chunks, one per token), then [DONE]."""
        n = len(self.output)
        for k in range(1, n + 1):
            yield b"data: " + json.dumps(self.reply(k, finished=k == n)).encode() + b"\n\n"
        if n == 0:
            yield b"data: " + json.dumps(self.reply(0)).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


# -- info routes ---------------------------------------------------------------------------------


def server_info_body(runtime: Runtime) -> dict:
    """The serve's /server_info: SGLang's field names for the arguments the toolkit reads
    (docs/server-info.md), with the values this serve runs with."""
    info = runtime.describe()
    spec = runtime.spec
    mooncake = runtime.store is not None
    extra: dict[str, Any] = {
        "prefetch_threshold": info["prefetch_threshold"],
        "prefetch_timeout_base": info["timeout_budget"]["base"],
        "prefetch_timeout_per_ki_token": info["timeout_budget"]["per_ki_token"],
    }
    extra = {name: value for name, value in extra.items() if value is not None}
    if spec.extra_backend_tag is not None:
        extra["extra_backend_tag"] = spec.extra_backend_tag
    if spec.tp_lcm_size is not None:
        extra["tp_lcm_size"] = spec.tp_lcm_size
    body: dict[str, Any] = {
        "model_path": spec.model_name,
        "served_model_name": spec.model_name,
        "tokenizer_path": runtime.tokenizer_path,
        "page_size": spec.page_size // spec.dcp_size,
        "tp_size": spec.tp_size,
        "pp_size": 1,
        "dp_size": 1,
        "enable_dp_attention": False,
        "enable_hierarchical_cache": True,
        "hicache_ratio": spec.hicache_ratio,
        "hicache_size": int(spec.hicache_size_gb),
        "hicache_mem_layout": info["host_layout"],
        "hicache_io_backend": spec.io_backend,
        "hicache_write_policy": info["write_policy"],
        "hicache_storage_prefetch_policy": info["stop_policy"],
        "hicache_storage_backend": "mooncake" if mooncake else None,
        "hicache_storage_backend_extra_config": json.dumps(extra) if mooncake else None,
        "enable_metrics": True,
        "max_total_num_tokens": info["device_pages"] * spec.page_size,
        # SGLang refuses a prompt of this many tokens or more; the serve's prefill fits its device pool.
        "max_req_input_len": info["device_pages"] * spec.page_size,
        "status": "ready",
        "internal_states": [{}],
        "version": runtime.spec.sglang_version,
    }
    if runtime.spec.sglang_version == V0_5_23:
        body.update({"dcp_size": spec.dcp_size, "attn_dp_size": 1, "attn_cp_size": 1})
    return body


def model_info_body(runtime: Runtime) -> dict:
    spec = runtime.spec
    return {
        "model_path": spec.model_name,
        "served_model_name": spec.model_name,
        "tokenizer_path": runtime.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }


def models_body(runtime: Runtime) -> dict:
    """The OpenAI-style model list SGLang serves on /v1/models: the served model only."""
    import time

    name = runtime.spec.model_name
    card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": None}  # fmt: skip
    return {"object": "list", "data": [card]}


def l3_layout_body(runtime: Runtime) -> dict:
    """0.5.23's /get_hicache_l3_cache_layout for this serve (docs/side-pools.md#l3-layout-endpoint)."""
    spec = runtime.spec
    page_size = spec.page_size // spec.dcp_size
    if runtime.store is None:
        return {
            "enabled": False,
            "backend": None,
            "page_size": page_size,
            "hicache_object_layout": {"pools": []},
            "reason": "HiCache storage is not enabled",
        }
    scheme = spec.schemes()[0]
    inner: dict[str, Any] = {
        "pools": [],
        "key_prefix": scheme.prefix.rstrip("_") or None,
        "is_mla_backend": spec.geometry.mla,
        "pp_rank": 0,
        "pp_size": 1,
    }
    body: dict[str, Any] = {"enabled": spec.geometry.mla, "backend": "mooncake", "page_size": page_size}
    if not spec.geometry.mla:
        return {**body, "hicache_object_layout": inner, "reason": MHA_LAYOUT_REASON}
    inner["pools"].append({"pool": "kv", "suffixes": list(scheme.suffixes), "hit_policy": "all_pages"})
    suffixes = spec.side_pool_suffixes(scheme)
    for pool in spec.side_pools:
        entry: dict[str, Any] = {"pool": pool.name, "suffixes": suffixes[pool.name], "hit_policy": pool.hit_policy}
        if pool.hit_policy == "trailing_pages":
            entry["trailing_pages"] = pool.trailing_pages
        inner["pools"].append(entry)
    return {**body, "hicache_object_layout": inner}
