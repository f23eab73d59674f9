#!/usr/bin/env bash
# rt1-cotrained: rt1-dynamics refit by the co-training loop on a close_drawer PPO agent's real experience (seed 0,
# 40 GRPO steps per refit). On the 2-core CPU about 40 minutes. A killed run continues with the same command.
#
#   bash docs/ship_rt1_cotrained.sh
set -eu
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
[ -d runs/rt1/train2 ] || $PY -m rlvr_gym collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2
$PY -m bench.sim_to_real --checkpoint rt1-dynamics --tasks close_drawer --seeds 0 --rounds 3 --real-steps 0 \
    --score-data --pretrain-steps 4096 --sim-steps 2048 --eval-episodes 16 --mle-steps 40 --grpo-steps 40 \
    --replay runs/rt1/train2 --shaping 0.2 --arms loop
# The loop's last world model, with rt1-dynamics' initial states: the loop added the starts of its scorings, which
# are the real env's held-out evaluation starts, and an env that resets to them would be refused for training.
$PY - <<'PYTHON'
import json
from pathlib import Path
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import RobotWorldModel
runs = Path("runs/bench/sim_to_real/close_drawer+shaping0.2+pretrain4096+score-data+rt1-dynamics")
(loop,) = [d for d in runs.glob("loop-0-*") if json.loads((d / "config.json").read_text())["grpo_steps"] == 40]
card = SHIPPED_DIR / "rt1-cotrained" / "CARD.md"
world = RobotWorldModel.load(loop / "round_02" / "rlvr" / "world_model")
world.ship(SHIPPED_DIR / "rt1-dynamics", "rt1-cotrained", card.read_text() if card.is_file() else "")
PYTHON
