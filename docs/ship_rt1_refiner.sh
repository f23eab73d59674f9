#!/usr/bin/env bash
# The motion refiners of the shipped rt1-rlvr and rt1-mle: each trained on its own transformer's greedy predictions
# of the 800 training episodes (and the real codes) against the real next frames, then copied in fp16 into its
# checkpoint, whose transformer and tokenizer stay as they were. Both checkpoints feed the frames they show back into
# their prompts (`context_from_frames`, set by `train refiner` in RUN_DIR/world_model and here in the shipped ones);
# recalibrate their success thresholds afterwards (`rlvr-gym calibrate rt1`, on each card). On the 2-core CPU:
#   rt1-rlvr: 6 minutes predicting, 18 training (two processes, one thread each, 16 transitions each);
#   rt1-mle: 12 minutes predicting, 34 training (one process, 32 transitions; the other core was busy);
#   then each fine-tuned where objects come out from under the gripper: two stages of 7 minutes each.
# Needs the shipped models' data (`rlvr-gym collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2`
# and `... --out runs/rt1/heldout2 --episodes 60 --seed 2 --split heldout`). A killed run continues with the same
# command plus --resume (extra arguments go to every run).
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
# Each refiner fine-tuned where an object comes out from under the gripper (the objects both models lost),
# always on its transformer's predicted codes; two stages of 800 steps, a quarter of each batch there, then half. One
# process each, 16 transitions a step, 7 minutes a stage; they reuse the predictions above.
REVEAL=(--data runs/rt1/train2 --heldout runs/rt1/heldout2 --prediction-episodes 0 --width 24 --bottleneck-blocks 1
        --batch-size 16 --steps 800 --lr 2e-4 --warmup-steps 20 --save-every 100 --eval-every 800 --eval-transitions 256)
for pair in "rt1-rlvr $RUNS/refiner" "rt1-mle $RUNS/refiner_mle"; do
    read -r model base <<< "$pair"
    mkdir -p "${base}_reveal1" "${base}_reveal2"
    cp "$base"/predictions_*_of_*.npz "${base}_reveal1/"
    cp "$base"/predictions_*_of_*.npz "${base}_reveal2/"
    $PY -m rlvr_gym train refiner --world-model "$model" --model "$base/final" --run-dir "${base}_reveal1" \
        --moved-fraction 0.375 --revealed-fraction 0.25 "${REVEAL[@]}" "$@"
    $PY -m rlvr_gym train refiner --world-model "$model" --model "${base}_reveal1/final" --run-dir "${base}_reveal2" \
        --moved-fraction 0.25 --revealed-fraction 0.5 "${REVEAL[@]}" "$@"
done
$PY - "$RUNS/refiner_reveal2/final" "$RUNS/refiner_mle_reveal2/final" <<'PYTHON'
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
