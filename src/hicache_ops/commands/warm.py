"""`hicache warm`: fill an L3 namespace with prompts, verify every object landed, resume on rerun.

Two targets:
- a `hicache serve` instance: each prompt is prefilled with a forced backup (every whole page to
  host and L3, whatever the serve's write policy), then the expected objects are checked on the
  serve's master. The KV is the serve's synthetic reference KV, so a serve whose L3 is an existing
  Mooncake cluster is warmed only with `synthetic=True`: synthetic KV in a production cache
  would be served to real requests.
- a real SGLang server: each prompt goes to /generate with max_new_tokens 1 and SGLang writes to
  L3 itself (if its write policy allows); the objects are then checked on the master.

Prompts whose objects are all present already are skipped, so a rerun resumes an interrupted warm.
A stop request (Ctrl-C, SIGTERM; hicache_ops/interrupt.py) stops submitting at once, waits for the
prompts in flight at most `grace_s`, and reports the rest as not reached (`interrupted` is set).
`migrate_prefix` re-keys existing objects after a key-prefix change, without recomputing.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.commands.inspect.key_listing import KeyReport, expected_keys
from hicache_ops.errors import HicacheError, InputError, SettingError, UnreachableError, transport_reason
from hicache_ops.results import Result
from hicache_ops.server.side_pools import check_side_pools, side_pools_of_serve
from hicache_ops.sglang.deployment import DeploymentSettings
from hicache_ops.sglang.hit_policy import read_pages
from hicache_ops.sglang.page_keys import Deployment
from hicache_ops.sglang.side_pool_specs import PoolSpec
from hicache_ops.tokens import Prompt

WRITTEN, PRESENT, NO_PAGE, NOT_LANDED, FAILED, PENDING = (
    "written",
    "present",
    "no_page",
    "not_landed",
    "failed",
    "pending",
)


class PromptOutcome(Result):
    index: int = Field(description="the prompt's position in the input, from 0")
    source: str = Field(description="where the prompt came from (file and line)")
    tokens: int = Field(description="tokens in the prompt")
    pages: int = Field(description="whole pages")
    objects: int = Field(description="objects the prompt needs in L3 to be loadable whole")
    status: str = Field(
        PENDING, description="`written`, `present`, `no_page`, `not_landed`, `failed` or `pending` (not reached)"
    )
    present_objects: int = Field(0, description="of those objects, how many the master holds")
    bytes: int = Field(0, description="bytes written")
    seconds: float = Field(0.0, description="the prompt's time")
    reason: str = Field("", description="why it is not complete, or a note")
    first_missing: str | None = Field(None, description="the first object the master lacks, `null` when none")


class WarmSummary(Result):
    written: int = Field(description="prompts written and verified")
    present: int = Field(description="prompts already whole in L3")
    no_page: int = Field(description="prompts shorter than a page")
    not_landed: int = Field(description="prompts written whose objects did not all land")
    failed: int = Field(description="prompts whose write failed")
    pending: int = Field(description="prompts not reached")
    pages: int = Field(description="whole pages over every prompt")
    bytes: int = Field(description="bytes written")


class WarmResult(Result):
    """`hicache warm --json`."""

    target: str = Field(description="the serve or SGLang server written through")
    deployment: dict = Field(description="the deployment the keys were derived for, and its master")
    dry_run: bool = Field(description="--dry-run: nothing was written")
    complete: bool = Field(description="every prompt's objects are in L3")
    error: str | None = Field(description="why the warm stopped early, `null` when it did not")
    interrupted: str | None = Field(description="the signal that stopped it, `null` when none did")
    summary: WarmSummary = Field(description="prompts per status, pages and bytes")
    prompts: list[PromptOutcome] = Field(description="one row per prompt")


@dataclass
class WarmReport:
    target: str
    deployment: dict
    dry_run: bool
    prompts: list[PromptOutcome] = field(default_factory=list)
    error: str | None = None  # why the warm stopped early, if it did
    interrupted: str | None = None  # the signal that stopped it, if one did

    def count(self, status: str) -> int:
        return sum(1 for p in self.prompts if p.status == status)

    @property
    def complete(self) -> bool:
        return (
            self.error is None
            and self.interrupted is None
            and all(p.status in (WRITTEN, PRESENT, NO_PAGE) for p in self.prompts)
        )

    def result(self) -> WarmResult:
        counts = {s: self.count(s) for s in (WRITTEN, PRESENT, NO_PAGE, NOT_LANDED, FAILED, PENDING)}
        return WarmResult(
            target=self.target,
            deployment=self.deployment,
            dry_run=self.dry_run,
            complete=self.complete,
            error=self.error,
            interrupted=self.interrupted,
            summary=WarmSummary(
                **counts, pages=sum(p.pages for p in self.prompts), bytes=sum(p.bytes for p in self.prompts)
            ),
            prompts=self.prompts,
        )


Progress = Callable[[PromptOutcome], None]


@dataclass
class _Expected:
    """The objects a prompt needs in L3 to be loadable whole: every page's KV objects and, per side
    pool, the pages a load of the whole prompt reads (hit_policy.read_pages)."""

    report: KeyReport
    object_keys: list[str]


def _required(report: KeyReport, pools: Sequence[PoolSpec]) -> _Expected:
    keys: list[str] = []
    n = len(report.pages)
    needed = {pool.name: set(read_pages(pool, n)) for pool in pools}
    for row in report.pages:
        keys.extend(
            k
            for k, pool in zip(row.object_keys, row.object_pools or ["kv"] * len(row.object_keys), strict=True)
            if pool == "kv" or row.index in needed[pool]
        )
    return _Expected(report, keys)


def deployment_of_serve(config: dict) -> Deployment:
    """The key scheme a serve instance writes with (from its /v1/stats config)."""
    return Deployment(
        version=config["sglang_version"],
        model_name=config["model_name"],
        extra_backend_tag=config["extra_backend_tag"],
        tp_size=config["tp_size"],
        mla=config["geometry"]["attention"] == "mla",
        layout=config["host_layout"],
        # a serve started with --dcp-size names its objects per DCP shard (docs/keys.md#dcp)
        dcp_size=config.get("dcp_size", 1),
        page_size=config["page_size"],
    )


def _plan(prompts: Sequence[Prompt], page_size: int, deployment: Deployment, extra_key, cache_salt, pools=()):
    plans = []
    for i, prompt in enumerate(prompts):
        ek = extra_key if extra_key is not None else prompt.extra_key
        cs = cache_salt if cache_salt is not None else prompt.cache_salt
        report = _required(
            expected_keys(prompt.input_ids, page_size, deployment, extra_key=ek, cache_salt=cs, pools=pools), pools
        )
        outcome = PromptOutcome(
            index=i,
            source=prompt.source or f"prompt {i + 1}",
            tokens=len(prompt.input_ids),
            pages=len(report.report.pages),
            objects=len(report.object_keys),
        )
        if not report.report.pages:
            outcome.status = NO_PAGE
            outcome.reason = (
                f"{len(prompt.input_ids)} tokens are less than one page of {page_size}: it produces no page"
            )
        plans.append((prompt, ek, cs, report, outcome))
    return plans


def _mark_present(plans, admin) -> None:
    todo = [p for p in plans if p[4].status == PENDING]
    keys = [k for p in todo for k in p[3].object_keys]
    exists = admin.exists(keys) if keys else []
    at = 0
    for *_, outcome in todo:
        flags = exists[at : at + outcome.objects]
        at += outcome.objects
        outcome.present_objects = sum(flags)
        if all(flags):
            outcome.status = PRESENT
            outcome.reason = "every object already in L3 (skipped)"


def _verify(outcome: PromptOutcome, report, admin) -> None:
    flags = admin.exists(report.object_keys)
    outcome.present_objects = sum(flags)
    if all(flags):
        outcome.status = WRITTEN
    else:
        outcome.status = NOT_LANDED
        outcome.first_missing = report.object_keys[flags.index(False)]


# The JSON error's "kind" when the serve's /health says l3 "down" (the cross-host-miss playbook tests it).
L3_DOWN = "l3_down"


def _check_l3_up(url: str, config: dict, l3: dict) -> None:
    """A serve whose L3 is down cannot be warmed: say the reason its /health knows, not a guess
    about the user's --master (the serve's own master is the one that went). The error's kind is
    L3_DOWN, for scripts and playbooks (docs/serve-api.md#when-l3-is-down)."""
    if l3.get("state") != "down":
        return
    reason = l3.get("reason") or "its Mooncake master stopped answering"
    embedded = config.get("l3") == "embedded"
    raise UnreachableError(
        f"the serve at {url} has its L3 down: {reason.rstrip('.')}.",
        hint=(
            "The serve does not restart its embedded master: stop it and start `hicache serve` again "
            "(the L3 starts empty)."
            if embedded
            else f"Bring the Mooncake master at {config.get('master_metrics_address')} back, "
            "then check the serve's /health."
        ),
        kind=L3_DOWN,
    )


def _check_fits_serve(prompts: Sequence[Prompt], config: dict) -> None:
    """The serve prefills a prompt whole in its device pool: one with more pages than the pool holds
    would fail there after its keys were hashed and queried, so it is refused before anything is sent."""
    page_size, device_pages = config["page_size"], config.get("device_pages")
    if not device_pages:
        return
    for n, prompt in enumerate(prompts, start=1):
        pages = len(prompt.input_ids) // page_size
        if pages > device_pages:
            raise InputError(
                f"{prompt.source or f'prompt {n}'} has {len(prompt.input_ids):,} tokens ({pages:,} pages) but the "
                f"serve's device pool holds {device_pages:,} pages ({device_pages * page_size:,} tokens).",
                hint="Split the prompt, or start the serve with a larger --device-tokens.",
            )


def warm_serve(
    prompts: Sequence[Prompt],
    client,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    expect: dict | None = None,
    pool_texts: Sequence[str] = (),
    pool_preset: str | None = None,
    concurrency: int = 4,
    dry_run: bool = False,
    synthetic: bool = False,
    on_progress: Progress | None = None,
) -> WarmReport:
    """Warm a serve instance's L3. `expect` holds namespace flags the user gave, which must agree
    with the serve's (model_name, extra_backend_tag, sglang_version)."""
    from hicache_ops.mooncake.admin import AdminClient

    stats = client.stats()
    config = stats["config"]
    _check_l3_up(client.url, config, stats.get("l3") or {})
    for name, value in (expect or {}).items():
        if value is not None and config.get(name) != value:
            raise SettingError(
                name,
                f"{value!r} differs from the serve's {config.get(name)!r}; the serve writes with its own key scheme.",
                hint="Drop the flag, or start the serve with it.",
            )
    if config["l3"] == "none":
        raise InputError("the serve instance has no L3 (started with --l3 none); there is nothing to warm.")
    if config["l3"] == "mooncake" and not synthetic and not dry_run:
        raise InputError(
            "the serve's L3 is an existing Mooncake cluster, and warming it writes synthetic KV that real "
            "requests would then reuse.",
            hint="Pass --synthetic if that cluster is a test cluster, or warm through a real SGLang server with "
            "--sglang-url.",
        )
    check_side_pools(config, pool_texts, pool_preset)
    _check_fits_serve(prompts, config)
    deployment = deployment_of_serve(config)
    side = side_pools_of_serve(config)
    report = WarmReport(
        client.url,
        {
            **deployment.__dict__,
            "master": config["master_metrics_address"],
            **({"side_pools": [p.to_text() for p in side]} if side else {}),
        },
        dry_run,
    )
    plans = _plan(prompts, config["page_size"], deployment, extra_key, cache_salt, side)
    report.prompts = [p[4] for p in plans]
    with AdminClient(config["master_metrics_address"], timeout=client.timeout_s) as admin:
        _mark_present(plans, admin)
        for plan in plans:
            if plan[4].status != PENDING and on_progress:
                on_progress(plan[4])
        todo = [p for p in plans if p[4].status == PENDING]
        if dry_run:
            for p in todo:
                p[4].reason = f"would write {p[4].objects - p[4].present_objects} missing object(s)"
            return report
        lock = threading.Lock()

        def one(plan) -> None:
            prompt, ek, cs, keys, outcome = plan
            start = time.perf_counter()
            try:
                result = client.prefill(prompt.input_ids, ek, cs, backup=True)
            except UnreachableError:
                raise  # the serve is gone: run_pool stops starting prompts
            except HicacheError as exc:
                outcome.status, outcome.reason = FAILED, exc.message
                return
            outcome.seconds = time.perf_counter() - start
            outcome.bytes = result["bytes_written_to_l3"]
            with lock:
                _verify(outcome, keys, admin)
            if outcome.status == NOT_LANDED:
                outcome.reason = "the serve acknowledged the prefill but objects are missing on the master"

        run_pool(todo, one, concurrency, report, grace_s=client.timeout_s, on_done=on_progress)
    return report


def run_pool(
    plans, work: Callable, concurrency: int, report: WarmReport, *, grace_s: float, on_done: Progress | None = None
) -> None:
    """Run `work(plan)` on `concurrency` daemon threads until done, an UnreachableError (recorded
    in `report.error`; no new prompt starts) or a stop request (recorded in `report.interrupted`).
    Then prompts in flight get at most `grace_s`; any still running stay pending and are not
    waited for (daemon threads do not hold the process's exit)."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for plan in plans:
        todo.put(plan)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    halt = threading.Event()

    def worker() -> None:
        while not halt.is_set():
            try:
                plan = todo.get_nowait()
            except queue.Empty:
                return
            try:
                work(plan)
                finished.put((plan, None))
            except BaseException as exc:  # handed to the caller's thread, not lost in this one
                halt.set()
                finished.put((plan, exc))

    threads = [
        threading.Thread(target=worker, daemon=True, name=f"warm-{i}")
        for i in range(max(1, min(concurrency, len(plans))))
    ]
    for thread in threads:
        thread.start()
    deadline = None
    unexpected = None
    delivered: set[int] = set()
    while any(t.is_alive() for t in threads) or not finished.empty():
        if deadline is None and interrupt.requested():
            halt.set()
            report.interrupted = interrupt.reason()
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            break
        try:
            plan, exc = finished.get(timeout=0.1)
        except queue.Empty:
            continue
        outcome = plan[4]
        delivered.add(outcome.index)
        if isinstance(exc, UnreachableError):
            report.error = report.error or exc.message
            outcome.status, outcome.reason = PENDING, ""
        elif exc is not None:
            unexpected = unexpected or exc
        if on_done and outcome.status != PENDING:
            on_done(outcome)
    if deadline is not None:
        # A prompt still in flight is reported from a copy its thread no longer writes to.
        submitted = {plan[4].index for plan in plans}
        for at, outcome in enumerate(report.prompts):
            if outcome.index in submitted and outcome.index not in delivered:
                report.prompts[at] = outcome.model_copy(
                    update={
                        "status": PENDING,
                        "bytes": 0,
                        "seconds": 0.0,
                        "first_missing": None,
                        "reason": "not reached: stopped before it finished (a rerun resumes it)",
                    }
                )
    if unexpected is not None:
        raise unexpected


# --------------------------------------------------------------------------------------------
# A real SGLang server
# --------------------------------------------------------------------------------------------


def _check_sglang(http, url: str, timeout_s: float) -> None:
    """`url` answers /model_info as SGLang does (a JSON object with model_path), before anything is sent:
    UnreachableError when nothing answers, InputError when something else does."""
    import httpx

    try:
        response = http.get("/model_info", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UnreachableError(
            f"the SGLang server at {url} did not answer /model_info ({transport_reason(exc, timeout_s)}).",
            hint="Check the server and --sglang-url, or raise --timeout.",
        ) from None
    try:
        info = response.json()
    except ValueError:
        info = None
    if response.status_code != 200 or not isinstance(info, dict) or "model_path" not in info:
        raise InputError(
            f"{url} is not an SGLang server: /model_info answered HTTP {response.status_code} "
            "without SGLang's model_path.",
            hint="Point --sglang-url at SGLang's HTTP port (its --port, default 30000).",
        )


def _input_limit(http, timeout_s: float) -> tuple[int, str] | None:
    """The longest prompt the server takes, from its /server_info: SGLang refuses a prompt of
    `max_req_input_len` tokens or more (scheduler, managers/utils.py validate_input_length) and one
    of `context_length` or more (tokenizer_manager.py); None when /server_info names neither."""
    import httpx

    try:
        response = http.get("/server_info", timeout=timeout_s)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    limits = [
        (value, name)
        for name in ("max_req_input_len", "context_length")
        if isinstance(value := body.get(name), int) and not isinstance(value, bool) and value > 0
    ]
    return min(limits) if limits else None


def _check_fits_sglang(prompts: Sequence[Prompt], limit: tuple[int, str] | None, url: str) -> None:
    if limit is None:
        return
    most, name = limit
    for n, prompt in enumerate(prompts, start=1):
        if len(prompt.input_ids) >= most:
            raise InputError(
                f"{prompt.source or f'prompt {n}'} has {len(prompt.input_ids):,} tokens and the SGLang server at "
                f"{url} takes prompts under {most:,} tokens (its /server_info {name}).",
                hint="Split the prompt; nothing was sent.",
            )


def warm_sglang(
    prompts: Sequence[Prompt],
    sglang_url: str,
    settings: DeploymentSettings,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    pools: Sequence[PoolSpec] = (),
    concurrency: int = 4,
    dry_run: bool = False,
    settle_s: float = 5.0,
    timeout_s: float = 3.0,
    work_timeout_s: float = 120.0,
    on_progress: Progress | None = None,
) -> WarmReport:
    """Send each prompt to SGLang's /generate (max_new_tokens 1); check its objects on `master`.

    The server must answer /model_info within `timeout_s` first (a silent one fails there); each
    /generate may take `work_timeout_s`, after which /model_info tells a slow server from a silent one.
    """
    import httpx

    from hicache_ops.mooncake.admin import AdminClient
    from hicache_ops.server.client import check_http_url, check_timeout

    sglang_url = check_http_url(sglang_url, "--sglang-url")
    timeout_s = check_timeout(timeout_s)
    deployment, master = settings.topology, settings.l3.master
    if master is None:
        raise SettingError("master", "is needed to check what SGLang wrote: give the master's HOST:METRICS_PORT.")
    page_size, prefetch_threshold = settings.page_size, settings.policies.prefetch_threshold
    report = WarmReport(
        sglang_url,
        {**deployment.__dict__, "master": master, **({"side_pools": [p.to_text() for p in pools]} if pools else {})},
        dry_run,
    )
    timeout = httpx.Timeout(max(work_timeout_s, timeout_s), connect=timeout_s)
    with AdminClient(master, timeout=timeout_s) as admin, httpx.Client(base_url=sglang_url, timeout=timeout) as http:

        def alive() -> bool:
            try:
                return http.get("/model_info", timeout=timeout_s).status_code < 500
            except httpx.HTTPError:
                return False

        _check_sglang(http, sglang_url, timeout_s)
        _check_fits_sglang(prompts, _input_limit(http, timeout_s), sglang_url)  # before hashing a page
        plans = _plan(prompts, page_size, deployment, extra_key, cache_salt, pools)
        report.prompts = [p[4] for p in plans]
        _mark_present(plans, admin)
        todo = [p for p in plans if p[4].status == PENDING]
        if dry_run:
            return report

        def send(plan) -> None:
            prompt, ek, cs, _, outcome = plan
            body = {"input_ids": prompt.input_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
            if ek is not None:
                body["extra_key"] = ek
            if cs is not None:
                body["cache_salt"] = cs
            start = time.perf_counter()
            try:
                response = http.post("/generate", json=body)
            except httpx.TimeoutException:
                state = "is alive (it answers /model_info) but" if alive() else "stopped answering and"
                raise UnreachableError(
                    f"the SGLang server at {sglang_url} {state} did not finish /generate within {timeout.read:g} s."
                ) from None
            except httpx.TransportError as exc:
                raise UnreachableError(
                    f"the SGLang server at {sglang_url} did not answer /generate ({transport_reason(exc, timeout_s)})."
                ) from None
            outcome.seconds = time.perf_counter() - start
            if response.status_code >= 400:
                outcome.status, outcome.reason = (
                    FAILED,
                    f"/generate answered HTTP {response.status_code}: {response.text[:200]}",
                )

        run_pool(todo, send, concurrency, report, grace_s=timeout_s)
        sent = [(p, report.prompts[p[4].index]) for p in todo]
        sent = [(p, o) for p, o in sent if o.status == PENDING and o.seconds > 0]
        # SGLang backs pages up asynchronously: give the writes a moment to land (not after a stop).
        deadline = time.monotonic() + (0 if report.interrupted else settle_s)
        while True:
            for (_, _, _, keys, _), outcome in sent:
                if outcome.status in (PENDING, NOT_LANDED):
                    _verify(outcome, keys, admin)
            if all(o.status != NOT_LANDED for _, o in sent) or time.monotonic() > deadline or interrupt.wait(0.2):
                break
        for (prompt, ek, cs, keys, _), outcome in sent:
            if outcome.status == NOT_LANDED and not report.interrupted:
                outcome.reason = _why_not_landed(
                    prompt, keys, outcome, admin, deployment, page_size, ek, cs, prefetch_threshold
                )
            if on_progress:
                on_progress(outcome)
    return report


def _why_not_landed(prompt, keys, outcome, admin, deployment, page_size, ek, cs, prefetch_threshold) -> str:
    from hicache_ops.commands.inspect.live_diff import live_diff

    diff = live_diff(prompt.input_ids, page_size, deployment, admin, extra_key=ek, cache_salt=cs, report=keys.report)
    reasons = [d["message"] for d in diff.diagnosis if d["kind"] != "not_found"]
    if not reasons:
        reasons.append(
            "nothing related is in L3: the write policy has not backed these pages up yet "
            "(write_through_selective waits for a second hit, write_back for GPU eviction)"
        )
    if len(prompt.input_ids) < prefetch_threshold:
        reasons.append(
            f"the prompt is shorter than the prefetch threshold ({prefetch_threshold}): no instance would prefetch "
            "it anyway"
        )
    return "; ".join(reasons)


# --------------------------------------------------------------------------------------------
# Re-keying after a prefix change
# --------------------------------------------------------------------------------------------


class MigrationReport(Result):
    """`hicache warm --migrate-prefix FROM TO --json`."""

    source_prefix: str = Field(description="the prefix the objects are copied from")
    target_prefix: str = Field(description="the prefix they are copied to")
    objects: int = Field(0, description="page objects under the source prefix")
    copied: int = Field(0, description="objects copied")
    already_there: int = Field(0, description="objects the target already held with the same bytes")
    verified: int = Field(0, description="copies read back byte for byte")
    removed: int = Field(0, description="originals removed (--remove-old)")
    failed: list[str] = Field(default_factory=list, description="objects that could not be read, copied or verified")
    dry_run: bool = Field(False, description="--dry-run: nothing was copied")


def _is_page_object(rest: str) -> bool:
    """`{64 hex page key}_{suffix}`: an SGLang page object once its prefix is stripped."""
    if len(rest) < 66 or rest[64] != "_":
        return False
    return all(c in "0123456789abcdef" for c in rest[:64])


def migrate_prefix(
    master: str,
    store,
    source: str,
    target: str,
    *,
    remove_old: bool = False,
    dry_run: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    timeout_s: float = 3.0,
) -> MigrationReport:
    """Copy every page object `{source}{page_key}_{suffix}` to `{target}{page_key}_{suffix}`,
    verify the copy byte for byte, and remove the originals only with `remove_old`.

    `source` may be "" for unprefixed keys (SGLang 0.5.14 without a tag). Resumable: a target
    that already holds the same bytes counts as done.
    """
    from hicache_ops.mooncake.admin import AdminClient

    if source == target:
        raise SettingError("migrate_prefix", "FROM and TO are the same prefix.")
    for name, value in (("FROM", source), ("TO", target)):
        if value and not value.endswith("_"):
            raise SettingError(
                "migrate_prefix",
                f"{name} {value!r} should end with '_' as SGLang's prefixes do.",
                hint="For example Qwen-Qwen3-0.6B_ (empty for unprefixed keys).",
            )
    with AdminClient(master, timeout=timeout_s) as admin:
        keys = [k for k in admin.get_all_keys() if k.startswith(source) and _is_page_object(k[len(source) :])]
    report = MigrationReport(source_prefix=source, target_prefix=target, objects=len(keys), dry_run=dry_run)
    if dry_run or not keys:
        return report
    targets = [target + k[len(source) :] for k in keys]
    present = store.batch_is_exist(targets)
    for i, (old, new) in enumerate(zip(keys, targets, strict=True)):
        data = store.get(old)
        if not data:
            report.failed.append(old)
            continue
        if present[i]:
            if store.get(new) != data:
                report.failed.append(new)
                continue
            report.already_there += 1
        else:
            store.put(new, data)
            report.copied += 1
        if store.get(new) != data:
            report.failed.append(new)
            continue
        report.verified += 1
        if on_progress:
            on_progress(i + 1, len(keys))
    if remove_old and not report.failed:
        scope = source or None
        if scope is None:
            # Unprefixed page objects share no prefix string; remove them key by key, each one checked.
            codes = [store.remove_keys([k], prefix=k[:65], force=True)[0] for k in keys]
        else:
            codes = store.remove_keys(keys, prefix=scope, force=True)
        report.removed = sum(1 for c in codes if c == 0)
    return report
