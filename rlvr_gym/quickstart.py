"""`make quickstart`: the main job on the shipped checkpoints, ending in runs/quickstart/report.md.

1. The RLVR trainer on a verifiable task: SFT, then GRPO, on sorting digits (the trainer's own proof).
2. RLVR on the RT-1 video world model: a short GRPO run from the shipped rt1-mle on fresh real episodes, scored
   before and after on other fresh episodes beside the shipped rt1-rlvr (the long run) and the copy-last-frame
   baseline, with a GIF of real vs imagined rollouts.
3. The learned simulator as a Gymnasium env: one episode of `RLVRWorld-RT1-v0` next to the real env.
4. PPO inside the learned simulator (rt1-cotrained, the simulator the co-training loop refit), scored in the real
   env and in the simulator from the same held-out start states.
5. Policy evaluation, learned vs real: a ladder (scripted skills and the PPO agent) scored in the real env and in
   rt1-rlvr and rt1-mle: pearson, MMRV, MAE and scatter plots.
The report opens with a summary of the key numbers and each section's time; the same summary is printed at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rlvr_gym.evaluation.report import markdown_table, plot_curves
from rlvr_gym.files import read_log
from rlvr_gym.train.demo import DemoConfig, run_demo
from rlvr_gym.train.grpo import GRPOConfig

RUN_DIRS = ("demo", "episodes", "rt1_rlvr", "ppo", "policy_eval")
"""What the quickstart writes under out_dir, removed at the start: trainers refuse to start over their own runs."""


@dataclass
class QuickstartConfig:
    out_dir: str = "runs/quickstart"
    """Where the runs and report.md go."""
    demo: DemoConfig = field(default_factory=DemoConfig)
    """The trainer demonstration: SFT then GRPO on an exact-match task."""
    rt1_episodes: int = 6
    """Fresh real tabletop episodes on which the RT-1 world models are scored."""
    rt1_seed: int = 424242
    """Collection seed of those episodes; the RLVR run's episodes use rt1_seed + 1 (neither is used elsewhere)."""
    rlvr_episodes: int = 16
    """Fresh real episodes whose next frames reward the short RLVR run."""
    rlvr: GRPOConfig = field(default_factory=lambda: GRPOConfig(steps=12, lr=5e-5, prompts_per_step=4, group_size=8,
                                                                beta=0.0, temperature=0.5, save_every=100))
    """The short GRPO run from rt1-mle (run_dir, model and max_new_tokens are set by the quickstart); the reward and
    prompts are `train rt1-rlvr`'s defaults, the shipped rt1-rlvr's recipe, at half its 8 prompts per step."""
    ppo_steps: int = 2048
    """Environment steps of PPO inside the learned simulator (summed over sub-envs)."""
    ppo_eval_every: int = 1024
    """Steps between the agent's scorings (in the real env and in the simulator, from the same starts)."""
    ppo_envs: int = 16
    """Sub-envs of the batched learned simulator, one world-model forward pass per step."""
    ppo_task: str = "close_drawer"
    """The task PPO trains and is scored on."""
    ppo_checkpoint: str = "rt1-cotrained"
    """World model the agent trains in: rt1-dynamics refit by the co-training loop on close_drawer agents' real
    episodes, which pays about what the real env pays (its card)."""
    ppo_shaping: float = 0.2
    """Weight of the simulator's shaped reward (`agents.train_sb3 --shaping`), as the loop trains with."""
    ppo_eval_first: int = 500_000
    """First held-out real start of the scorings: past those rt1-cotrained's refits learned from."""
    ppo_eval_episodes: int = 8
    """Held-out real start states the agent is scored from."""
    policy_episodes: int = 2
    """Initial states per task in the policy evaluation (four tasks; 16 shipped per task)."""
    policy_skills: tuple[float, ...] = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
    """Skill levels of the scripted policies on the ladder (the PPO agent is one more rung)."""


@dataclass
class Section:
    title: str
    body: str
    """Markdown below the section's heading."""
    headline: str
    """The key numbers in one line, for the summary."""
    numbers: dict
    """The key numbers, for summary.json."""
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------- sections


