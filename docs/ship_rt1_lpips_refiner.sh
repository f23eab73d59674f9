#!/usr/bin/env bash
# Session 25: rt1-rlvr's motion refiner, rt1-mle's fine-tuned with the video reward's perceptual term added to its
# pixel loss (`train refiner --lpips-weight 0.25`), then rt1-rlvr recalibrated. rt1-mle keeps its own: with this
# refiner it fell behind copying at step 5 on one episode set (docs/rt1_experiments.md, session 25). On the 2-core
# CPU: 8-10 minutes training (one process), 6-8 calibrating.
#
# The fine-tune is session 22's last stage again (docs/ship_rt1_reader.sh's first run), from the refiner that script
# shipped, on the predictions and rollouts that run saved in $RUNS/refiner_mle_rollouts (drawn by session 19's
# rt1-mle); without them the run rolls out again with BASE's model (10 minutes), close to but not the same frames.
# On a later checkout point BASE at session 23's rt1-mle:
#   git worktree add /tmp/s23 edf78ed && BASE=/tmp/s23/rlvr_gym/checkpoints/rt1-mle bash docs/ship_rt1_lpips_refiner.sh
# A killed run continues with the same command plus --resume.
#
#   bash docs/ship_rt1_lpips_refiner.sh
set -eu
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/rt1}
BASE=${BASE:-rlvr_gym/checkpoints/rt1-mle}
RUN="$RUNS/refiner_mle_lpips"
export HF_HUB_OFFLINE=1
mkdir -p "$RUN"
for saved in predictions_0_of_1.npz rollouts_0_of_1.npz; do
    if [ -f "$RUNS/refiner_mle_rollouts/$saved" ] && [ ! -f "$RUN/$saved" ]; then
        cp "$RUNS/refiner_mle_rollouts/$saved" "$RUN/$saved"
    fi
done
$PY -m rlvr_gym train refiner --world-model "$BASE" --model "$BASE/motion_refiner" --run-dir "$RUN" \
    --data runs/rt1/train2 --heldout runs/rt1/heldout2 --prediction-episodes 0 --steps 800 --lr 2e-4 --warmup-steps 20 \
    --batch-size 16 --moved-fraction 0.375 --revealed-fraction 0.25 --rollout-depth 5 --rollout-starts 2048 \
    --rollout-fraction 0.25 --lpips-weight 0.25 "$@"
$PY - "$RUN/final" <<'PYTHON'
import sys
import torch
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import load_motion_refiner
load_motion_refiner(sys.argv[1]).to(torch.float16).save_pretrained(SHIPPED_DIR / "rt1-rlvr" / "motion_refiner")
print("wrote", SHIPPED_DIR / "rt1-rlvr" / "motion_refiner")
PYTHON
$PY -m rlvr_gym calibrate rt1 --checkpoint rlvr_gym/checkpoints/rt1-rlvr --data runs/rt1/train2 --episodes-per-task 64
