#!/usr/bin/env bash
# The motion refiners of the shipped rt1-rlvr and rt1-mle: each trained on its own transformer's greedy predictions
# of the 800 training episodes (and the real codes) against the real next frames, then copied in fp16 into its
# checkpoint, whose transformer and tokenizer stay as they were. Both checkpoints feed the frames they show back into
# their prompts (`context_from_frames`, set by `train refiner` in RUN_DIR/world_model and here in the shipped ones);
# recalibrate their success thresholds afterwards (`rlvr-gym calibrate rt1`, on each card). On the 2-core CPU:
#   rt1-rlvr (session 17): 6 minutes predicting, 18 training (two processes, one thread each, 16 transitions each);
#   rt1-mle (session 18): 12 minutes predicting, 34 training (one process, 32 transitions; the other core was busy).
# Needs the shipped models' data (`rlvr-gym collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2`
# and `... --out runs/rt1/heldout2 --episodes 60 --seed 2 --split heldout`). A killed run continues with the same
# command plus --resume (extra arguments go to both runs).
#
#   bash docs/ship_rt1_refiner.sh
set -eu
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/rt1}
export HF_HUB_OFFLINE=1
COMMON=(--data runs/rt1/train2 --heldout runs/rt1/heldout2 --prediction-episodes 0 --moved-fraction 0.5 --width 24
        --bottleneck-blocks 1 --steps 2400 --lr 5e-4 --save-every 100 --eval-every 800 --eval-transitions 256)
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m rlvr_gym train refiner --world-model rt1-rlvr \
    --run-dir "$RUNS/refiner" --batch-size 16 "${COMMON[@]}" "$@"
$PY -m torch.distributed.run --standalone --nproc-per-node 1 -m rlvr_gym train refiner --world-model rt1-mle \
    --run-dir "$RUNS/refiner_mle" --batch-size 32 "${COMMON[@]}" "$@"
$PY - "$RUNS/refiner/final" "$RUNS/refiner_mle/final" <<'PYTHON'
import json
import sys
import torch
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import load_motion_refiner
for name, final in (("rt1-rlvr", sys.argv[1]), ("rt1-mle", sys.argv[2])):
    load_motion_refiner(final).to(torch.float16).save_pretrained(SHIPPED_DIR / name / "motion_refiner", safe_serialization=True)
    meta = SHIPPED_DIR / name / "world_model.json"
    settings = json.loads(meta.read_text())
    settings["settings"]["context_from_frames"] = True
    meta.write_text(json.dumps(settings, indent=2))
    print("wrote", SHIPPED_DIR / name / "motion_refiner")
PYTHON