def trainer_section(config: QuickstartConfig, out: Path) -> Section:
    summary = run_demo(DemoConfig(**{**vars(config.demo), "run_dir": str(out / "demo")}))
    plot = plot_curves(
        {"sft": out / "demo" / "sft", "grpo": out / "demo" / "grpo"},
        ["eval/exact_match", "reward/mean", "train/entropy"],
        out / "demo_curves.png",
        title="sort-digits: SFT then GRPO (held-out exact match, greedy; steps of each run)",
    )
    rows = [
        {"model": "SFT", "held-out exact match": summary["exact_match_sft"]},
        {"model": "SFT + GRPO", "held-out exact match": summary["exact_match_grpo"]},
    ]
    body = (
        "A small Llama trained from scratch to sort the digits of its prompt: briefly by SFT, then by GRPO on the "
        "exact-match reward. Held-out prompts come from a seed never used in training.\n\n"
        f"{markdown_table(rows)}\n\n![curves]({plot.name})\n"
    )
    headline = f"sort-digits held-out exact match {summary['exact_match_sft']:.2f} (SFT) -> {summary['exact_match_grpo']:.2f} (SFT + GRPO)"
    numbers = {k: summary[k] for k in ("exact_match_sft", "exact_match_grpo")}
    return Section("1. The RLVR trainer on a verifiable task", body, headline, numbers)


def world_model_section(config: QuickstartConfig, out: Path) -> Section:
    from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
    from rlvr_gym.evaluation.robot import evaluate_world_model, rollout_gif, summary_line
    from rlvr_gym.models.robot_world_model import RobotWorldModel
    from rlvr_gym.train.rt1_rlvr import RT1RLVRConfig, run_rt1_rlvr

    data = out / "episodes"
    collect(CollectConfig(out=str(data / "train"), episodes=config.rlvr_episodes, seed=config.rt1_seed + 1, horizon=30))
    collect(CollectConfig(out=str(data / "eval"), episodes=config.rt1_episodes, seed=config.rt1_seed, horizon=30, split="eval"))
    recipe = RT1RLVRConfig(data=str(data / "train"), model="rt1-mle", out=str(out / "rt1_rlvr"),
                           rollout_prompts=config.rlvr.prompts_per_step * config.rlvr.steps, grpo=config.rlvr)
    trained = run_rt1_rlvr(recipe)
    steps = config.rlvr.steps
    names = {"before": "rt1-mle (start)", "after": f"rt1-mle + {steps} GRPO steps (this run)",
             "shipped": "rt1-rlvr (shipped long run)"}
    worlds = {names["before"]: RobotWorldModel.load("rt1-mle"), names["after"]: RobotWorldModel.load(trained),
              names["shipped"]: RobotWorldModel.load("rt1-rlvr")}
    episodes = load_episodes(data / "eval")
    lines = {name: summary_line(evaluate_world_model(world, episodes, horizon=5))
             for name, world in tqdm(worlds.items(), desc="score world models", unit="model", leave=False)}
    (out / "rt1_eval.json").write_text(json.dumps(lines, indent=2))
    before, after, shipped = (lines[names[k]] for k in ("before", "after", "shipped"))
    rows = [{"model": "copy last real frame", "psnr": before["copy_last_frame_psnr"],
             "changed_mse": before["copy_last_frame_changed_mse"], "object_error_px": before["copy_last_frame_object_error_px"]}]
    rows += [{"model": name, "psnr": l["psnr"], "lpips": l["lpips"], "changed_mse": l["single_changed_mse"],
              "object_error_px": l["single_object_error_px"], "5-step lpips": l["multi_lpips"],
              "5-step repetition": l["multi_repetition_rate"]} for name, l in lines.items()]
    columns = ["model", "psnr", "lpips", "changed_mse", "object_error_px", "5-step lpips", "5-step repetition"]
    log = [r for r in read_log(out / "rt1_rlvr") if "reward/mean" in r]
    first_reward, last_reward = log[0]["reward/mean"], log[-1]["reward/mean"]
    curve = plot_curves({"this run": out / "rt1_rlvr"}, ["reward/mean", "reward/lpips", "reward/l1", "reward/object"],
                        out / "rt1_rlvr_reward.png",
                        title=f"GRPO from rt1-mle, single-frame rollouts (sampled at temperature {config.rlvr.temperature:g})")
    gif = rollout_gif(worlds, max(episodes, key=len), 12, out / "rt1_rollouts.gif")
    body = (
        f"GRPO from the shipped `rt1-mle` for {steps} steps ({config.rlvr.prompts_per_step} prompts x "
        f"{config.rlvr.group_size} single-frame rollouts, the prompts up to {recipe.rollout_depth} frames deep into "
        f"rt1-mle's own rollouts) on {config.rlvr_episodes} fresh real episodes, the shipped rt1-rlvr's recipe: reward "
        f"-(L1 + LPIPS) of the decoded frame against the real one, less {recipe.object_weight:g} x the object "
        f"term and {recipe.repetition_penalty:g} per false repetition. The mean reward is sampled on different "
        "prompts each step, so its curve says more about the prompts than about the model; the held-out episodes "
        f"below are the comparison:\n\n![reward]({curve.name})\n\n"
        f"Scored greedily on {len(episodes)} other fresh episodes (seed {config.rt1_seed}): single-step predictions from the "
        "real history, and 5-step rollouts with the real actions spliced between generated frames. `changed_mse` is the "
        "MSE on the pixels that changed, `object_error_px` the error of object positions read from the frames. "
        "A few steps move the model little; the shipped `rt1-rlvr` is the long run (its command and metrics are in "
        "`rlvr_gym/checkpoints/rt1-rlvr/CARD.md`).\n\n"
        f"{markdown_table(rows, columns, digits=4)}\n\n"
        f"Real (left), then {', '.join(worlds)}, imagined from the first frame under the real actions: ![rollouts]({gif.name})\n"
    )
    headline = (f"held-out LPIPS, single step / 5 steps: rt1-mle {before['lpips']:.4f} / {before['multi_lpips']:.4f}, "
                f"after {steps} GRPO steps {after['lpips']:.4f} / {after['multi_lpips']:.4f} (shipped rt1-rlvr "
                f"{shipped['lpips']:.4f} / {shipped['multi_lpips']:.4f})")
    numbers = {"grpo_steps": steps, "reward_first_step": first_reward, "reward_last_step": last_reward,
               **{f"{k}_{key}": l[metric] for k, l in (("before", before), ("after", after), ("shipped", shipped))
                  for key, metric in (("lpips", "lpips"), ("psnr", "psnr"), ("multi_lpips", "multi_lpips"))}}
    return Section("2. RLVR on the RT-1 video world model", body, headline, numbers)


