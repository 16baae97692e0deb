#!/bin/bash
# docs/models.md's cuda column in one device call, from the repository root, carrying .whl
# (the gguf wheel the device image lacks):
#
#   bash scripts/h200_families.sh
#
# Runs the cuda cases of the family tests: the same tests that run on cpu and lavapipe in
# CI (there their cuda cases skip, naming why), each comparing cuda's greedy tokens or
# logits with the numpy forward or the reference backend. The real SmolLM2 and Gemma 3
# GGUFs are not on the device: their tests (test_smollm2.py, test_hf_folder.py,
# test_gemma3.py) skip saying so, unless scripts/h200_stage.sh's chunks are in
# /root/stash, which are then unpacked first (h200_unstage). Prints one line per test file
# (passed, failed, skipped and why) and the failures; the log and a JUnit file stay in $OUT.
set -u -o pipefail
source scripts/h200_lib.sh
START=$SECONDS
if compgen -G "/root/stash/c*" >/dev/null; then
  h200_unstage >>"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
else
  h200_wheels .whl/*.whl || exit 1
fi
h200_editable poot-core poot-quant poot-backend-cuda
echo "set up in $((SECONDS - START)) s"
FILES=(tests/test_families.py tests/test_gguf_families.py tests/test_phi3.py
       tests/test_gpt_oss.py tests/test_deepseek.py tests/test_vision_qwen25vl_mmproj.py
       tests/test_vision_gemma3.py tests/test_vision_idefics3.py tests/test_smollm2.py
       tests/test_hf_folder.py tests/test_gemma3.py)
LOG=$OUT/families_cuda.log
timeout -k 10 200 python3 -m pytest -q -p no:cacheprovider -p no:randomly -n 8 -k cuda -rfs \
  --junitxml "$OUT/families_cuda.xml" "${FILES[@]}" >"$LOG" 2>&1
echo "rc=$?" >>"$LOG"
python3 - "$OUT/families_cuda.xml" <<'PY'
import collections, sys, xml.etree.ElementTree as ET

try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as exc:
    sys.exit(f"no JUnit report ({exc}): see families_cuda.log")
files = collections.defaultdict(lambda: collections.Counter())
why = collections.defaultdict(set)
for case in cases:
    name = case.get("classname", "").split(".")[-1] + ".py"
    kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
    files[name][kind] += 1
    if kind == "skipped":
        why[name].add(case.find("skipped").get("message", "")[:160])
for name, count in files.items():
    print(f"{name}: " + ", ".join(f"{n} {k}" for k, n in sorted(count.items())) +
          "".join(f"\n    skipped: {w}" for w in sorted(why[name])))
PY
grep -E "^(FAILED|ERROR)" "$LOG" | cut -c1-220 | head -20
echo "families on cuda: $(grep -E '[0-9]+ (passed|failed|skipped)' "$LOG" | tail -1)" \
  "$(tail -1 "$LOG"), call took $((SECONDS - START)) s"
