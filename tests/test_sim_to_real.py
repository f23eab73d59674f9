"""The sim-to-real benchmark's cache: an arm's saved curve is reused exactly when what it depends on is unchanged."""

import argparse
import json
import shutil
from dataclasses import asdict, replace

import pytest

from agents.cotrain import TEXT_ENV, CoTrainConfig, check_config
from bench.sim_to_real import arm_key, arm_label, cached, loop_dir


def test_a_real_arm_depends_on_the_agent_and_scoring_a_frozen_one_on_the_world_too(tmp_path):
    (tmp_path / "world_model.json").write_text(json.dumps({"settings": {"success_hold": 1}}))
    config = CoTrainConfig(checkpoint=str(tmp_path), task="close_drawer", seed=0)
    loop_only = replace(config, mle_steps=5, grpo_steps=0, out="elsewhere", recalibrate=False)
    assert arm_key(replace(config, agent_share=0.5), "frozen") == arm_key(config, "frozen"), "the loop's refits only"
    # A tabletop real arm never touches the world model or the refits.
    assert arm_key(config, "real-1x", budget=100) == arm_key(loop_only, "real-1x", budget=100)
    for other in (replace(config, seed=1), replace(config, task="open_drawer"), replace(config, eval_episodes=4)):
        assert arm_key(other, "real-1x", budget=100) != arm_key(config, "real-1x", budget=100)
    assert arm_key(config, "real-1x", budget=100) != arm_key(config, "real-1x", budget=200)
    # The frozen arm trains in the world model: a new threshold or hold in the same directory is a new curve.
    frozen = arm_key(config, "frozen")
    # So does the simulator's precision; a float32 curve keeps the key it had before the setting existed.
    half = replace(config, precision="bfloat16")
    assert arm_key(half, "frozen") == {**frozen, "precision": "bfloat16"} and "precision" not in frozen
    assert arm_key(half, "real-1x", budget=100) == arm_key(config, "real-1x", budget=100)
    # A reach term shapes every arm's reward, real ones too; a curve without one keeps its key.
    assert arm_key(replace(config, uncertainty_penalty=0.1), "frozen") == {**frozen, "uncertainty_penalty": 0.1}
    assert "uncertainty_penalty" not in frozen
    reach = replace(config, reach=5.0)
    assert arm_key(reach, "frozen") == {**frozen, "reach": 5.0} and "reach" not in frozen
    assert arm_key(reach, "real-1x", budget=100) == {**arm_key(config, "real-1x", budget=100), "reach": 5.0}
    on_state = replace(config, observation="state")
    assert arm_key(on_state, "frozen") == {**frozen, "observation": "state"} and "observation" not in frozen
    assert arm_key(on_state, "real-1x", budget=100) == {**arm_key(config, "real-1x", budget=100),
                                                         "observation": "state"}
    assert frozen != arm_key(loop_only, "frozen")
    (tmp_path / "world_model.json").write_text(json.dumps({"settings": {"success_hold": 2}}))
    assert arm_key(config, "frozen") != frozen
    # The text games' real arm plays the world's own start states, so it depends on the world as well.
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")  # resolved, never loaded
    text = replace(config, env=TEXT_ENV, algo="dqn")
    before = arm_key(text, "real-1x", budget=100)
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    assert arm_key(text, "real-1x", budget=100) != before
    # New weights under the same settings are a new world too.
    before = arm_key(text, "real-1x", budget=100)
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    assert arm_key(text, "real-1x", budget=100) != before
    # Nor does where the loop runs, whether it learns from its real steps, how its refits weight their data or whether
    # its agent pretrains change the other arms; but the frozen arm pretrains as long as the loop's agent.
    dyna = replace(text, out="elsewhere", real_updates=True, win_share=0.2, surprise_on="outcome")
    assert arm_key(dyna, "real-1x", budget=100) == arm_key(text, "real-1x", budget=100)
    assert arm_key(dyna, "frozen") == arm_key(text, "frozen")
    pretrained = replace(text, pretrain_steps=64)
    assert arm_key(pretrained, "real-1x", budget=100) == arm_key(text, "real-1x", budget=100)
    assert arm_key(pretrained, "frozen") == {**arm_key(text, "frozen"), "pretrain_steps": 64}
    # Whether scorings are data changes a real-env arm, which then learns from its own, not the frozen arm.
    assert arm_key(replace(text, score_data=True), "real-1x", budget=100) != arm_key(text, "real-1x", budget=100)
    assert arm_key(replace(text, score_data=True), "frozen") == arm_key(text, "frozen")


