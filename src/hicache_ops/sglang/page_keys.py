"""Page keys and Mooncake object keys exactly as SGLang computes them (docs/keys.md).

A page key identifies one page of tokens in L3: SHA-256 over the previous page's raw digest
(absent for the first page, or the 0.5.23 namespace seed) and the page's tokens as 4-byte
little-endian unsigned ints. Each page key fans out into one or more Mooncake object keys
depending on the attention kind (MHA/MLA), the tp/pp rank, split heads and the key prefix.

Every function takes the SGLang version explicitly: the rules differ between 0.5.14 and 0.5.23.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError, SettingError
from hicache_ops.sglang.versions import V0_5_14, family, since, validate_version

if TYPE_CHECKING:  # numpy loads on first use, so `hicache --help` does not import it
    import numpy as np

try:  # the native loop; keys are identical without it, only slower
    from hicache_ops.sglang import _pagehash
except ImportError:  # pragma: no cover - exercised where OpenSSL headers were missing at build
    _pagehash = None  # type: ignore[assignment]  # the module is optional: None means the Python loop

NAMESPACE_DOMAIN = b"sglang-cache-namespace-v1"
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1
# 0.5.23 marks a page holding a token id above uint32 with this byte before 8-byte tokens.
WIDE_PAGE_TAG = b"\xff"
# SGLang's warm-up objects, one per client start: `sglang_mooncake_store_warmup_key<uuid hex>`.
WARMUP_KEY_PREFIX = "sglang_mooncake_store_warmup_key"
# Rules keyed by release (docs/releases.md):
# - the model name joins the object key prefix: mem_cache/storage/mooncake_store/mooncake_store.py
MODEL_PREFIX_SINCE = "0.5.17"
# - extra_key / cache_salt seed the storage chain: mem_cache/utils.py storage_namespace_seed
NAMESPACE_SEED_SINCE = "0.5.20"
# - token ids above uint32 hash in the tagged 8-byte form (earlier: array("I") raises):
#   mem_cache/cpp_utils/native_hash.py + hash_binding.cpp
WIDE_TOKENS_SINCE = "0.5.23"
# - DCP storage keys (topology prefix part, shard objects): mooncake_store.py
DCP_KEYS_SINCE = "0.5.23"


def model_in_prefix(version: str) -> bool:
    return since(validate_version(version), MODEL_PREFIX_SINCE)


def seeds_namespace(version: str) -> bool:
    return since(validate_version(version), NAMESPACE_SEED_SINCE)


def hashes_wide_tokens(version: str) -> bool:
    return since(validate_version(version), WIDE_TOKENS_SINCE)


# The last prefix part of a 0.5.23 DCP deployment (docs/keys.md#dcp).
_DCP_PREFIX_PART = re.compile(r"(?:^|_)tp(\d+)_dcp(\d+)_page(\d+)_pp(\d+)_cp(\d+)_$")


def dcp_prefix_part(tp_size: int, dcp_size: int, page_size: int, pp_size: int, attn_cp_size: int) -> str:
    """The topology part 0.5.23 appends to the key prefix when dcp_size > 1."""
    return f"tp{tp_size}_dcp{dcp_size}_page{page_size}_pp{pp_size}_cp{attn_cp_size}"


def dcp_topology(prefix: str) -> dict[str, Any] | None:
    """The DCP topology a key prefix names (tp/dcp/page/pp/cp sizes), or None for a non-DCP prefix."""
    match = _DCP_PREFIX_PART.search(prefix)
    if match is None:
        return None
    tp, dcp, page, pp, cp = (int(g) for g in match.groups())
    return {"tp_size": tp, "dcp_size": dcp, "page_size": page, "pp_size": pp, "attn_cp_size": cp}


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------


def _first_bad_token(items: Sequence[object]) -> InputError:
    """The InputError for the first element that is not a valid token id."""
    import numpy as np

    for i, t in enumerate(items):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            return InputError(f"token {i} is {t!r}, not an integer token id.")
        if t < 0:
            return InputError(f"token {i} is {t}, negative; token ids are >= 0.")
        if t > INT64_MAX:
            return InputError(f"token {i} is {t}, above 2**63-1; SGLang cannot hash it.")
    return InputError("token ids must be a flat list of integers.")


def as_token_array(tokens: Sequence[int] | np.ndarray, version: str) -> np.ndarray:
    """Validate token ids for `version`; return them as a 1-D integer array (no copy if possible).

    SGLang rejects negative ids in both versions; 0.5.14 packs every id into 4 bytes so it
    cannot hash ids above 2**32-1; 0.5.23 hashes such pages in a wide form up to 2**63-1.
    """
    import numpy as np

    validate_version(version)
    if isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.dtype.kind not in "iu":
            raise InputError(f"token ids must be integers, got an array of {arr.dtype}.")
        arr = arr.reshape(-1)
    else:
        items = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
        if len(items) == 0:
            return np.empty(0, dtype=np.int64)
        try:
            arr = np.asarray(items)
        except (ValueError, TypeError, OverflowError):
            raise _first_bad_token(items) from None
        # Floats, strings, bools, nested lists and ids past uint64 all land outside "iu".
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            raise _first_bad_token(items)
    if arr.size == 0:
        return arr
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        at = int(np.argmax(arr < 0))
        raise InputError(f"token {at} is {int(arr[at])}, negative; token ids are >= 0.")
    top = int(arr.max())
    if top > INT64_MAX:
        at = int(np.argmax(arr > INT64_MAX))
        raise InputError(f"token {at} is {int(arr[at])}, above 2**63-1; SGLang cannot hash it.")
    if not hashes_wide_tokens(version) and top > UINT32_MAX:
        at = int(np.argmax(arr > UINT32_MAX))
        raise InputError(
            f"token {at} is {int(arr[at])}, above 2**32-1; SGLang {version} cannot hash it.",
            hint=f"Token ids above uint32 are hashed only since SGLang {WIDE_TOKENS_SINCE} (wide pages).",
        )
    return arr


# ---------------------------------------------------------------------------------------------
# Page keys
# ---------------------------------------------------------------------------------------------


def normalise_namespace(version: str, extra_key: str | None, cache_salt: str | None) -> tuple[str | None, str | None]:
    """The (extra_key, cache_salt) pair SGLang hashes: 0.5.23 turns cache_salt "" into None.

    extra_key "" is kept as is (it gives a different seed than None). 0.5.14 ignores both, but
    the pair is still returned normalised so callers can report what they were given.
    """
    validate_version(version)
    if cache_salt == "":
        cache_salt = None
    return extra_key, cache_salt


def namespace_seed(version: str, extra_key: str | None, cache_salt: str | None) -> str | None:
    """The hex digest the 0.5.23 storage chain starts from, or None when there is no seed.

    0.5.14 never seeds: tenants with the same tokens share L3 keys there.
    """
    extra_key, cache_salt = normalise_namespace(version, extra_key, cache_salt)
    if not seeds_namespace(version) or (extra_key is None and cache_salt is None):
        return None
    digest = hashlib.sha256(NAMESPACE_DOMAIN)
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
        else:
            encoded = part.encode("utf-8")
            digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def hash_page(tokens: np.ndarray, prior_hex: str | None, version: str) -> str:
    """The key of one page (any length) after `prior_hex`; `tokens` as from as_token_array."""
    digest = hashlib.sha256(bytes.fromhex(prior_hex) if prior_hex else b"")
    if hashes_wide_tokens(version) and tokens.size and int(tokens.max()) > UINT32_MAX:
        digest.update(WIDE_PAGE_TAG + tokens.astype("<u8").tobytes())
    else:
        digest.update(tokens.astype("<u4").tobytes())
    return digest.hexdigest()


def _chain_python(tokens: np.ndarray, page_size: int, prior: bytes | None) -> list[str]:
    keys = []
    view = memoryview(tokens.astype("<u4").tobytes())
    page_bytes = page_size * 4
    prior = prior or b""
    sha256 = hashlib.sha256
    for start in range(0, len(view), page_bytes):
        prior = sha256(prior + view[start : start + page_bytes]).digest()
        keys.append(prior.hex())
    return keys


def _chain(tokens: np.ndarray, page_size: int, prior_hex: str | None) -> list[str]:
    """Keys of whole pages of uint32-range tokens, chained after `prior_hex`."""
    import numpy as np

    prior = bytes.fromhex(prior_hex) if prior_hex else None
    if _pagehash is not None:
        return _pagehash.chain(np.ascontiguousarray(tokens), page_size, prior)
    return _chain_python(tokens, page_size, prior)


def chain_keys(tokens: np.ndarray, page_size: int, prior: str | None) -> list[str]:
    """What page_keys gives with no namespace (or continuing after the key `prior`), without its
    checks: for a 1-D array of ids in 0..2**32-1 (uint32, say), whole pages only (its length a
    multiple of `page_size`). The caller vouches for the tokens (bench replay's block table)."""
    return _chain(tokens, page_size, prior)


def native_available() -> bool:
    """Whether the native hash loop was built (keys are the same either way)."""
    return _pagehash is not None


def page_keys(
    tokens: Sequence[int] | np.ndarray,
    page_size: int,
    version: str,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    include_partial: bool = False,
    prior: str | None = None,
) -> list[str]:
    """The page keys of a prompt.

    The storage path (the default) hashes whole pages only; `include_partial=True` also hashes
    the trailing partial page, as the radix tree does. The 0.5.23 chain starts from the
    namespace seed of (extra_key, cache_salt); 0.5.14 ignores both. `prior`, the key of the page
    before `tokens`, continues a chain instead (the namespace is then already in it).
    """
    import numpy as np

    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise InputError(f"page size {page_size!r} is not a positive integer.")
    if prior is None:
        prior = namespace_seed(version, extra_key, cache_salt)
    if _pagehash is not None and isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind in "iu":
        # Hot path: the native loop validates as it packs (0..2**32-1); anything else, such as a
        # negative or wide id, raises OverflowError and takes the validating path below.
        n_full = tokens.size // page_size
        try:
            keys = _chain(tokens[: n_full * page_size], page_size, prior)
        except OverflowError:
            pass
        else:
            if include_partial and tokens.size > n_full * page_size:
                tail = as_token_array(tokens[n_full * page_size :], version)
                keys.append(hash_page(tail, keys[-1] if keys else prior, version))
            return keys
    arr = as_token_array(tokens, version)
    n_full = arr.size // page_size
    full = arr[: n_full * page_size]

    keys = []
    if n_full:
        wide_pages: list[int] = []
        if hashes_wide_tokens(version) and int(full.max()) > UINT32_MAX:
            wide_pages = np.flatnonzero((full.reshape(n_full, page_size) > UINT32_MAX).any(axis=1)).tolist()
        # Runs of ordinary pages go through the fast chain; a wide page breaks the run.
        start_page = 0
        for wide in [*wide_pages, n_full]:
            if wide > start_page:
                keys.extend(_chain(full[start_page * page_size : wide * page_size], page_size, prior))
                prior = keys[-1]
            if wide < n_full:
                keys.append(hash_page(full[wide * page_size : (wide + 1) * page_size], prior, version))
                prior = keys[-1]
            start_page = wide + 1
    if include_partial and arr.size > n_full * page_size:
        keys.append(hash_page(arr[n_full * page_size :], prior, version))
    return keys


# ---------------------------------------------------------------------------------------------
# Object keys
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectKeyScheme:
    """How one rank of a deployment names the Mooncake objects of a page (docs/keys.md#object-keys).

    `tp_rank` is the attention-TP rank. `layout` matters only through split heads: MHA with the
    `page_head` host layout and `tp_lcm_size > tp_size` writes one K/V pair per target rank.
    `dcp_size` > 1 (0.5.23, MLA only) is decode context parallel (docs/keys.md#dcp): the prefix
    names the topology, including the logical `page_size`, and the MLA object names the rank's
    DCP shard (`tp_rank % dcp_size`) and attention-CP rank.
    """

    version: str
    model_name: str | None = None
    extra_backend_tag: str | None = None
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    mla: bool = False
    layout: str = "page_first"
    tp_lcm_size: int | None = None
    dcp_size: int = 1
    page_size: int | None = None
    attn_cp_size: int = 1
    attn_cp_rank: int = 0

    def __post_init__(self) -> None:
        validate_version(self.version)
        for name in ("tp_size", "pp_size", "dcp_size", "attn_cp_size"):
            if getattr(self, name) < 1:
                raise InputError(f"{name.replace('_', '-')} {getattr(self, name)} must be >= 1.")
        if not 0 <= self.tp_rank < self.tp_size:
            raise InputError(f"tp-rank {self.tp_rank} is outside 0..{self.tp_size - 1} for tp-size {self.tp_size}.")
        if not 0 <= self.pp_rank < self.pp_size:
            raise InputError(f"pp-rank {self.pp_rank} is outside 0..{self.pp_size - 1} for pp-size {self.pp_size}.")
        if self.tp_lcm_size is not None:
            if self.tp_lcm_size < 1 or self.tp_lcm_size % self.tp_size:
                raise InputError(
                    f"tp-lcm-size {self.tp_lcm_size} is not a positive multiple of tp-size {self.tp_size}.",
                    hint="SGLang requires tp_lcm_size % tp_size == 0.",
                )
        if not 0 <= self.attn_cp_rank < self.attn_cp_size:
            raise InputError(
                f"attn-cp-rank {self.attn_cp_rank} is outside 0..{self.attn_cp_size - 1} "
                f"for attn-cp-size {self.attn_cp_size}."
            )
        if self.dcp_size > 1:
            check_dcp(self.version, self.mla, self.tp_size, self.dcp_size, self.page_size)

    @property
    def dcp_rank(self) -> int:
        """The rank's DCP shard: SGLang requires contiguous DCP groups, so tp_rank % dcp_size."""
        return self.tp_rank % self.dcp_size

    @property
    def split_heads(self) -> bool:
        """SGLang's should_split_heads: MHA, page_head layout, tp_lcm_size > tp_size."""
        return (
            not self.mla
            and self.layout == "page_head"
            and self.tp_lcm_size is not None
            and self.tp_lcm_size > self.tp_size
        )

    @property
    def writes(self) -> bool:
        """Whether this rank writes to L3 at all (docs/keys.md#writers).

        MHA: every rank. MLA: 0.5.14 tp rank 0; 0.5.23 `tp_rank == dcp_rank`, i.e. the first DCP
        group, one writer per shard (tp rank 0 without DCP).
        """
        if not self.mla:
            return True
        if family(self.version) == V0_5_14:
            return self.tp_rank == 0
        return self.tp_rank == self.dcp_rank

    @property
    def prefix(self) -> str:
        """The string put before every page key ("" when none)."""
        if not model_in_prefix(self.version):
            parts = [self.extra_backend_tag] if self.extra_backend_tag is not None else []
        else:
            parts = []
            if self.extra_backend_tag is not None:
                parts.append(str(self.extra_backend_tag))
            if self.model_name:
                parts.append("-".join(self.model_name.split("/")))
            if self.dcp_size > 1:
                assert self.page_size is not None  # __post_init__ requires it with DCP
                parts.append(
                    dcp_prefix_part(self.tp_size, self.dcp_size, self.page_size, self.pp_size, self.attn_cp_size)
                )
        return "_".join(parts) + "_" if parts else ""

    @property
    def suffixes(self) -> list[str]:
        """What follows the page key in each object key, in SGLang's query order."""
        pp = self.pp_size > 1
        if self.mla and self.dcp_size > 1:
            shard = f"dcp{self.dcp_rank}_cp{self.attn_cp_rank}" + (f"_{self.pp_rank}" if pp else "")
            return [f"_{shard}_k"]
        if self.mla:
            return [f"_{self.pp_rank}_k" if pp else "__k"]
        if self.split_heads:
            assert self.tp_lcm_size is not None  # split_heads is true only with a tp_lcm_size
            factor = self.tp_lcm_size // self.tp_size
            ranks = [self.tp_rank * factor + i for i in range(factor)]
        else:
            ranks = [self.tp_rank]
        out = []
        for rank in ranks:
            rank_part = f"{rank}_{self.pp_rank}" if pp else f"{rank}"
            out += [f"_{rank_part}_k", f"_{rank_part}_v"]
        return out

    def object_keys(self, page_key: str) -> list[str]:
        """Every object SGLang writes (and `batch_exists` queries) for one page key."""
        prefix = self.prefix
        return [f"{prefix}{page_key}{suffix}" for suffix in self.suffixes]

    def all_object_keys(self, page_keys_: Sequence[str]) -> list[str]:
        prefix = self.prefix
        suffixes = self.suffixes
        return [f"{prefix}{key}{suffix}" for key in page_keys_ for suffix in suffixes]


@dataclass(frozen=True)
class Deployment:
    """What decides object names: version, prefix parts and the rank topology.

    `tp_rank` / `pp_rank` None means every rank of the deployment; `dcp_rank` picks the tp
    ranks of one DCP shard (`tp_rank % dcp_size == dcp_rank`). `page_size` is the logical page
    size, which a DCP prefix names.
    """

    version: str
    model_name: str | None = None
    extra_backend_tag: str | None = None
    tp_size: int = 1
    tp_rank: int | None = None
    pp_size: int = 1
    pp_rank: int | None = None
    mla: bool = False
    layout: str = "page_first"
    tp_lcm_size: int | None = None
    dcp_size: int = 1
    dcp_rank: int | None = None
    page_size: int | None = None

    def validate(self) -> Deployment:
        """Refuse a topology SGLang cannot run, naming the setting (SettingError); return self.

        The one check of a deployment built from options or a server (cli/common/deployment.py,
        ServerInfo.deployment); `schemes` assumes it held.
        """
        from hicache_ops.sglang.host_pool import check_layout_for

        validate_version(self.version)
        for name, value in (("tp_size", self.tp_size), ("pp_size", self.pp_size)):
            if value < 1:
                raise SettingError(name, f"{value} must be >= 1 (a deployment has at least one rank).")
        if self.dcp_size < 1:
            raise SettingError("dcp_size", f"{self.dcp_size} must be >= 1.")
        if self.page_size is not None and self.page_size < 1:
            raise SettingError("page_size", f"{self.page_size} must be >= 1.")
        check_layout_for(self.layout, mla=self.mla)
        return self

    def schemes(self, *, every_rank: bool = False) -> list[ObjectKeyScheme]:
        """One scheme per writing rank, pp-major then tp, in the order SGLang ranks start.

        `every_rank` keeps the ranks that only read too: each rank runs its own lookup, which
        matters for side pools named per rank (docs/side-pools.md#side-pool-object-keys).
        """
        if self.dcp_size < 1:
            raise InputError(f"dcp-size {self.dcp_size} must be >= 1.")
        if self.dcp_rank is not None and not 0 <= self.dcp_rank < self.dcp_size:
            raise InputError(
                f"dcp-rank {self.dcp_rank} is outside 0..{self.dcp_size - 1} for dcp-size {self.dcp_size}."
            )
        tp_ranks = range(self.tp_size) if self.tp_rank is None else [self.tp_rank]
        if self.dcp_rank is not None:
            if self.tp_rank is not None and self.tp_rank % self.dcp_size != self.dcp_rank:
                raise InputError(
                    f"tp-rank {self.tp_rank} is in DCP shard {self.tp_rank % self.dcp_size}, not {self.dcp_rank}.",
                    hint="SGLang groups DCP ranks contiguously: dcp_rank = tp_rank % dcp_size.",
                )
            tp_ranks = [tp for tp in tp_ranks if tp % self.dcp_size == self.dcp_rank]
        pp_ranks = range(self.pp_size) if self.pp_rank is None else [self.pp_rank]
        out = []
        for pp in pp_ranks:
            for tp in tp_ranks:
                scheme = ObjectKeyScheme(
                    version=self.version,
                    model_name=self.model_name,
                    extra_backend_tag=self.extra_backend_tag,
                    tp_rank=tp,
                    tp_size=self.tp_size,
                    pp_rank=pp,
                    pp_size=self.pp_size,
                    mla=self.mla,
                    layout=self.layout,
                    tp_lcm_size=self.tp_lcm_size,
                    dcp_size=self.dcp_size,
                    page_size=self.page_size,
                )
                if scheme.writes or every_rank:
                    out.append(scheme)
        if not out:
            if self.dcp_size > 1:
                raise InputError(
                    f"under MLA with DCP only tp ranks 0..{self.dcp_size - 1} (one per DCP shard) write to L3; "
                    f"tp-rank {self.tp_rank} writes nothing.",
                    hint=f"Drop --tp-rank or pass --tp-rank {(self.tp_rank or 0) % self.dcp_size}.",
                )
            raise InputError(
                f"under MLA only tp rank 0 writes to L3; tp-rank {self.tp_rank} writes nothing.",
                hint="Drop --tp-rank or pass --tp-rank 0.",
            )
        return out


def check_dcp(version: str, mla: bool, tp_size: int, dcp_size: int, page_size: int | None) -> None:
    """SGLang's conditions for DCP storage keys (docs/keys.md#dcp); InputError when one fails."""
    if not since(validate_version(version), DCP_KEYS_SINCE):
        raise InputError(
            f"dcp-size {dcp_size}: SGLang {version} has no DCP storage keys.",
            hint=f"DCP storage keys exist since SGLang {DCP_KEYS_SINCE}; pass --sglang-version {DCP_KEYS_SINCE}.",
        )
    if not mla:
        raise InputError(
            f"dcp-size {dcp_size} needs an MLA model: SGLang refuses DCP storage otherwise.", hint="Pass --mla."
        )
    if tp_size % dcp_size:
        raise InputError(f"tp-size {tp_size} is not a multiple of dcp-size {dcp_size}, as SGLang requires.")
    if page_size is None or page_size % dcp_size:
        raise InputError(
            f"page size {page_size} is not a multiple of dcp-size {dcp_size}: SGLang needs a DCP-aligned logical page."
        )
