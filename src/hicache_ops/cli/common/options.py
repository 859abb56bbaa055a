"""Every option used by two or more commands, declared once: one name, one type, one help text.

Choices are Enums built from the library's own tables, so `--help` lists them and Typer rejects
a bad value before a command runs; each member's value is the exact string users type (and the
string JSON output carries: call sites pass `.value` to the library). Options sit in help panels:
INPUT (what to look at, and where), DEPLOYMENT (the SGLang/Mooncake settings being mirrored),
OUTPUT (how results are printed).
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import DTYPES, PRESETS
from hicache_ops.sglang.host_pool import LAYOUTS
from hicache_ops.sglang.policy import STOP_POLICIES, WRITE_POLICIES
from hicache_ops.sglang.rewrites import IO_BACKENDS
from hicache_ops.sglang.side_pool_specs import PRESETS as POOL_PRESETS
from hicache_ops.sglang.versions import NEWEST, OLDEST

INPUT = "Input"
DEPLOYMENT = "Deployment"
OUTPUT = "Output"

# The most ranks a parallel size may name: far above any deployment, low enough that the keys, files
# and pools one entry per rank stay small (a larger value is refused by the parser, exit 2).
MAX_RANKS = 4096


def _at_most_ranks(ctx: typer.Context, param: typer.CallbackParam, value: int | None) -> int | None:
    if value is not None and value > MAX_RANKS:
        raise typer.BadParameter(f"{value} ranks is more than any deployment has (at most {MAX_RANKS}).")
    return value


def _not_negative(ctx: typer.Context, param: typer.CallbackParam, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise typer.BadParameter(f"{value} is negative; it counts tokens (0 or more).")
    return value


def _positive_bandwidth(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
    if value is not None and not value > 0:  # NaN too
        raise typer.BadParameter(
            f"{value:g} Gbit/s is not a bandwidth: give a rate above 0, or leave it out (unlimited)."
        )
    return value


def l3_bandwidth_bytes_s(gbps: float | None) -> float | None:
    """--l3-bandwidth-gbps (gigabits per second, as links are rated) in the engine's bytes per second."""
    return None if gbps is None else gbps * 1e9 / 8


# Written out so the type checker knows the members; tests/cli/test_options.py checks that each
# holds exactly its library table (LAYOUTS, IO_BACKENDS, WRITE_POLICIES, STOP_POLICIES).
class HostLayout(StrEnum):
    layer_first = "layer_first"
    page_first = "page_first"
    page_first_direct = "page_first_direct"
    page_head = "page_head"


class IoBackend(StrEnum):
    kernel = "kernel"
    direct = "direct"


class WritePolicy(StrEnum):
    write_through = "write_through"
    write_through_selective = "write_through_selective"
    write_back = "write_back"


class StopPolicy(StrEnum):
    best_effort = "best_effort"
    wait_complete = "wait_complete"
    timeout = "timeout"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


CHOICE_TABLES: dict[type[StrEnum], tuple[str, ...]] = {
    HostLayout: LAYOUTS,
    IoBackend: IO_BACKENDS,
    WritePolicy: WRITE_POLICIES,
    StopPolicy: STOP_POLICIES,
}


def _listed(choices: type[StrEnum]) -> str:
    return ", ".join(member.value for member in choices)


def value_of(choice: StrEnum | str | None) -> str | None:
    """The string a user typed (None stays None), for the library and for JSON."""
    return None if choice is None else getattr(choice, "value", choice)


def _version_choice(ctx: typer.Context, value: str | None) -> str | None:
    """--sglang-version's callback: which release's rules apply and why go into the output.

    The choice (given, or the installed sglang's, or the newest) is named in the JSON
    (`sglang_rules`, warnings also in `notes`) and on stderr; a refused version is left for the
    command to report (one sentence, exit 2).
    """
    from hicache_ops.cli.common.output import ARGV, RULES, stderr
    from hicache_ops.errors import InputError
    from hicache_ops.sglang.versions import choose

    if value is None and any(a == "--sglang-url" or a.startswith("--sglang-url=") for a in ARGV.get()):
        return value  # the server's version decides (--sglang-url says which and why)
    try:
        choice = choose(value)
    except InputError:
        return value
    warnings = [n for n in choice.notes if n.startswith("warning:")]
    from hicache_ops.sglang.views import SglangRulesView

    ctx.meta[RULES] = (SglangRulesView(**choice.to_dict()), warnings)
    # The installed sglang being a known release is no fallback: that choice is in the JSON only.
    for note in warnings:
        stderr.print(f"[bold yellow]warning:[/] {note.removeprefix('warning: ')}", highlight=False)
    return value