def test_simulator_arms_of_another_world_or_a_shaped_reward_keep_their_own_directory():
    args = argparse.Namespace(checkpoint="rt1-rlvr", text_checkpoint="textgame-rlvr", shaping=0.0, reach=0.0,
                              observation="frame", agent_share=0.0, uncertainty_penalty=0.0, dynamics_steps=200,
                              real_updates=False,
                              win_share=0.0, surprise_on="state", text_replay="", pretrain_steps=0,
                              pretrain_checkpoint="", score_data=False, text_algo="dqn")
    assert arm_label("close_drawer", args) == "close_drawer"
    assert arm_label("text", args) == "text"
    assert arm_label("close_drawer", replace_args(args, shaping=0.2)) == "close_drawer+shaping0.2"
    assert arm_label("open_drawer", replace_args(args, shaping=0.2, reach=5.0)) == "open_drawer+shaping0.2+reach5"
    assert arm_label("text", replace_args(args, reach=5.0)) == "text"
    assert arm_label("open_drawer", replace_args(args, shaping=0.2, reach=5.0, observation="state")) \
        == "open_drawer+shaping0.2+reach5+state"
    assert arm_label("open_drawer", replace_args(args, agent_share=0.5, uncertainty_penalty=0.05, dynamics_steps=600)) \
        == "open_drawer+agent0.5+penalty0.05+dynamics600"
    assert arm_label("close_drawer", replace_args(args, checkpoint="runs/x/world")) == "close_drawer+runs_x_world"
    assert arm_label("text", replace_args(args, shaping=0.2)) == "text"  # the text sim takes no shaping
    assert arm_label("text", replace_args(args, text_checkpoint="runs/y/final")) == "text+runs_y_final"
    assert arm_label("text", replace_args(args, text_checkpoint="runs/z/final")) == "text+runs_z_final"
    assert arm_label("text", replace_args(args, real_updates=True)) == "text+real-updates"
    assert arm_label("close_drawer", replace_args(args, real_updates=True)) == "close_drawer+real-updates"
    text_refits = replace_args(args, real_updates=True, win_share=0.2, surprise_on="outcome")
    assert arm_label("text", text_refits) == "text+real-updates+win0.2+surprise-outcome"
    assert arm_label("close_drawer", text_refits) == "close_drawer+real-updates"  # the tabletop refits take neither
    assert arm_label("text", replace_args(text_refits, text_replay="runs/textworld/train/transitions.jsonl.gz")) \
        == "text+real-updates+win0.2+surprise-outcome+replay"
    assert arm_label("text", replace_args(args, pretrain_steps=4096)) == "text+pretrain4096"
    assert arm_label("text", replace_args(text_refits, text_algo="ppo")) \
        == "text+real-updates+ppo+win0.2+surprise-outcome"
    assert arm_label("close_drawer", replace_args(args, text_algo="ppo")) == "close_drawer"  # the tabletop is PPO's
    assert arm_label("text", replace_args(args, pretrain_steps=4096, score_data=True)) == "text+pretrain4096+score-data"
    assert arm_label("text", replace_args(args, pretrain_steps=4096, pretrain_checkpoint="textgame-rlvr",
                                          text_checkpoint="runs/y/final")) \
        == "text+pretrain4096-in-textgame-rlvr+runs_y_final"


def replace_args(args: argparse.Namespace, **changes) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def test_a_cached_curve_is_read_for_its_own_settings_from_its_file_or_the_older_one(tmp_path):
    computed = []

    def compute():
        computed.append(1)
        return [{"real_steps_total": 10, "real_success": 0.5}]

    older = tmp_path / "real-1x-0.json"
    older.write_text(json.dumps({"key": {"budget": 100}, "points": [{"real_steps_total": 100, "real_success": 1.0}]}))
    assert cached(tmp_path / "real-1x-0-100steps.json", {"budget": 100}, compute, older)[0]["real_success"] == 1.0
    assert not computed
    # Another budget is another curve, kept in its own file beside the first.
    assert cached(tmp_path / "real-1x-0-200steps.json", {"budget": 200}, compute, older)[0]["real_success"] == 0.5
    assert cached(tmp_path / "real-1x-0-200steps.json", {"budget": 200}, compute, older)[0]["real_success"] == 0.5
    assert computed == [1] and json.loads(older.read_text())["key"] == {"budget": 100}
    # A curve whose final agent is kept beside it is computed again when the agent is missing.
    agent = tmp_path / "real-1x-0-200steps.zip"
    assert cached(tmp_path / "real-1x-0-200steps.json", {"budget": 200}, compute, beside=agent)[0]["real_success"] == 0.5
    assert computed == [1, 1]
    agent.write_bytes(b"agent")
    assert cached(tmp_path / "real-1x-0-200steps.json", {"budget": 200}, compute, beside=agent)[0]["real_success"] == 0.5
    assert computed == [1, 1]


