"""The generated scenes of tests/engine/test_wave_l3_oracle.py, drawn by Hypothesis in a process of
their own (oracle_workloads.py says why: a draw in a pytest worker mixes in constants of the local
modules already imported, so the same derandomized strategy would draw other scenes there).

    python tests/engine/wave_l3_workloads.py COUNT   ->   [scene, ...] as JSON on stdout

A scene: {"device_tokens": int, "written": [prompt, ...], "waves": [[[prompt, output], ...], ...]}.
Nothing here may import from the repository: an import would change the draw.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

PS = 4
# The whole pages of a host hit that SGLang 0.5.23's init_load_back loads (its
# load_back_threshold is 10 tokens; page 4).
LOAD_BACK_MIN = 3 * PS
DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "deep"


def stem(k: int, pages: int) -> list[int]:
    return list(range(1000 * (k + 1), 1000 * (k + 1) + pages * PS))


@st.composite
def scenes(draw):
    """Three stems; the writer instance wrote a page-aligned prefix of some (none, part or all of
    it) to L3. A request takes a prefix of a stem and a fresh tail of at least one token (so its
    match cap covers every whole page of the prefix), and 1 to 5 output tokens.

    Requests of one pass share no computed prefix in SGLang (the engine's known divergence), so
    two requests of one wave take the same stem only in the first wave (the reader's tree is
    empty), both within the stem's written pages and at least LOAD_BACK_MIN tokens into them: the
    first admitted reads them from L3 and loads them back inside the adder (`init_load_back`), and
    the next one's match finds them on the device, in both. Past the first wave a stem taken
    already in the wave gives no prefix (a fresh prompt)."""
    fresh = itertools.count(100_000)
    stems = [stem(k, draw(st.integers(2, 8))) for k in range(3)]
    written = [draw(st.integers(0, len(s) // PS)) * PS for s in stems]

    def wave(first: bool):
        first_cut: dict[int, int] = {}  # stem -> the cut of the wave's first request on it
        requests = []
        for _ in range(draw(st.integers(2, 4))):
            k = draw(st.integers(0, 2))
            if k not in first_cut:
                cut = first_cut[k] = draw(st.integers(0, len(stems[k])))
            elif first and min(first_cut[k], written[k]) >= LOAD_BACK_MIN:
                cut = draw(st.integers(LOAD_BACK_MIN, written[k]))
            else:
                cut = 0
            prompt = stems[k][:cut] + [next(fresh) for _ in range(draw(st.integers(1, 2 * PS)))]
            requests.append([prompt, [next(fresh) for _ in range(draw(st.integers(1, 5)))]])
        return requests

    wave_list = [wave(i == 0) for i in range(draw(st.integers(1, 3)))]
    longest = max(len(p) + len(o) for w in wave_list for p, o in w)
    device_tokens = PS * (-(-longest // PS) + 3 + draw(st.integers(0, 8)))
    return {
        "device_tokens": device_tokens,
        "written": [stems[k][:n] + [1] for k, n in enumerate(written) if n],
        "waves": wave_list,
    }


def main(count: int) -> None:
    found: list[dict] = []

    @settings(
        max_examples=count,
        derandomize=not DEEP,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(scenes())
    def collect(scene):
        found.append(scene)

    collect()
    json.dump(found, sys.stdout)


if __name__ == "__main__":
    main(int(sys.argv[1]))