# Output
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print stable JSON on stdout (diagnostics go to stderr).", rich_help_panel=OUTPUT),
]
AllOption = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Print every row of detail (human output shows the first rows after the verdict).",
        rich_help_panel=OUTPUT,
    ),
]

# Input: the prompt
TokensOption = Annotated[
    str | None,
    typer.Option(
        "--tokens", help="Token ids, comma separated: 1,2,3.", metavar="IDS", show_default=False, rich_help_panel=INPUT
    ),
]
TokensFileOption = Annotated[
    str | None,
    typer.Option(
        "--tokens-file",
        help="A JSON array of ids, or JSONL with input_ids (or text); - reads stdin.",
        metavar="FILE",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
LineOption = Annotated[
    int | None,
    typer.Option(
        "--line",
        help="Which prompt of a multi-line JSONL file (1-based).",
        metavar="N",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
TextOption = Annotated[
    str | None,
    typer.Option(
        "--text",
        help="Prompt text, tokenized with --tokenizer.",
        metavar="TEXT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
TokenizerOption = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="Local Hugging Face tokenizer folder (tokenizer.json).",
        metavar="DIR",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
ExtraKeyOption = Annotated[
    str | None,
    typer.Option(
        "--extra-key",
        help="Request extra_key (0.5.23 namespace).",
        metavar="KEY",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
CacheSaltOption = Annotated[
    str | None,
    typer.Option(
        "--cache-salt",
        help="Request cache_salt (0.5.23 namespace).",
        metavar="SALT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
TryExtraKeyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--try-extra-key",
        help="Another extra_key whose keys to look for (repeatable).",
        metavar="KEY",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
TryCacheSaltOption = Annotated[
    list[str] | None,
    typer.Option(
        "--try-cache-salt",
        help="Another cache_salt whose keys to look for (repeatable).",
        metavar="SALT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]

# Input: the services looked at
MasterOption = Annotated[
    str | None,
    typer.Option(
        "--master",
        help="The Mooncake master's admin HTTP address, HOST:METRICS_PORT (mooncake_master --metrics_port).",
        metavar="HOST:PORT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
MasterRpcOption = Annotated[
    str | None,
    typer.Option(
        "--master-rpc",
        envvar="MOONCAKE_MASTER",
        help="The Mooncake master's RPC address, HOST:RPC_PORT.",
        metavar="HOST:PORT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
ServeOption = Annotated[
    str,
    typer.Option(
        "--serve",
        help="URL of a running `hicache serve`.",
        metavar="URL",
        envvar="HICACHE_SERVE",
        rich_help_panel=INPUT,
    ),
]
OptionalServeOption = Annotated[
    str | None,
    typer.Option(
        "--serve", help="URL of a running `hicache serve`.", metavar="URL", show_default=False, rich_help_panel=INPUT
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout",
        help="Seconds to wait for each answer of a service before exit 3.",
        metavar="SECONDS",
        rich_help_panel=INPUT,
    ),
]
ServerArgsOption = Annotated[
    str | None,
    typer.Option(
        "--server-args",
        help="The deployment's SGLang launch flags as one string, or @FILE / a file holding them.",
        metavar="FLAGS",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
ExtraConfigOption = Annotated[
    str | None,
    typer.Option(
        "--extra-config",
        help="The deployment's --hicache-storage-backend-extra-config: JSON, or @FILE (.json, .toml, .yaml).",
        metavar="JSON|@FILE",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
MooncakeConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="The Mooncake config file (stands for SGLANG_HICACHE_MOONCAKE_CONFIG_PATH).",
        metavar="FILE",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]

# Deployment: SGLang's settings, under SGLang's flag names
SglangVersionOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-version",
        callback=_version_choice,
        help=f"SGLang release whose rules apply: {OLDEST} to {NEWEST}, post releases too; newer ones get "
        f"{NEWEST}'s rules with a warning (default: the installed sglang, else {NEWEST}; docs/releases.md).",
        metavar="VERSION",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
PageSizeOption = Annotated[
    int,
    typer.Option("--page-size", help="Tokens per page (SGLang --page-size).", metavar="N", rich_help_panel=DEPLOYMENT),
]
ModelNameOption = Annotated[
    str | None,
    typer.Option(
        "--model-name",
        help="Served model name; 0.5.23 prefixes object keys with it ('/' becomes '-').",
        metavar="NAME",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
ExtraBackendTagOption = Annotated[
    str | None,
    typer.Option(
        "--extra-backend-tag",
        help="Mooncake extra_backend_tag (key prefix).",
        metavar="TAG",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
TpSizeOption = Annotated[
    int,
    typer.Option(
        "--tp-size",
        help="Attention tensor-parallel size (SGLang --tp-size; --tp-size / --dp-size with DP attention).",
        metavar="N",
        callback=_at_most_ranks,
        rich_help_panel=DEPLOYMENT,
    ),
]
DcpSizeOption = Annotated[
    int,
    typer.Option(
        "--dcp-size",
        help="Decode-context-parallel size (SGLang 0.5.23 --dcp-size, MLA only): --page-size is the "
        "logical page (SGLang's page x dcp); the prefix names the topology and DCP rank d holds tokens i % dcp == d "
        "of every page, one object per shard (docs/keys.md#dcp).",
        metavar="N",
        callback=_at_most_ranks,
        rich_help_panel=DEPLOYMENT,
    ),
]
TpRankOption = Annotated[
    int | None,
    typer.Option(
        "--tp-rank",
        help="Only this tp rank (default: every rank of the node).",
        metavar="N",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
PpSizeOption = Annotated[
    int,
    typer.Option(
        "--pp-size",
        help="Pipeline-parallel size (SGLang --pp-size).",
        metavar="N",
        callback=_at_most_ranks,
        rich_help_panel=DEPLOYMENT,
    ),
]
TpLcmSizeOption = Annotated[
    int | None,
    typer.Option(
        "--tp-lcm-size",
        help="Extra-config tp_lcm_size (heterogeneous TP).",
        metavar="N",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
MlaOption = Annotated[
    bool,
    typer.Option(
        "--mla",
        help="An MLA model (latent KV): one `_k` object per page, rows replicated on every rank.",
        rich_help_panel=DEPLOYMENT,
    ),
]
PresetOption = Annotated[
    str | None,
    typer.Option(
        "--preset", help=f"Model geometry preset: {', '.join(PRESETS)}.", metavar="NAME", rich_help_panel=DEPLOYMENT
    ),
]
DtypeOption = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help=f"KV dtype: {', '.join(DTYPES)} (default: the preset's, else bfloat16).",
        metavar="DTYPE",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
LayersOption = Annotated[
    int | None,
    typer.Option("--layers", help="Model layers.", metavar="N", show_default=False, rich_help_panel=DEPLOYMENT),
]
HeadDimOption = Annotated[
    int | None,
    typer.Option(
        "--head-dim", help="Size of one KV head.", metavar="N", show_default=False, rich_help_panel=DEPLOYMENT
    ),
]
DeviceTokensOption = Annotated[
    int,
    typer.Option(
        "--device-tokens", help="Device (L1) pool size in tokens per rank.", metavar="N", rich_help_panel=DEPLOYMENT
    ),
]
HicacheRatioOption = Annotated[
    float | None,
    typer.Option(
        "--hicache-ratio",
        help="Host (L2) pool size as a multiple of the device pool (SGLang's default 2.0).",
        metavar="RATIO",
        rich_help_panel=DEPLOYMENT,
    ),
]
HicacheSizeOption = Annotated[
    float,
    typer.Option(
        "--hicache-size",
        help="Host (L2) pool size in GB (1e9 bytes) per rank; overrides the ratio when > 0.",
        metavar="GB",
        rich_help_panel=DEPLOYMENT,
    ),
]
LayoutOption = Annotated[
    HostLayout,
    typer.Option(
        "--hicache-mem-layout",
        "--layout",
        metavar="LAYOUT",
        rich_help_panel=DEPLOYMENT,
        help=f"Host-pool (L2) layout before SGLang's start-up rewrites: {_listed(HostLayout)}.",
    ),
]
IoBackendOption = Annotated[
    IoBackend,
    typer.Option(
        "--hicache-io-backend",
        "--io-backend",
        metavar="BACKEND",
        rich_help_panel=DEPLOYMENT,
        help=f"How host and device pools exchange pages: {_listed(IoBackend)}.",
    ),
]
PoolOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pool",
        help="A side pool, as SGLang's PoolName value, with options NAME[:k=v,...]: attention=mla|mha "
        "(draft, draft_swa), conv=N and temporal=0|1 (mamba), window=PAGES (SWA-indexed pools); for its host "
        "pool layers=N, tokens=N (device slots), heads=N, head_dim=N, conv_shapes=AxB[+CxD], temporal_shape=AxBxC, "
        "conv_dtype, temporal_dtype. Naming a --pool-preset pool changes only the options given "
        "(repeatable; docs/side-pools.md).",
        metavar="POOL",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
PoolPresetOption = Annotated[
    str | None,
    typer.Option(
        "--pool-preset",
        help=f"The side pools of a real hybrid model, with its shapes: {', '.join(POOL_PRESETS)}. inspect keys "
        "sets --mla for an MLA preset; the embedded engine needs a --preset geometry of the same attention "
        "kind (e.g. tiny-mla).",
        metavar="PRESET",
        show_default=False,
        rich_help_panel=DEPLOYMENT,
    ),
]
WritePolicyOption = Annotated[
    WritePolicy,
    typer.Option(
        "--hicache-write-policy",
        metavar="POLICY",
        rich_help_panel=DEPLOYMENT,
        help=f"When pages are written to the host pool and L3: {_listed(WritePolicy)}.",
    ),
]
StopPolicyOption = Annotated[
    StopPolicy,
    typer.Option(
        "--hicache-storage-prefetch-policy",
        metavar="POLICY",
        rich_help_panel=DEPLOYMENT,
        help=f"When an L3 prefetch stops (the stop policy): {_listed(StopPolicy)}.",
    ),
]
PrefetchThresholdOption = Annotated[
    int,
    typer.Option(
        "--prefetch-threshold",
        help="Extra-config prefetch_threshold: fewest L3-hit tokens worth a prefetch.",
        metavar="TOKENS",
        callback=_not_negative,
        rich_help_panel=DEPLOYMENT,
    ),
]
L3BandwidthOption = Annotated[
    float | None,
    typer.Option(
        "--l3-bandwidth-gbps",
        help="Modelled L3 transfer rate in Gbit/s (a 100 Gbit/s link: 12.5 GB/s): an L3 read batch and a write take "
        "their bytes over it, so the timeout and best_effort stop policies can cut a prefetch "
        "(docs/controller.md#transfer-time). Default: unlimited (L3 answers at once).",
        metavar="GBPS",
        show_default=False,
        callback=_positive_bandwidth,
        rich_help_panel=DEPLOYMENT,
    ),
]
DeviceOption = Annotated[
    Device,
    typer.Option(
        "--device",
        metavar="DEVICE",
        rich_help_panel=DEPLOYMENT,
        help="Where KV tensors live: auto (CUDA when enough GPUs are visible), cpu or cuda.",
    ),
]

# Benchmarks
RepeatsOption = Annotated[
    int, typer.Option("--repeats", help="Timed runs per case, interleaved between the sides compared.", metavar="N")
]
PlotOption = Annotated[
    str | None,
    typer.Option(
        "--plot",
        help="Write the hit-rate plot to this PNG.",
        metavar="FILE",
        show_default=False,
        rich_help_panel=OUTPUT,
    ),
]


def check_plot_path(plot: str | None) -> None:
    """A --plot FILE names a .png in a folder that exists and is writable: refused before a long run, not after."""
    if plot is None:
        return
    if not plot.lower().endswith(".png"):
        raise InputError(f"--plot {plot!r} must name a .png file.")
    folder = os.path.dirname(os.path.abspath(plot))
    if not os.path.isdir(folder):
        raise InputError(f"--plot {plot!r}: the folder {folder} does not exist.")
    if not os.access(folder, os.W_OK):
        raise InputError(f"--plot {plot!r}: the folder {folder} is not writable.")


QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.", rich_help_panel=OUTPUT)]
AllowWritesOption = Annotated[
    bool,
    typer.Option(
        "--allow-writes",
        help="Let the command change the server: trace read/write --serve runs the real path (prefill, backup, "
        "L3 writes, --flush), explain sends its request; without it trace only observes and explain refuses.",
    ),
]