def test_a_loop_with_other_settings_runs_in_its_own_directory_and_an_older_run_of_the_same_is_resumed(tmp_path):
    config = CoTrainConfig(env=TEXT_ENV, algo="dqn", sim_steps=1024, seed=1)
    first = loop_dir(tmp_path, "loop", config)
    assert first.name.startswith("loop-1-")
    assert loop_dir(tmp_path, "loop", replace(config, rounds=5, out="elsewhere")) == first  # rounds may grow
    for other in (replace(config, sim_steps=4096), replace(config, replay="runs/textworld/train"),
                  replace(config, grpo_steps=0), replace(config, mle_steps=200)):
        assert loop_dir(tmp_path, "loop", other) != first
    assert loop_dir(tmp_path, "loop", replace(config, seed=2)).name.startswith("loop-2-")
    # A run an earlier version kept at loop-SEED is resumed when its recorded settings (old ones missing from its
    # config.json counting as their defaults) are these, and left alone otherwise.
    older = tmp_path / "loop-1"
    older.mkdir()
    recorded = {k: v for k, v in asdict(config).items() if k != "win_share"}
    (older / "config.json").write_text(json.dumps({**recorded, "out": str(older), "rounds": 3}))
    assert loop_dir(tmp_path, "loop", config) == older
    assert loop_dir(tmp_path, "loop", replace(config, sim_steps=4096)) != older
    # So is a loop-SEED-DIGEST run begun before a setting existed (its digest taken without it).
    shutil.rmtree(older)
    digested = tmp_path / "loop-1-0123abcd"
    digested.mkdir()
    recorded = {k: v for k, v in asdict(config).items() if k != "pretrain_steps"}
    (digested / "config.json").write_text(json.dumps({**recorded, "out": str(digested)}))
    assert loop_dir(tmp_path, "loop", config) == digested
    assert loop_dir(tmp_path, "loop", replace(config, pretrain_steps=64)) not in (digested, first)
    assert loop_dir(tmp_path, "loop-mle", config).name.startswith("loop-mle-1-")


