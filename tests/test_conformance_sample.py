"""CI's fixed conformance sample: one JAX harness per group through juju,
except the groups a test module of their own covers (OWN_MODULE).

The sample (chosen by name hash, see tests/conformance/harnesses.py) runs in
worker subprocesses, all in one MAX compilation, isolated from this process
(a MAX crash fails the harness, not pytest). Known gaps are data,
tests/conformance/known_gaps.json, shared with docs/coverage.md; they xfail
with their reason. Refresh both with
`python -m tests.conformance.run --sample 1 --update-known-gaps --write-docs`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.run import load_known_gaps, run_harnesses

ROOT = Path(__file__).resolve().parents[1]
PER_GROUP = 1

# Groups CI leaves to their own module: there they compile in fewer, shared
# graphs, with more cases; the sample's harness would only add minutes of MAX
# compile (eigh and svd are Jacobi loops).
_LINALG = "tests/test_linalg_kernels.py"
_POOLING = "tests/test_nn_pooling.py"
OWN_MODULE = {
    "cholesky": _LINALG, "lu": _LINALG, "qr": _LINALG, "triangular_solve": _LINALG,
    "eigh": "tests/test_linalg_eig.py (full tier)", "svd": "tests/test_linalg_eig.py (full tier)",
    "conv_general_dilated": "tests/test_nn_conv.py",
    "reduce_window_add": _POOLING, "reduce_window_max": _POOLING, "reduce_window_min": _POOLING,
    "reduce_window_mul": _POOLING, "select_and_gather_add": _POOLING,
    "select_and_scatter_add": _POOLING,
    "rng_bit_generator": "tests/test_rng_bit_generator.py",
}
# Groups tests/test_lax_rules.py draws examples of in its one graph (float32,
# int32, bool); the full conformance run covers their other dtypes. On a
# cold MAX cache each harness here costs CI a compile of its own.
_LAX_RULES = "tests/test_lax_rules.py"
OWN_MODULE |= dict.fromkeys((
    "abs", "add", "and", "argmax", "argmin", "broadcast_in_dim", "ceil", "concatenate",
    "convert_element_type", "cos", "div", "dot_general", "eq", "exp", "expm1", "floor", "ge",
    "gt", "integer_pow", "iota", "le", "log", "log1p", "logistic", "lt", "max", "min", "mul",
    "ne", "neg", "or", "pad", "pow", "reduce_max", "reduce_min", "reduce_prod", "reduce_sum",
    "reshape", "round", "rsqrt", "select_n", "sign", "sin", "slice", "sqrt", "squeeze", "sub",
    "tan", "tanh", "transpose", "xor"), _LAX_RULES)


def _sample() -> list[str]:
    # Listed in a subprocess: the harness module needs x64, which must not leak
    # into this pytest process.
    out = subprocess.run(
        [sys.executable, "-m", "tests.conformance.run", "--sample", str(PER_GROUP),
         "--exclude-groups", ",".join(OWN_MODULE), "--list"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


SAMPLE = _sample()
GAPS = load_known_gaps()


@pytest.fixture(scope="module")
def results():
    return run_harnesses(SAMPLE, batch_size=len(SAMPLE), verbose=False)


def test_sample_covers_every_other_group():
    assert len(SAMPLE) >= 60
    for module in set(OWN_MODULE.values()):
        assert (ROOT / module.split()[0]).exists(), module


@pytest.mark.parametrize("name", SAMPLE)
def test_harness(results, name):
    result = results[name]
    if name in GAPS and result["status"] != "pass":
        pytest.xfail(GAPS[name])
    if result["status"] == "skip":
        pytest.skip(result["reason"])
    assert result["status"] == "pass", f"{result['status']}: {result['reason']}"
