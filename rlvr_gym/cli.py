"""`rlvr-gym COMMAND [SUBCOMMAND] --flags`: every command's flags are generated from its config dataclass.

Under torchrun: `torchrun --nproc-per-node 2 -m rlvr_gym train ...` (each process runs the same command).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rlvr_gym.logs import configure_logging  # noqa: E402

# Command words -> (module, config dataclass, function taking it, one-line help). Modules are imported only for
# the command that runs: startup stays fast, and a command never needs another's optional extras (web: selenium).
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "quickstart": ("rlvr_gym.quickstart", "QuickstartConfig", "run_quickstart", "the main job on embedded defaults, with a report"),
    "demo": ("rlvr_gym.train.demo", "DemoConfig", "run_demo", "SFT then GRPO on the sort-digits task: the trainer's proof that it learns"),
    "collect rt1": ("rlvr_gym.data.episodes", "CollectConfig", "collect",
                    "record episodes of the MuJoCo tabletop under scripted and random policies"),
    "probe rt1": ("rlvr_gym.evaluation.probe", "ProbeConfig", "probe_rt1",
                  "trivial and adversarial policies in the learned and the real tabletop: false success per policy"),
    "probe textgame": ("rlvr_gym.evaluation.probe", "TextProbeConfig", "probe_textgame",
                       "trivial policies in the learned and the real TextWorld games: false success per policy"),
    "probe web": ("rlvr_gym.evaluation.probe", "WebProbeConfig", "probe_web",
                  "trivial and adversarial policies on learned and real MiniWoB++ pages: false success per policy"),
    "data bytesized32": ("rlvr_gym.data.bytesized32", "DataConfig", "install_data",
                         "check and install the ByteSized32 data where the text-game commands find it"),
    "import rt1": ("rlvr_gym.data.rlds", "ImportConfig", "import_rt1",
                   "convert Open X-Embodiment RT-1 RLDS TFRecords into episode shards (no TensorFlow)"),
    "train tokenizer": ("rlvr_gym.train.frame_tokenizer", "TokenizerConfig", "train_frame_tokenizer",
                        "train the frame tokenizer (FSQ, context-conditioned)"),
    "train refiner": ("rlvr_gym.train.refiner", "RefinerConfig", "train_motion_refiner",
                      "train a world model's motion refiner on its transformer's own predictions"),
    "train state-reader": ("rlvr_gym.train.state_reader", "ReaderConfig", "train_state_reader",
                           "train a world model's state reader, which its simulator decides success from"),
    "train state-dynamics": ("rlvr_gym.train.state_dynamics", "DynamicsConfig", "train_state_dynamics",
                             "fit an ensemble to the tabletop's true state dynamics; scores open-loop success"),
    "train rt1-mle": ("rlvr_gym.train.rt1_mle", "RT1MLEConfig", "run_rt1_mle", "train the video world model by maximum likelihood"),
    "train rt1-rlvr": ("rlvr_gym.train.rt1_rlvr", "RT1RLVRConfig", "run_rt1_rlvr",
                       "post-train the video world model with GRPO on -(L1 + LPIPS)"),
    "calibrate rt1": ("rlvr_gym.sim.robot", "CalibrateConfig", "calibrate",
                      "set a world model's per-task success thresholds from replays of training episodes"),
    "imagine rt1": ("rlvr_gym.sim.robot", "ImagineConfig", "imagine",
                    "write real episodes with the frames a world model draws for their actions (a reader's data)"),
    "eval rt1": ("rlvr_gym.evaluation.robot", "RT1EvalConfig", "run_rt1_eval",
                 "score a video world model on fresh real episodes; prints one JSON line"),
    "collect textworld": ("rlvr_gym.data.textgame", "TextWorldCollectConfig", "run_collect_textworld",
                          "play generated TextWorld games and write ByteSized32-format transitions"),
    "train textgame-sft": ("rlvr_gym.train.textgame", "TextGameSFTConfig", "run_textgame_sft",
                           "SFT a text-game world model: (state, action) -> diff, BPE tokenizer trained on the data"),
    "train textgame-rlvr": ("rlvr_gym.train.textgame", "TextGameRLVRConfig", "run_textgame_rlvr",
                            "GRPO a text-game world model on the binary or task reward"),
    "eval textgame": ("rlvr_gym.evaluation.textgame", "TextGameEvalConfig", "run_textgame_eval",
                      "text-game accuracy (overall / changed / unchanged) vs the no-change baseline; one JSON line"),
    "collect web": ("rlvr_gym.data.web_collect", "WebCollectConfig", "collect_web",
                    "record real MiniWoB++ transitions in Chromium with scripted policies"),
    "train web-sft": ("rlvr_gym.train.web", "WebSFTConfig", "run_web_sft",
                      "SFT the web world model (BPE trained on the data, or a local HF causal LM)"),
    "train web-rlvr": ("rlvr_gym.train.web", "WebRLVRConfig", "run_web_rlvr", "GRPO the web world model on the item-F1 web reward"),
    "replay web": ("rlvr_gym.sim.web_replay", "ReplayConfig", "replay_web",
                   "real web episodes replayed on a world model's pages, with their real outcomes (outcome-head data)"),
    "train web-outcome": ("rlvr_gym.train.web_outcome", "OutcomeConfig", "train_web_outcome",
                          "train a web world model's outcome head, which its simulator's reward and done come from"),
    "evaluate-policies rt1": ("rlvr_gym.evaluation.policies", "RT1PolicyEvalConfig", "run_rt1_policy_eval",
                              "a ladder of policies scored in the real and the learned RT-1 env: pearson, mmrv, mae"),
    "evaluate-policies textgame": ("rlvr_gym.evaluation.textgame_policies", "TextGamePolicyEvalConfig",
                                   "run_textgame_policy_eval",
                                   "a ladder of text policies scored in real TextWorld and the learned text env"),
    "collect text-agents": ("agents.cotrain", "RecordPlayConfig", "record_play",
                            "record trained text agents' (or random) play in the real games, as a refit's data"),
    "train agent": ("agents.cotrain", "CoTrainConfig", "run_cotrain",
                    "co-training: an SB3 agent in a learned sim that its own real experience refits (MLE + GRPO)"),
    "ship": ("rlvr_gym.ship", "ShipConfig", "ship",
             "fp16 copy of a text or web world model with the real start states its learned env resets to"),
    "export": ("rlvr_gym.integrations.export", "ExportConfig", "export",
               "write text-game, web or rt1 training data for TRL (HF dataset) or verl (parquet)"),
    "eval web": ("rlvr_gym.evaluation.web", "WebEvalConfig", "run_web_eval",
                 "web world model on fresh real transitions, seen vs held-out tasks, with the no-change baseline"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: rlvr-gym COMMAND [--help] [--flags]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {entry[-1]}" for name, entry in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    # The longest run of leading words that names a command ("train textgame-sft" before "train").
    for n in range(min(3, len(argv)), 0, -1):
        name = " ".join(argv[:n])
        if name in COMMANDS:
            break
    else:
        print(usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        raise SystemExit(0 if not argv or argv[0] in ("-h", "--help") else 2)
    module_name, config_name, fn_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    config = tyro.cli(getattr(module, config_name), args=argv[n:], prog=f"rlvr-gym {name}", description=help_)
    fn = getattr(module, fn_name)
    result = fn(config)
    if isinstance(result, dict):
        print(json.dumps(result))
    elif result is not None:
        print(result)


if __name__ == "__main__":
    main()
