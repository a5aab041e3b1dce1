#!/usr/bin/env bash
# One-command GPU check (<= 10 min on one GPU): bash benchmarks/gpu_check.sh [OUT_DIR]
#
# Versions and compute capability, NVML/torch device identity by UUID, the gpu-marked tests, the auto-device tests,
# a bf16 smoke run of the GPU suite without its 2.7B row (no error rows, flash_attn ran, baseline + report
# written), one scenario alone vs in the suite (identical peak: probe isolation), the nvml probe beside the cuda
# probe, FlashAttention's published attention-memory ratios, and the GPU margin: the simulated peak of GPT and Llama
# steps vs the caching allocator's max allocated and reserved (benchmarks/gpu_margin.py; the margin `flashckpt fit`
# assumes until this has run). Prints one summary table; exits non-zero if any check failed.
# Everything to bring back lands in OUT_DIR (default gpu-check/): logs, the report, results.json, the baseline,
# gpu-margin.md and gpu-margin.json.
set -u
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python}"
PYTEST=("$PY" -m pytest -p no:cacheprovider)
SUMMARY="$OUT/summary.tsv"
: > "$SUMMARY"
FAILED=0

# check NAME TIMEOUT_S CMD... : runs CMD with its output in OUT/NAME.log; its last line is the table's detail
check() {
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS status
  if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then status=ok; else status=FAIL; FAILED=1; fi
  local detail; detail="$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-110)"
  printf '%s\t%s\t%ss\t%s\n' "$name" "$status" "$((SECONDS - start))" "$detail" >> "$SUMMARY"
  echo "[$status] $name ($((SECONDS - start)) s)"
}

check versions 60 "$PY" - <<'PY'
import importlib.metadata as md
import pynvml, torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"
pynvml.nvmlInit()
driver = pynvml.nvmlSystemGetDriverVersion()
pynvml.nvmlShutdown()
try:
    fa = md.version("flash-attn")
except md.PackageNotFoundError:
    raise SystemExit("flash-attn is not installed (pip install -c constraints.txt -e '.[gpu]')")
import flash_attn.flash_attn_interface  # noqa: F401  (an ABI mismatch with torch fails here)
cap = torch.cuda.get_device_capability(0)
assert cap[0] >= 8, f"flash-attn 2 needs sm80+, this GPU is sm{cap[0]}{cap[1]}"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, flash-attn {fa}, driver {driver}, "
      f"{torch.cuda.get_device_name(0)} sm{cap[0]}{cap[1]}, {torch.cuda.device_count()} device(s)")
PY

check identity 60 "$PY" - <<'PY'
import pynvml, torch
from pytest_flashckpt.probes.nvml import normalise_uuid, nvml_handle_for
pynvml.nvmlInit()
try:
    pairs = []
    for i in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(i).uuid)
        handle = nvml_handle_for(pynvml, uuid)
        assert normalise_uuid(pynvml.nvmlDeviceGetUUID(handle)) == normalise_uuid(uuid)
        pairs.append(f"cuda:{i}=nvml {pynvml.nvmlDeviceGetIndex(handle)} ({normalise_uuid(uuid)[:8]})")
finally:
    pynvml.nvmlShutdown()
print("same GPU by UUID: " + ", ".join(pairs))
PY

check gpu-tests 240 "${PYTEST[@]}" -m gpu -q -rs tests
check auto-device-tests 180 "${PYTEST[@]}" -q tests/fixture tests/config/test_gpu_suite.py tests/plugin

# smoke: every scenario but the 2.7B large row (its two ~16 GB saves, written and hashed, alone take minutes;
# run it with the full suite: pytest --flashckpt-suite)
check suite-smoke 420 "${PYTEST[@]}" --flashckpt-suite=gpu -k "not large-2.7b" --flashckpt-rounds=1 \
  --flashckpt-report="$OUT/report" --flashckpt-baseline-dir="$OUT/baselines" --flashckpt-save-baseline -p no:randomly -q
