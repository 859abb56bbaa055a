"""Host-pool (L2) and device-pool (L1) geometry as SGLang lays them out (FACTS §3)."""

from __future__ import annotations

from .errors import InputError

# The host layouts a deployment can choose (--hicache-mem-layout). 0.5.23's page_unified is
# internal (not a CLI choice) and is not modelled.
LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_first_direct", "page_head")


def check_layout_for(layout: str, *, mla: bool) -> str:
    """Return `layout` if SGLang accepts it for this attention kind, else raise an InputError."""
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is unknown.", hint=f"Use one of: {', '.join(LAYOUTS)}.")
    if mla and layout == "page_head":
        raise InputError(
            "layout 'page_head' is not supported for MLA models.",
            hint="Use page_first or page_first_direct for MLA.",
        )
    return layout
