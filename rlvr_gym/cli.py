"""`rlvr-gym COMMAND [SUBCOMMAND] --flags`: every command's flags are generated from its config dataclass.

Under torchrun: `torchrun --nproc-per-node 2 -m rlvr_gym train ...` (each process runs the same command).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def commands() -> dict[str, tuple[type, Callable, str]]:
    """Command words -> (config dataclass, function taking it, one-line help). Imported lazily: startup stays fast."""
    from rlvr_gym.data.episodes import CollectConfig, collect
    from rlvr_gym.data.rlds import ImportConfig, import_rt1
    from rlvr_gym.evaluation.robot import RT1EvalConfig, run_rt1_eval
    from rlvr_gym.evaluation.textgame import TextGameEvalConfig, run_textgame_eval
    from rlvr_gym.evaluation.web import WebEvalConfig, run_web_eval
    from rlvr_gym.train import textgame, web
    from rlvr_gym.quickstart import QuickstartConfig, run_quickstart
    from rlvr_gym.train import robot
    from rlvr_gym.train.demo import DemoConfig, run_demo

    return {
        "quickstart": (QuickstartConfig, run_quickstart, "the main job on embedded defaults, with a report"),
        "demo": (DemoConfig, run_demo, "SFT then GRPO on the sort-digits task: the trainer's proof that it learns"),
        "collect rt1": (CollectConfig, collect, "record episodes of the MuJoCo tabletop under scripted and random policies"),
        "import rt1": (ImportConfig, import_rt1, "convert Open X-Embodiment RT-1 RLDS TFRecords into episode shards (no TensorFlow)"),
        "train tokenizer": (robot.TokenizerConfig, robot.train_frame_tokenizer, "train the frame tokenizer (FSQ, context-conditioned)"),
        "train rt1-mle": (robot.RT1MLEConfig, robot.run_rt1_mle, "train the video world model by maximum likelihood"),
        "train rt1-rlvr": (robot.RT1RLVRConfig, robot.run_rt1_rlvr, "post-train the video world model with GRPO on -(L1 + LPIPS)"),
        "eval rt1": (RT1EvalConfig, run_rt1_eval, "score a video world model on fresh real episodes; prints one JSON line"),
        "collect textworld": (textgame.TextWorldCollectConfig, textgame.run_collect_textworld,
                              "play generated TextWorld games and write ByteSized32-format transitions"),
        "train textgame-sft": (textgame.TextGameSFTConfig, textgame.run_textgame_sft,
                               "SFT a text-game world model: (state, action) -> diff, BPE tokenizer trained on the data"),
        "train textgame-rlvr": (textgame.TextGameRLVRConfig, textgame.run_textgame_rlvr,
                                "GRPO a text-game world model on the binary or task reward"),
        "eval textgame": (TextGameEvalConfig, run_textgame_eval,
                          "text-game accuracy (overall / changed / unchanged) vs the no-change baseline; one JSON line"),
        "collect web": (web.WebCollectConfig, web.collect_web, "record real MiniWoB++ transitions in Chromium with scripted policies"),
        "train web-sft": (web.WebSFTConfig, web.run_web_sft, "SFT the web world model (BPE trained on the data, or a local HF causal LM)"),
        "train web-rlvr": (web.WebRLVRConfig, web.run_web_rlvr, "GRPO the web world model on the item-F1 web reward"),
        "eval web": (WebEvalConfig, run_web_eval, "web world model on fresh real transitions, seen vs held-out tasks, with the no-change baseline"),
    }


def usage(table: dict) -> str:
    width = max(map(len, table))
    lines = ["usage: rlvr-gym COMMAND [--help] [--flags]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in table.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    table = commands()
    # The longest run of leading words that names a command ("train textgame-sft" before "train").
    for n in range(min(3, len(argv)), 0, -1):
        name = " ".join(argv[:n])
        if name in table:
            break
    else:
        print(usage(table), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        raise SystemExit(0 if not argv or argv[0] in ("-h", "--help") else 2)
    config_cls, fn, help_ = table[name]
    config = tyro.cli(config_cls, args=argv[n:], prog=f"rlvr-gym {name}", description=help_)
    result = fn(config)
    if isinstance(result, dict):
        print(json.dumps(result))
    elif result is not None:
        print(result)


if __name__ == "__main__":
    main()