def simulator_section(config: QuickstartConfig, out: Path) -> Section:
    """One episode imagined by RLVRWorld-RT1-v0 next to the real env from the same initial state and actions."""
    import gymnasium as gym
    from PIL import Image

    import rlvr_gym  # noqa: F401  (registers the env ids)
    from envs.robot import make_scripted_policy
    from rlvr_gym.data.robot import load_initial_states
    from rlvr_gym.models.robot_world_model import RobotWorldModel

    sim = gym.make("RLVRWorld-RT1-v0")
    obs, info = sim.reset(seed=0)
    # The initial states remember the real-env seed they were recorded with: the real env starts where the sim does.
    states = load_initial_states(RobotWorldModel.resolve("rt1-rlvr"))
    real = gym.make("RealRT1-v0", task=info["task"])
    real_obs, real_info = real.reset(seed=int(states.seeds[info["initial_state"]]))
    policy = make_scripted_policy(info["task"], skill=1.0, seed=0)
    # The expert acts on the real state until the real episode ends; the simulator gets the same actions until it
    # ends itself (its last frame is shown after that), so the two verdicts and their steps can be compared.
    pairs, total, sim_end, real_end, best = [np.concatenate([real_obs, obs], 0)], 0.0, None, None, 0.0
    for step in range(1, real.unwrapped.horizon + 1):
        action = policy(real_obs, real_info)
        if sim_end is None:
            obs, reward, terminated, truncated, info = sim.step(action)
            total, best = total + reward, max(best, info["success_prob"])
            sim_end = step if terminated or truncated else None
        real_obs, _, real_done, real_truncated, real_info = real.step(action)
        pairs.append(np.concatenate([real_obs, obs], 0))
        if real_done or real_truncated:
            real_end = step
            break
    shown = [pairs[i] for i in np.unique(np.linspace(0, len(pairs) - 1, min(8, len(pairs))).round().astype(int))]
    Image.fromarray(np.concatenate(shown, 1)).resize((128 * len(shown), 256), Image.NEAREST).save(out / "sim_episode.png")
    sim.close()
    real.close()
    real_outcome = f"succeeded at step {real_end}" if real_info["success"] else f"did not succeed in {real_end} steps"
    if total > 0:
        sim_outcome = (f"called success at step {sim_end} (success probability {info['success_prob']:.3g}, above its "
                       f"calibrated threshold {info['success_threshold']:.3g} for `{info['task']}`)")
    else:
        sim_outcome = (f"did not call success in {sim_end or real_end} steps (highest success probability {best:.3g}, "
                       f"its threshold {info['success_threshold']:.3g})")
    body = (
        "`gym.make(\"RLVRWorld-RT1-v0\")` (the shipped RLVR model) and the real env, from the same initial state, "
        f"stepped with an expert's actions for `{info['task']}` (the expert reads the real state): the real env "
        f"{real_outcome}; the simulator {sim_outcome}. Top row real, bottom row imagined (the simulator's last frame "
        "stays once it has ended):\n\n![imagined episode](sim_episode.png)\n"
    )
    verdict = f"success at step {sim_end}" if total > 0 else "no success"
    headline = f"`{info['task']}`, expert actions: real env {real_outcome}, simulator {verdict}"
    numbers = {"task": info["task"], "real_steps": real_end, "sim_steps": sim_end, "sim_reward": total,
               "real_success": bool(real_info["success"])}
    return Section("3. The learned simulator as a Gymnasium env", body, headline, numbers)