def test_the_report_reads_sample_efficiency_off_the_seeds_mean_curve(tmp_path, monkeypatch):
    import bench.sim_to_real as bench

    def curve(*points):
        return [{"real_steps_total": steps, "real_success": success, "learned_success": success}
                for steps, success in points]

    # Seed 1 alone never reaches the real env's final 0.5; the mean of both does after their first round.
    runs = {"text": {0: {"loop": curve((400, 0.8), (900, 0.8)), "real-1x": curve((500, 0.0), (1500, 0.6))},
                     1: {"loop": curve((500, 0.3), (1000, 0.4)), "real-1x": curve((500, 0.0), (1500, 0.4))}}}
    assert bench.mean_curve([runs["text"][0]["loop"], runs["text"][1]["loop"][:1]]) == \
        [{"real_steps_total": 450, "real_success": 0.55}]
    monkeypatch.setattr(bench, "OUT", tmp_path)
    args = argparse.Namespace(arms=["loop", "real-1x"], seeds=[0, 1], checkpoint="rt1-rlvr",
                              text_checkpoint="textgame-rlvr", rounds=2, real_steps=200, mle_steps=40, grpo_steps=5,
                              sim_steps=4096, text_sim_steps=1024, eval_episodes=16, pretrain_steps=2048,
                              observation="frame",
                              score_data=False, check_episodes=0, shaping=0.0, reach=0.0, text_algo="dqn")
    bench.write_report(args, runs)
    report = (tmp_path / "sim_to_real.md").read_text()
    assert "first learns 2048 steps in the starting simulator" in report
    assert "| text | loop | 0.60 ± 2.54 | 950 | +0.00 | 1 of 2 | 450 |" in report
    assert "reaches it at 450 real steps, 3.3x fewer than the real env's 1500" in report
    # Seed 0's real curve at 900 steps is 0.24 (0.56 behind the loop), seed 1's at 1000 steps 0.2 (0.2 behind).
    assert "the loop is +0.38 ± 2.29 ahead (the interval includes zero)" in report
    assert (tmp_path / "sim_to_real.png").stat().st_size > 0
    # Against a real-env agent given 10x the steps (mean final 0.45 after 9,000): the loop's mean curve gets there at
    # 450 real steps.
    for seed in (0, 1):
        runs["text"][seed]["real-10x"] = curve((3000, 0.0), (9000, 0.3 + 0.3 * seed))
    bench.write_report(argparse.Namespace(**{**vars(args), "arms": ["loop", "real-1x", "real-10x"]}), runs)
    assert "10x the steps ends at 0.45 after 9000: the loop's mean curve reaches that at 450 real steps, 20.0x fewer" \
        in (tmp_path / "sim_to_real.md").read_text()
    for seed in (0, 1):
        del runs["text"][seed]["real-10x"]
    # The final check (`--check-episodes 32`) scores every point again on 32 episodes: there the loop's seed 0 does
    # worse, its mean curve ends level with the real env's final 0.5 and reaches it only at its last point.
    def check(points, learned):
        return {"episodes": 32, "points": curve(*points), "real_success": points[-1][1], "learned_success": learned}

    for seed, (loop, learned) in enumerate([(0.5, 0.25), (0.5, 0.5)]):
        runs["text"][seed]["loop check"] = check([(400 + 100 * seed, 0.25), (900 + 100 * seed, loop)], learned)
        runs["text"][seed]["real-1x check"] = check([(500, 0.0), (1500, 0.5)], 0.0)
    bench.write_report(argparse.Namespace(**{**vars(args), "check_episodes": 32}), runs)
    report = (tmp_path / "sim_to_real.md").read_text()
    assert "Final check: every point's agent of each arm (but `frozen`) on 32 real episodes" in report
    assert "| text | loop | 0.60 ± 2.54 | 950 | +0.00 | 0.50 ± 0.00 | -0.12 (-0.25, +0.00) | 1 of 2 | 450 |" in report
    assert "| text | real-1x | 0.50 ± 1.27 | 1500 |  | 0.50 ± 0.00 | -0.50 (-0.50, -0.50) |" in report
    checked = report.split("every point scored again on 32 episodes (final check): ")[1]
    assert checked.startswith("the loop ends at 0.50 ± 0.00 real success against 0.50 ± 0.00")
    assert "its mean curve reaches it at 950 real steps, 1.6x fewer than the real env's 1500" in checked
    # A tabletop loop with --score-data records what its simulator pays of each scoring's real failures replayed open
    # loop; the report gives the mean over the seeds that had a failure at their last scoring.
    tabletop = {"close_drawer": {seed: {"loop": curve((400, 0.5), (900, 1.0)), "real-1x": curve((500, 0.0))}
                                 for seed in (0, 1)}}
    for seed, paid in ((0, 0.25), (1, float("nan"))):
        tabletop["close_drawer"][seed]["loop"][-1]["replayed_failures_paid"] = paid
    bench.write_report(args, tabletop)
    assert "| close_drawer | loop | 1.00 ± 0.00 | 900 | +0.00 | 0.25 |" in (tmp_path / "sim_to_real.md").read_text()


def test_the_loop_takes_a_precision_for_the_tabletop_simulator_only():
    check_config(CoTrainConfig(task="close_drawer", precision="bfloat16"))
    with pytest.raises(ValueError, match="--precision must be one of"):
        check_config(CoTrainConfig(task="close_drawer", precision="float16"))
    for tabletop_only in ({"precision": "bfloat16"}, {"reach": 5.0}, {"observation": "state"},
                          {"uncertainty_penalty": 0.1}):
        with pytest.raises(ValueError, match="--observation and --uncertainty-penalty are the tabletop"):
            check_config(CoTrainConfig(env=TEXT_ENV, algo="dqn", **tabletop_only))
    with pytest.raises(ValueError, match="--observation must be"):
        check_config(CoTrainConfig(task="close_drawer", observation="pixels"))
    with pytest.raises(ValueError, match="--reach"):
        check_config(CoTrainConfig(task="close_drawer", reach=-1.0))


def test_the_agents_transitions_are_repeated_to_make_their_share_of_a_dynamics_refit():
    from agents.cotrain import agent_repeats

    assert agent_repeats(100, 10_000, 0.0) == 1 and agent_repeats(0, 10_000, 0.5) == 1
    assert agent_repeats(100, 10_000, 0.5) == 100
    repeats = agent_repeats(300, 10_000, 0.25)
    assert 300 * repeats / (300 * repeats + 10_000) >= 0.25 > 300 * (repeats - 1) / (300 * (repeats - 1) + 10_000)
    with pytest.raises(ValueError, match="--agent-share"):
        check_config(CoTrainConfig(task="close_drawer", agent_share=1.0))
    with pytest.raises(ValueError, match="--final-dynamics-steps"):  # rt1-rlvr has no state dynamics
        check_config(CoTrainConfig(task="close_drawer", final_dynamics_steps=10))