check suite-rows 30 "$PY" - "$OUT/report/results.json" <<'PY'
import json, sys
record = json.load(open(sys.argv[1]))
rows = record["results"]
errors = [r["name"] for r in rows if r["status"] == "error"]
assert not errors, f"error rows: {errors}"
flash = [r for r in rows if r["name"].startswith("flash_attn-")]
assert flash and all(r["status"] == "measured" and r["kernel"] == "flash_attn" for r in flash), \
    [(r["name"], r["status"], r["kernel"], r.get("reason")) for r in flash]
assert record["profile"]["kernel"] == "flash_attn", record["profile"]
counts = {s: sum(r["status"] == s for r in rows) for s in ("measured", "skipped", "error")}
print(f"{len(rows)} rows {counts}, flash_attn ran in {len(flash)}, profile {record['profile_id']}")
PY

# probe isolation: the same scenario alone (fresh process) has the peak it had inside the suite
ISO=act-selective_op-125m-s8192
check alone 120 "${PYTEST[@]}" --flashckpt-suite=gpu -k "$ISO" --flashckpt-rounds=1 --flashckpt-report="$OUT/alone" \
  --flashckpt-no-compare -p no:randomly -q
check isolation 30 "$PY" - "$OUT/report/results.json" "$OUT/alone/results.json" "$ISO" <<'PY'
import json, sys
def peak(path, name):
    row = next(r for r in json.load(open(path))["results"] if r["name"] == name)
    return row["metrics"]["peak_bytes"], row["metrics"]["reference_peak_bytes"]
suite, alone = peak(sys.argv[1], sys.argv[3]), peak(sys.argv[2], sys.argv[3])
assert suite == alone, f"peak (and reference peak) in the suite {suite} vs alone {alone}"
print(f"{sys.argv[3]}: peak {suite[0]} B in the suite and alone; reference {suite[1]} B both")
PY

# the nvml probe beside the cuda probe on one scenario
NV=flash_attn-gpt3-125m-16k-s8192
check nvml-probe 120 "${PYTEST[@]}" --flashckpt-suite=gpu -k "$NV" --flashckpt-probe=nvml --flashckpt-rounds=1 \
  --flashckpt-report="$OUT/nvml" --flashckpt-no-compare -p no:randomly -q
check nvml-vs-cuda 30 "$PY" - "$OUT/report/results.json" "$OUT/nvml/results.json" "$NV" <<'PY'
import json, sys
def metrics(path):
    return next(r for r in json.load(open(path))["results"] if r["name"] == sys.argv[3])["metrics"]
cuda, nvml = metrics(sys.argv[1]), metrics(sys.argv[2])
ratio = nvml["peak_bytes"] / cuda["peak_bytes"]
assert 0.8 <= ratio <= 1.5, f"nvml peak {nvml['peak_bytes']} vs cuda peak {cuda['peak_bytes']} ({ratio:.2f}x)"
assert nvml["nvml_context_bytes"] > 0
print(f"nvml/cuda peak {ratio:.2f}x (nvml {nvml['peak_bytes'] / 2**30:.2f} GiB, cuda {cuda['peak_bytes'] / 2**30:.2f} GiB), "
      f"context {nvml['nvml_context_bytes'] / 2**20:.0f} MiB reported apart")
PY

check attention-memory 120 "$PY" benchmarks/attention_memory.py --out "$OUT"

# simulated peak vs max_memory_allocated / max_memory_reserved (report: OUT/gpu-margin.md, exact bytes in
# OUT/gpu-margin.json); its last line is the range of reserved/simulated - 1. Snapshots are summarised, not pickled,
# to keep OUT small: run the script alone (without --no-pickles) for torch's pickles to open in memory_viz.
check gpu-margin 120 "$PY" benchmarks/gpu_margin.py --out "$OUT" --no-pickles

echo
"$PY" - "$SUMMARY" <<'PY'
import sys
from tabulate import tabulate
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
print(tabulate(rows, headers=["check", "result", "time", "detail"], tablefmt="github"))
PY
echo "logs, report, results and baseline: $OUT"
exit $FAILED