def ppo_command(config: QuickstartConfig, run_dir: Path) -> list[str]:
    """The agent trainer's command line for the quickstart's PPO run."""
    return [sys.executable, "-m", "agents.train_sb3", "--env", "RLVRWorld-RT1-v0", "--algo", "ppo",
            "--steps", str(config.ppo_steps), "--checkpoint", config.ppo_checkpoint, "--num-envs", str(config.ppo_envs),
            "--task", config.ppo_task, "--shaping", str(config.ppo_shaping), "--eval-every", str(config.ppo_eval_every),
            "--eval-episodes", str(config.ppo_eval_episodes), "--eval-first", str(config.ppo_eval_first), "--eval-learned",
            "--out", str(run_dir)]


def last_json_line(text: str) -> dict:
    """The JSON object on the last non-empty line of a command's output."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the command printed nothing; its result line is missing")
    return json.loads(lines[-1])


def ppo_section(config: QuickstartConfig, out: Path) -> Section:
    run_dir = out / "ppo"
    # agents/ consumes rlvr_gym, never the reverse: the main job runs the agent trainer as its command.
    command = ppo_command(config, run_dir)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"the PPO run `{' '.join(command)}` failed with exit status "
                           f"{done.returncode}; its error is printed above")
    result = last_json_line(done.stdout)
    scorings = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    real = result["real"]
    rows = [{"steps": e["step"], "real success": e["success_rate"], "success in the simulator": e["learned_success_rate"],
             "real episode length": e["mean_length"]} for e in scorings]
    body = (
        f"`{' '.join(['python', *command[1:-2]])}`: PPO (MLP on 32x32 frames) trained only inside the learned "
        f"simulator {config.ppo_checkpoint}, {config.ppo_envs} sub-envs stepped by one batched world-model pass at "
        f"{result['steps_per_s']:.0f} steps/s, its reward shaped by the change in the simulator's odds of success. "
        f"Every {config.ppo_eval_every} steps it is scored greedily from {real['episodes']} held-out start states past "
        f"those {config.ppo_checkpoint} learned from, in the real MuJoCo tabletop and in the simulator (from each "
        "start's real first frame):\n\n"
        + markdown_table(rows) + "\n\n"
        + ("rt1-cotrained is rt1-dynamics after the co-training loop (`rlvr-gym train agent`) refit it on close_drawer "
           "agents' real episodes: an agent trained in it works in the real env, and the simulator pays it about what "
           "the real env does. Inside rt1-dynamics, the same simulator before the refits, PPO agents trained on this "
           "task were paid 12 to 31 points more success than the real env gave them (README, Results). "
           if config.ppo_checkpoint == "rt1-cotrained" else "")
        + "The agent is the last rung of the policy-evaluation ladder below. TensorBoard logs and progress.csv are in "
        "`ppo/`.\n"
    )
    headline = (f"{result['steps']} steps inside {config.ppo_checkpoint}: real success {real['success_rate']:.2f}, "
                f"simulator {real['learned_success_rate']:.2f}, on {real['episodes']} held-out starts "
                f"(`{config.ppo_task}`)")
    numbers = {"steps": result["steps"], "steps_per_s": result["steps_per_s"], "real_success": real["success_rate"],
               "learned_success": real["learned_success_rate"], "model": result["model"]}
    return Section("4. PPO inside the learned simulator", body, headline, numbers)


def policy_section(config: QuickstartConfig, out: Path, agent: str) -> Section:
    """The ladder (scripted skills and the PPO agent at `agent`) in the real env and in rt1-rlvr and rt1-mle."""
    from rlvr_gym.evaluation.policies import RT1PolicyEvalConfig, run_rt1_policy_eval

    results = {name: run_rt1_policy_eval(RT1PolicyEvalConfig(
                   checkpoint=name, episodes=config.policy_episodes, skills=config.policy_skills,
                   sb3=(f"ppo:{agent}",), out=str(out / "policy_eval" / name)))
               for name in tqdm(("rt1-rlvr", "rt1-mle"), desc="policy evaluation", unit="world model", leave=False)}
    first = next(iter(results.values()))
    rows = [{"policy": "quickstart PPO" if policy.startswith("ppo:") else policy, "real": p["real"],
             **{f"learned: {name}": r["policies"][policy]["learned"] for name, r in results.items()}}
            for policy, p in first["policies"].items()]
    metrics = [{"world model": name, "pearson": r["pearson"], "mmrv": r["mmrv"], "mae": r["mae"]} for name, r in results.items()]
    plots = " ".join(f"![{name}](policy_eval/{name}/scatter.png)" for name in results)
    body = (
        f"Each policy runs from the same {config.policy_episodes} initial states per task ({len(first['per_task'])} tasks) "
        "in the real env and "
        "in the learned env, whose success the world model decides itself (the shipped ones read the state off the frames "
        "they show). Scripted policies act on the "
        "true state, so the learned env replays their real actions open loop; the PPO agent acts on frames in both. "
        "Success rates per policy:\n\n"
        f"{markdown_table(rows)}\n\n{markdown_table(metrics)}\n\n"
        "Pearson r (higher is better) and MMRV (SIMPLER's mean maximum rank violation, lower is better) say whether the "
        f"learned env ranks the policies as the real one does. With {config.policy_episodes} episode(s) per task the "
        "rates are coarse; `rlvr-gym evaluate-policies rt1 --episodes 16` is the full run. Per-task tables are in "
        f"`policy_eval/*/table.md`.\n\n{plots}\n"
    )
    headline = "; ".join(f"{name}: pearson {r['pearson']:.2f}, mmrv {r['mmrv']:.2f}, mae {r['mae']:.2f}" for name, r in results.items())
    numbers = {name: {k: r[k] for k in ("pearson", "mmrv", "mae")} for name, r in results.items()}
    return Section("5. Policy evaluation: learned vs real", body, headline, numbers)


# ---------------------------------------------------------------------------------------------------- the job


def summary_markdown(sections: list[Section], total_seconds: float) -> str:
    """The table of key numbers and times that opens the report and ends the run."""
    rows = [{"section": s.title, "result": s.headline, "time": f"{s.seconds:.0f} s"} for s in sections]
    return f"{markdown_table(rows)}\n\nTotal time: {total_seconds:.0f} s ({total_seconds / 60:.1f} min).\n"


def timed(make: Callable[..., Section], *args) -> Section:
    begun = time.perf_counter()
    section = make(*args)
    section.seconds = time.perf_counter() - begun
    return section


def run_quickstart(config: QuickstartConfig) -> Path:
    """Run every section with progress bars, write report.md and summary.json, print the summary; returns the report."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
    started = time.perf_counter()
    sections: list[Section] = []
    with tqdm(total=5, desc="quickstart", unit="section") as bar:
        for make in (trainer_section, world_model_section, simulator_section, ppo_section):
            sections.append(timed(make, config, out))
            bar.update()
        sections.append(timed(policy_section, config, out, sections[-1].numbers["model"]))
        bar.update()
    total = time.perf_counter() - started
    summary = summary_markdown(sections, total)
    report = out / "report.md"
    report.write_text("# rlvr-gym quickstart\n\n## Summary\n" + summary + "".join(f"\n## {s.title}\n{s.body}" for s in sections))
    (out / "summary.json").write_text(json.dumps(
        {"total_seconds": total, "sections": {s.title: {"seconds": s.seconds, **s.numbers} for s in sections}}, indent=2))
    print(f"\nrlvr-gym quickstart: summary\n\n{summary}")
    return report
