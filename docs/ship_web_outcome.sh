#!/usr/bin/env bash
# web-outcome: web-refit with an outcome head, the classifier its learned env then takes reward and done from,
# trained on real MiniWoB++ outcomes (the probe's moves on all 13 tasks, scripted play, and the two tasks whose
# outcome turns on reading the page: click-button and click-checkboxes), and on random and half-skilled play
# replayed on web-refit's own pages (`rlvr-gym replay web`): the pages the head reads in the simulator. On the
# 2-core CPU: collection about 25 minutes, replays 10, training about 30. A killed run continues with the same
# command.
#
#   bash docs/ship_web_outcome.sh
set -eu
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
C="$PY -m rlvr_gym collect web"
ALL="click-test-2 click-button click-link focus-text enter-text login-user click-checkboxes click-tab-2 \
  click-collapsible-2 search-engine email-inbox choose-date book-flight"
MOVES="click-last-button submit-with-nothing-filled first-candidate uniform-random"
collect() { local out=$1; shift; [ -f "$out/manifest.json" ] || $C --out "$out" --overwrite "$@"; }
collect runs/web/trivial4 --tasks $ALL --skills --policies $MOVES --episodes 40 --seed 4 --max-steps 5
collect runs/web/train0 --tasks $ALL --episodes 40 --seed 0
collect runs/web/target8-button --tasks click-button --skills 1.0 0.5 --policies click-last-button uniform-random \
  --episodes 600 --seed 8 --max-steps 5
collect runs/web/target10-button --tasks click-button --skills 1.0 0.5 --policies click-last-button uniform-random \
  --episodes 400 --seed 10 --max-steps 5
collect runs/web/target13-button --tasks click-button --skills 0.5 --policies click-last-button uniform-random \
  --episodes 2400 --seed 13 --max-steps 5
collect runs/web/target8-checkbox --tasks click-checkboxes --skills 1.0 0.5 --policies submit-with-nothing-filled \
  uniform-random --episodes 400 --seed 8 --max-steps 5
collect runs/web/target10-checkbox --tasks click-checkboxes --skills 1.0 0.5 --policies submit-with-nothing-filled \
  uniform-random --episodes 300 --seed 10 --max-steps 5
PLAY="--skills 0.7 0.4 --policies uniform-random uniform-random --max-steps 5"
collect runs/web/random15 --tasks $ALL --episodes 60 --seed 15 $PLAY
collect runs/web/random16 --tasks click-link email-inbox click-tab-2 click-collapsible-2 click-checkboxes enter-text \
  login-user search-engine click-button --episodes 200 --seed 16 $PLAY
collect runs/web/random17 --tasks $ALL --episodes 24 --seed 17 $PLAY
for data in runs/web/random15 runs/web/random16; do
  [ -f "$data-on-web-refit/manifest.json" ] || $PY -m rlvr_gym replay web --data $data --checkpoint web-refit \
    --out "$data-on-web-refit" --overwrite
done
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m rlvr_gym train web-outcome --resume \
  --run-dir runs/web/outcome-replayed --world-model web-refit --data runs/web/target8-button runs/web/target10-button \
  runs/web/target13-button runs/web/target8-checkbox runs/web/target10-checkbox runs/web/trivial4 runs/web/train0 \
  runs/web/random15-on-web-refit runs/web/random16-on-web-refit --eval-data runs/web/random17 --steps 1200 \
  --eval-every 200
$PY - <<'PYTHON'
import torch
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.train.web_outcome import add_outcome_head
card = SHIPPED_DIR / "web-outcome" / "CARD.md"
text = card.read_text() if card.is_file() else ""
add_outcome_head("web-refit", "runs/web/outcome-replayed/final", SHIPPED_DIR / "web-outcome", torch.float16)
card.write_text(text)
PYTHON
