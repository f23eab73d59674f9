"""Frame tokenizer, token layout and the MLE -> RLVR pipeline of the video world model, on small real data."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlvr_gym.data import video_tokens as V
from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
from rlvr_gym.data.robot import episode_codes, frame_flags, mle_examples, windows_with_moves
from rlvr_gym.domains import robot as R
from rlvr_gym.files import read_log
from rlvr_gym.models.frame_tokenizer import FSQ, FrameTokenizer, FrameTokenizerConfig
from rlvr_gym.models.lm import CheckpointError, LlamaSize, build_llama
from rlvr_gym.models.motion_refiner import MotionRefiner, MotionRefinerConfig, warp
from rlvr_gym.models.robot_world_model import RobotWorldModel, RolloutStart, WorldModelSettings
from rlvr_gym.train.frame_tokenizer import (
    TokenizerConfig,
    episode_spans,
    frame_pairs,
    reconstruction_loss,
    salient_pixels,
    train_frame_tokenizer,
)
from rlvr_gym.train.grpo import GRPOConfig
from rlvr_gym.train.refiner import RefinerConfig, draw_refiner_batch, rollout_transitions, train_motion_refiner
from rlvr_gym.train.robot import rollout_starts
from rlvr_gym.train.rt1_mle import RT1MLEConfig, run_rt1_mle
from rlvr_gym.train.rt1_rlvr import RT1RLVRConfig, run_rt1_rlvr
from rlvr_gym.train.sft import SFTConfig
from rlvr_gym.train.state_reader import ReaderConfig, train_state_reader


def test_fsq_indices_round_trip_over_the_whole_codebook():
    fsq = FSQ([8, 5, 5, 5])
    indices = torch.arange(1000)
    codes = fsq.from_indices(indices)
    assert codes.abs().max() <= 1
    assert torch.equal(fsq.to_indices(codes), indices)
    used = fsq.to_indices(fsq(torch.randn(100_000, 4) * 2)).unique()
    assert used.min() >= 0 and used.max() < 1000 and len(used) > 900


def test_tokenizer_saves_and_loads_with_identical_tokens(tmp_path):
    torch.manual_seed(0)
    tokenizer = FrameTokenizer(FrameTokenizerConfig())
    frames = (torch.rand(3, 64, 64, 3) * 255).to(torch.uint8)
    tokens = tokenizer.encode(frames, frames[:1].expand(3, -1, -1, -1))
    assert tokens.shape == (3, 64) and tokens.min() >= 0 and tokens.max() < 1000
    tokenizer.save_pretrained(tmp_path)
    loaded = FrameTokenizer.from_pretrained(tmp_path)
    assert torch.equal(loaded.encode(frames, frames[:1].expand(3, -1, -1, -1)), tokens)
    decoded = loaded.decode(tokens, frames[:1].expand(3, -1, -1, -1))
    assert decoded.shape == (3, 64, 64, 3) and decoded.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"\(N, 64\)"):
        loaded.decode(tokens[:, :10], frames[:3])
    with pytest.raises(ValueError, match=r"\[0, 1000\)"):
        loaded.decode(tokens + 1000, frames[:3])
    with pytest.raises(ValueError, match="uint8"):
        loaded.encode(frames.float(), frames)


def test_token_layout_places_frames_flags_and_actions():
    codes = np.arange(3 * 64).reshape(3, 64) % 1000
    actions = np.stack([np.full(7, -1.0), np.zeros(7), np.full(7, 1.0)]).astype(np.float32)
    tokens = V.window_tokens(codes, [False, False, True], actions)
    assert len(tokens) == 1 + 3 * V.STEP_TOKENS and tokens[0] == V.BOS
    assert tokens[1 + 64] == V.FLAG_RUNNING and tokens[1 + 2 * V.STEP_TOKENS + 64] == V.FLAG_SUCCESS
    assert tokens[1 + 65 : 1 + 72] == [V.ACTION_OFFSET] * 7
    assert tokens[-7:] == [V.ACTION_OFFSET + 255] * 7
    forced = V.rollout_forced_tokens(actions[:2], success=[False, False, True])
    assert sorted(forced) == [64, *range(65, 72), 136, *range(137, 144), 208]
    assert forced[208] == V.FLAG_SUCCESS and forced[65] == V.ACTION_OFFSET
    allowed = V.rollout_allowed_tokens(3)
    assert allowed.shape == (V.rollout_length(3), V.VOCAB_SIZE)
    assert allowed[0, :1000].all() and not allowed[0, 1000:].any()
    assert allowed[64].nonzero().flatten().tolist() == [V.FLAG_RUNNING, V.FLAG_SUCCESS]


def test_rollouts_parse_or_explain_why_not():
    good = list(range(64)) + [V.FLAG_SUCCESS] + [V.ACTION_OFFSET] * 7 + list(range(64)) + [V.FLAG_RUNNING]
    frames, flags, error = V.parse_rollout(good, 2)
    assert error is None and frames.shape == (2, 64) and flags.tolist() == [True, False]
    assert "tokens" in V.parse_rollout(good[:-1], 2)[2]
    assert "not a frame code" in V.parse_rollout([V.BOS] + good[1:], 2)[2]
    assert "success flag" in V.parse_rollout(good[:64] + [5] + good[65:], 2)[2]


def test_mle_examples_mask_actions_out_of_the_loss():
    episode = type("E", (), {})()
    episode.success = np.array([False, False, True])
    episode.actions = np.zeros((3, 7), np.float32)
    codes = np.zeros((4, 64), np.int64)
    examples = mle_examples(codes, episode, window=3)
    assert len(examples) == 3
    first = examples[0]
    assert len(first["prompt_ids"]) == 1 + V.STEP_TOKENS
    assert len(first["target_ids"]) == 2 * V.STEP_TOKENS - 7
    assert sum(first["target_mask"]) == 2 * (V.FRAME_TOKENS + 1)
    assert first["target_ids"][-1] == V.FLAG_RUNNING and examples[2]["target_ids"][-1] == V.FLAG_SUCCESS


def test_mle_examples_weigh_the_codes_that_changed_since_the_frame_before():
    episode = type("E", (), {})()
    episode.success = np.array([False, False])
    episode.actions = np.zeros((2, 7), np.float32)
    codes = np.zeros((3, 64), np.int64)
    codes[1, [5, 9]] = 7  # frame 1 changes two codes; frame 2 changes them back and one more
    codes[2, 20] = 3
    first = mle_examples(codes, episode, window=3, changed_weight=4.0)[0]
    mask = np.asarray(first["target_mask"])
    step = V.STEP_TOKENS
    assert set(np.flatnonzero(mask[:step] == 4.0)) == {5, 9}
    assert set(np.flatnonzero(mask[step:] == 4.0)) == {5, 9, 20}
    assert (mask[:step][V.FRAME_TOKENS + 1 :] == 0).all()  # actions stay out of the loss
    plain = mle_examples(codes, episode, window=3)[0]["target_mask"]
    assert sorted(set(plain)) == [0.0, 1.0]


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt1")
    collect(CollectConfig(out=str(root / "train"), episodes=4, seed=11, horizon=8))
    collect(CollectConfig(out=str(root / "heldout"), episodes=2, seed=12, horizon=8, split="heldout"))
    tokenizer = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok"), data=str(root / "train"),
                                                      heldout=str(root / "heldout"), steps=4, batch_size=8))
    world = run_rt1_mle(RT1MLEConfig(data=str(root / "train"), heldout=str(root / "heldout"), tokenizer=str(tokenizer),
                                     out=str(root / "mle"), size=LlamaSize(32, 1, 2, 64, 1024),
                                     sft=SFTConfig(steps=3, batch_size=4, micro_batch=4, save_every=3)))
    return root, world


def test_salient_weight_counts_the_coloured_objects_more_than_the_grey_scene():
    target = torch.full((1, 3, 8, 8), 0.8)
    target[0, :, 2, 3] = torch.tensor([0.92, 0.1, 0.1])  # one red pixel on a grey table
    assert salient_pixels(target).sum() == 1 and salient_pixels(target)[0, 0, 2, 3] == 1
    miss_object, miss_table = target.clone(), target.clone()
    miss_object[0, :, 2, 3] = 0.8  # the object smeared into the table
    miss_table[0, :, 5, 5] = torch.tensor([0.92, 0.1, 0.1])  # a table pixel off by as much
    assert reconstruction_loss(miss_object, target) == pytest.approx(reconstruction_loss(miss_table, target).item())
    assert reconstruction_loss(miss_object, target, 10) > 5 * reconstruction_loss(miss_table, target, 10)


def test_decoder_only_fine_tune_keeps_the_codes(tiny_world):
    root, _ = tiny_world
    with pytest.raises(ValueError, match="--model"):
        train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "bad"), data=str(root / "train"), train_encoder=False))
    with pytest.raises(ValueError, match="--train-context"):
        train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "bad"), data=str(root / "train"),
                                              train_context="last"))
    tuned = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok_dec"), data=str(root / "train"),
                                                  model=str(root / "tok" / "final"), train_encoder=False,
                                                  salient_weight=10, train_context="any", steps=2, batch_size=8))
    before, after = FrameTokenizer.from_pretrained(root / "tok" / "final"), FrameTokenizer.from_pretrained(tuned)
    frames = torch.as_tensor(load_episodes(root / "heldout")[0].frames)
    assert torch.equal(before.encode(frames), after.encode(frames)), "a world model trained on the codes stays valid"
    changed = [n for n, p in after.named_parameters() if not torch.equal(p, before.state_dict()[n])]
    assert changed and not any(n.startswith("encoder.") for n in changed)


def test_frame_pairs_skip_first_frames_and_point_at_the_chosen_context():
    episodes = [SimpleNamespace(frames=np.zeros((n, 64, 64, 3), np.uint8)) for n in (3, 4)]  # all frame_pairs reads
    frames, targets, first = frame_pairs(episodes, "first")
    assert len(frames) == 7 and targets.tolist() == [1, 2, 4, 5, 6] and first.tolist() == [0, 0, 3, 3, 3]
    assert frame_pairs(episodes, "previous")[2].tolist() == [0, 1, 3, 4, 5]
    with pytest.raises(ValueError, match="context_frame"):
        frame_pairs(episodes, "last")
    with pytest.raises(ValueError, match="context_frame"):
        FrameTokenizerConfig(context_frame="last")


def test_windows_with_moves_mark_the_windows_that_predict_a_moved_object():
    frames = np.full((6, 64, 64, 3), 120, np.uint8)
    for t, col in enumerate([10, 10, 10, 14, 14, 14]):  # a red cube, 25 pixels, moves 4 px between frames 2 and 3
        frames[t, 30:35, col : col + 5] = (235, 25, 25)
    episode = SimpleNamespace(frames=frames)
    assert windows_with_moves(episode, 2).tolist() == [False, False, True, False, False]
    assert windows_with_moves(episode, 4).tolist() == [True, True, True, False, False]
    with pytest.raises(ValueError, match="--moved-windows"):
        run_rt1_mle(RT1MLEConfig(moved_windows=1.0))


def test_episode_spans_draw_contexts_from_the_target_episode_only():
    episodes = [SimpleNamespace(frames=np.zeros((n, 64, 64, 3), np.uint8)) for n in (3, 4)]
    first, length = episode_spans(episodes)
    assert first.tolist() == frame_pairs(episodes, "first")[2].tolist() and length.tolist() == [3, 3, 4, 4, 4]
    contexts = np.stack([first + np.random.default_rng(i).integers(0, length) for i in range(200)])
    assert set(contexts[:, :2].ravel()) == {0, 1, 2} and set(contexts[:, 2:].ravel()) == {3, 4, 5, 6}


def test_previous_frame_tokenizer_decodes_a_rollout_frame_by_frame(tiny_world):
    root, world_dir = tiny_world
    tuned = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok_prev"), data=str(root / "train"),
                                                  model=str(root / "tok" / "final"), train_encoder=False,
                                                  context_frame="previous", context_dropout=0.1, steps=2, batch_size=8))
    assert json.loads((tuned / "config.json").read_text())["context_frame"] == "previous"
    world = RobotWorldModel.load(world_dir)
    frames = load_episodes(root / "heldout")[0].frames
    codes = world.encode(frames[1:4], frames[:1])[None]  # (1, 3, 64)
    first = world.decode_rollout(codes, frames[:1], frames[:1])
    assert first.shape == (1, 3, 64, 64, 3)
    assert np.array_equal(first[0], world.decode(codes[0], frames[:1])), "first-frame context: one batched decode"
    world.frame_tokenizer = FrameTokenizer.from_pretrained(tuned).eval()
    chained = world.decode_rollout(codes, frames[:1], frames[:1])
    assert np.array_equal(chained[0, 0], world.decode(codes[0, :1], frames[:1])[0])
    assert np.array_equal(chained[0, 2], world.decode(codes[0, 2:], chained[0, 1:2])[0]), "each frame on the one decoded before"


def test_mle_continues_from_a_trained_transformer(tiny_world):
    root, world_dir = tiny_world
    start = RobotWorldModel.load(world_dir).lm
    world = run_rt1_mle(RT1MLEConfig(data=str(root / "train"), tokenizer=str(root / "tok" / "final"), out=str(root / "mle2"),
                                     moved_windows=0.5, sft=SFTConfig(steps=1, batch_size=4, micro_batch=4, lr=1e-9, warmup_steps=1,
                                                   model=str(world_dir / "lm"))))
    assert not (root / "mle2" / "init").exists(), "nothing is built from scratch"
    lm = RobotWorldModel.load(world).lm
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(start.parameters(), lm.parameters()))


def test_pipeline_trains_a_world_model_that_predicts_parseable_frames(tiny_world):
    root, world_dir = tiny_world
    assert "eval/psnr" in read_log(root / "tok")[-1]
    world = RobotWorldModel.load(world_dir)
    episode = load_episodes(root / "heldout")[0]
    codes = world.encode(episode.frames[:3], episode.frames[:1])
    prompt = world.prompt(codes[:2], [False, False], episode.actions[:2])
    predicted, success, errors = world.predict([prompt, prompt], k=2, future_actions=[episode.actions[2:3]] * 2)
    assert errors == [None, None] and predicted.shape == (2, 2, 64)
    assert ((0 <= success) & (success <= 1)).all()
    frames = world.decode(predicted[:, 0], episode.frames[:1])
    assert frames.shape == (2, 64, 64, 3) and frames.dtype == np.uint8


def test_multi_step_prediction_slides_the_context_window_as_the_env_steps(tiny_world):
    root, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    episode = load_episodes(root / "heldout")[0]
    codes = world.encode(episode.frames[:2], episode.frames[:1])
    prompt = world.prompt(codes, [False, False], episode.actions[:2])
    k = 4
    rolled, success, errors = world.predict([prompt], k=k, future_actions=[episode.actions[2 : 1 + k]])
    assert errors == [None]
    # The same rollout one frame at a time, each prompt the last context_steps steps with the predicted frame in.
    current = prompt
    for step in range(k):
        assert len(current) == 1 + world.settings.context_steps * V.STEP_TOKENS
        one, prob, _ = world.predict([current], k=1)
        assert (one[0, 0] == rolled[0, step]).all() and np.isclose(prob[0, 0], success[0, step])
        if step < k - 1:
            current = world.slide(current, one[0, 0], bool(prob[0, 0] > 0.5), episode.actions[2 + step])
    assert current[-V.STEP_TOKENS : -V.STEP_TOKENS + V.FRAME_TOKENS] == rolled[0, k - 2].tolist()


def test_a_16x16_token_tokenizer_carries_through_mle_rollouts_and_rlvr(tiny_world):
    root, _ = tiny_world
    tokenizer = train_frame_tokenizer(TokenizerConfig(run_dir=str(root / "tok16"), data=str(root / "train"),
                                                      channels=(16, 32), steps=2, batch_size=8))
    world_dir = run_rt1_mle(RT1MLEConfig(data=str(root / "train"), tokenizer=str(tokenizer), out=str(root / "mle16"),
                                         window=3, size=LlamaSize(32, 1, 2, 64, 1024),
                                         sft=SFTConfig(steps=2, batch_size=4, micro_batch=4, save_every=2)))
    world = RobotWorldModel.load(world_dir)
    assert world.frame_tokens == 256 and json.loads((world_dir / "world_model.json").read_text())["layout"]["frame_tokens"] == 256
    episode = load_episodes(root / "heldout")[0]
    codes = world.encode(episode.frames[:2], episode.frames[:1])
    prompt = world.prompt(codes, [False, False], episode.actions[:2])
    assert len(prompt) == 1 + 2 * (256 + 1 + V.ACTION_DIM)
    predicted, _, errors = world.predict([prompt], k=3, future_actions=[episode.actions[2:4]])
    assert errors == [None] and predicted.shape == (1, 3, 256)
    assert world.decode_rollout(predicted, episode.frames[1:2], episode.frames[:1]).shape == (1, 3, 64, 64, 3)
    with pytest.raises(ValueError, match=r"\(N, k, 256\)"):
        world.decode_rollout(predicted[..., :64], episode.frames[1:2], episode.frames[:1])
    out = run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "rlvr16"), horizon=2, rollout_depth=1,
                                     grpo=GRPOConfig(steps=1, prompts_per_step=2, group_size=2, save_every=1)))
    log = [r for r in read_log(root / "rlvr16") if "reward/mean" in r]
    assert log[0]["reward/parse_failure_rate"] == 0 and RobotWorldModel.load(out).frame_tokens == 256
    # A transformer trained on 8x8 codes refuses the 16x16 tokenizer's.
    meta = json.loads((world_dir / "world_model.json").read_text())
    meta["layout"]["frame_tokens"] = 64
    (world_dir / "world_model.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="token layout"):
        RobotWorldModel.load(world_dir)


def test_rlvr_scores_multi_step_rollouts_with_the_frame_reward(tiny_world):
    root, world_dir = tiny_world
    out = run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "rlvr"), horizon=2, rollout_depth=1,
                                     grpo=GRPOConfig(steps=2, prompts_per_step=2, group_size=3, beta=0.01, save_every=2)))
    log = [r for r in read_log(root / "rlvr") if "reward/mean" in r]
    assert len(log) == 2
    assert all(r["reward/parse_failure_rate"] == 0 for r in log), "the layout mask makes every rollout parseable"
    assert all(r["reward/mean"] < 0 and r["reward/lpips"] > 0 for r in log)
    assert RobotWorldModel.load(out).settings.context_steps == 2


def test_rollout_prompts_hold_the_models_own_predictions_and_train(tiny_world):
    from rlvr_gym.data.robot import rlvr_examples
    from rlvr_gym.train.rt1_rlvr import rollout_examples

    root, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    episodes = load_episodes(root / "train")
    real = {(ex["episode"], ex["t"]): ex for ex in rlvr_examples(world, episodes, 1)}
    examples = rollout_examples(world, episodes, depth=3, count=12, seed=1)
    assert len(examples) == 12 and {ex["depth"] for ex in examples} <= {1, 2, 3} and max(ex["depth"] for ex in examples) > 1
    for ex in examples:
        start = real[(ex["episode"], ex["t"] - ex["depth"] + 1)]
        prompt = list(start["prompt_ids"])
        for k in range(ex["depth"] - 1):  # the same greedy rollout, one env-like step at a time
            codes, success, _ = world.predict([prompt], k=1)
            prompt = world.slide(prompt, codes[0, 0], bool(success[0, 0] > 0.5), episodes[ex["episode"]].actions[start["t"] + k + 1])
        assert ex["prompt_ids"] == prompt and prompt[-V.ACTION_DIM:] == real[(ex["episode"], ex["t"])]["prompt_ids"][-V.ACTION_DIM:]
        assert ex["last_codes"] == prompt[-V.STEP_TOKENS :][: V.FRAME_TOKENS]
        if ex["depth"] == 1:
            assert ex["prompt_ids"] == real[(ex["episode"], ex["t"])]["prompt_ids"]
    with pytest.raises(ValueError, match="--moved-prompts"):
        run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "bad"), moved_prompts=1.0))
    with pytest.raises(ValueError, match="--revealed-prompts"):
        run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "bad"), moved_prompts=0.5,
                                   revealed_prompts=0.5))
    with pytest.raises(ValueError, match="--horizon 1"):
        run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "bad"), horizon=2, rollout_depth=2))
    run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "rlvr_deep"), rollout_depth=3,
                               rollout_prompts=8, repetition_penalty=0.1, moved_prompts=0.25, revealed_prompts=0.25,
                               grpo=GRPOConfig(steps=1, prompts_per_step=2, group_size=2, temperature=0.5, save_every=1)))
    assert "reward/false_repetition" in read_log(root / "rlvr_deep")[-1]


def test_rlvr_reward_takes_off_the_object_term_and_the_repetition_penalty(tiny_world):
    from rlvr_gym.data.robot import rlvr_examples
    from rlvr_gym.domains.robot import frame_reward_fn

    root, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    episodes = load_episodes(root / "train")
    example = rlvr_examples(world, episodes, 2)[3]
    e, t = example["episode"], example["t"]
    codes = world.encode(episodes[e].frames[t : t + 3], episodes[e].frames[:1])
    # A rollout that predicts the real next two frames' codes, and one that repeats the prompt's frame twice.
    flags = [V.FLAG_RUNNING] * 2
    action = example["forced"]

    def completion(frames):
        ids = []
        for j, frame in enumerate(frames):
            ids += frame.tolist() + [flags[j]]
            if j == 0:
                ids += [action[V.FRAME_TOKENS + 1 + i] for i in range(V.ACTION_DIM)]
        return ids
    exact, repeated = completion(codes[1:3]), completion([codes[0], codes[0]])
    plain = frame_reward_fn(world, episodes, 2)([exact, repeated], [e, e], [t, t])
    with pytest.raises(ValueError, match="codes_per_episode"):
        frame_reward_fn(world, episodes, 2, repetition_penalty=0.3)
    real_codes = [episode_codes(world.frame_tokenizer, episode) for episode in episodes]
    shaped = frame_reward_fn(world, episodes, 2, object_weight=0.5, repetition_penalty=0.3,
                             codes_per_episode=real_codes)([exact, repeated], [e, e], [t, t])
    changed = (codes[1:] != codes[:-1]).any(-1).mean()
    assert changed > 0, "the real frames change, so repeating one is a false repetition"
    assert shaped[1]["false_repetition"] == pytest.approx(changed) and shaped[0]["false_repetition"] == 0
    for p, q in zip(plain, shaped):
        assert q["score"] == pytest.approx(p["score"] - 0.5 * q["object"] - 0.3 * q["false_repetition"], abs=1e-6)


def test_world_model_checkpoints_are_checked(tiny_world, tmp_path):
    _, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    with pytest.raises(CheckpointError, match="vocabulary"):
        RobotWorldModel(build_llama(100, LlamaSize(32, 1, 2, 64)), world.frame_tokenizer, WorldModelSettings())
    with pytest.raises(CheckpointError, match="tokenizer/transformer mismatch"):
        RobotWorldModel(world.lm, FrameTokenizer(FrameTokenizerConfig(levels=(8, 8))), WorldModelSettings())
    broken = world.save(tmp_path / "copy")
    (broken / "world_model.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        RobotWorldModel.load(broken)
    (broken / "world_model.json").write_text(json.dumps({"layout": {"vocab_size": 7}, "settings": {}}))
    with pytest.raises(CheckpointError, match="token layout"):
        RobotWorldModel.load(broken)
    layout = {"codebook_size": V.CODEBOOK_SIZE, "frame_tokens": V.FRAME_TOKENS, "vocab_size": V.VOCAB_SIZE}
    (broken / "world_model.json").write_text(json.dumps({"layout": layout, "settings": {"context_step": 2}}))
    with pytest.raises(CheckpointError, match="no valid settings"):
        RobotWorldModel.load(broken)
    with pytest.raises(CheckpointError, match="neither a directory"):
        RobotWorldModel.load(tmp_path / "missing")


def test_prompts_where_objects_move_are_drawn_or_repeated_to_the_asked_fraction():
    from rlvr_gym.train.robot import draw_prompts, repeat_moved

    moved = np.arange(100) % 10 == 0  # 10 of 100
    rng = np.random.default_rng(0)
    assert len(set(draw_prompts(moved, 40, 0.0, rng))) == 40
    picked = draw_prompts(moved, 40, 0.5, rng)
    assert len(set(picked)) == 40 and moved[picked].sum() == 10, "half asked, but only 10 exist: all of them"
    picked = draw_prompts(moved, 10, 0.5, rng)
    assert moved[picked].sum() == 5 and len(set(picked)) == 10
    revealed = np.arange(100) % 20 == 0  # 5 of the 10 moved
    picked = draw_prompts(moved, 20, 0.25, rng, revealed, 0.25)
    assert len(set(picked)) == 20 and revealed[picked].sum() == 5 and moved[picked].sum() == 10
    picked = draw_prompts(moved, 20, 0.0, rng, revealed, 0.1)
    assert revealed[picked].sum() == 2 and moved[picked].sum() == 2, "no moved share asked: only the revealed ones"
    examples = [{"i": i} for i in range(100)]
    mixed = repeat_moved(examples, moved, 0.5)
    assert mixed[:100] == examples and sum(moved[ex["i"]] for ex in mixed) == 90 and len(mixed) == 180
    assert repeat_moved(examples, moved, 0.0) is examples and repeat_moved(examples, moved, 0.05) is examples
    assert repeat_moved(examples, np.zeros(100, bool), 0.5) is examples, "nothing moved: nothing to repeat"


def test_object_centroids_are_read_from_the_frame_colours():
    from rlvr_gym.domains.robot import object_centroids, object_position_error

    frame = np.full((1, 64, 64, 3), 230, np.uint8)
    frame[0, 10:12, 20:22] = (230, 20, 20)  # red
    frame[0, 40:44, 50:52] = (20, 200, 30)  # green
    centroids = object_centroids(frame)
    assert centroids[0, 0].tolist() == [10.5, 20.5] and centroids[0, 1].tolist() == [41.5, 50.5]
    assert np.isnan(centroids[0, 2]).all(), "the blue can is not in the frame"
    moved = frame.copy()
    moved[0, 10:12, 20:22] = 230
    moved[0, 13:15, 24:26] = (230, 20, 20)
    # The red cube moved 5 px (3 down, 4 right); the green one did not, so only red counts.
    assert object_position_error(frame, moved, frame) == pytest.approx(5.0), "copying the previous frame misses by the motion"
    assert R.moved_objects(moved, frame).tolist() == [[True, False, False]]
    assert object_position_error(moved, moved, frame) == 0.0
    assert np.isnan(object_position_error(frame, frame, frame)), "nothing moved: no motion to score"
    assert np.isnan(object_position_error(frame, moved, frame, min_target_pixels=5)), "4 pixels showing: not whole"
    lost = moved.copy()
    lost[0, 13:15, 24:26] = 230
    assert np.isnan(R.moved_object_distances(lost, moved, frame)).tolist() == [True], "the red cube is lost"
    assert object_position_error(lost, moved, frame) == R.LOST_OBJECT_PX
    # The reward's object term scores every object showing in the real frame, moved or not, in [0, 1].
    assert R.object_reward_error(moved, moved).tolist() == [0.0]
    assert R.object_reward_error(frame, moved) == pytest.approx([(5.0 / 45 + 0) / 2])
    lost = moved.copy()
    lost[0, 40:44, 50:52] = 230
    assert R.object_reward_error(lost, moved) == pytest.approx([(0 + 1) / 2]), "a lost object counts 1"
    empty = np.full_like(frame, 230)
    assert R.object_reward_error(frame, empty).tolist() == [0.0], "nothing to place"


def test_an_object_coming_out_from_under_the_gripper_counts_as_revealed():
    table = np.full((1, 64, 64, 3), 230, np.uint8)
    under = table.copy()
    under[0, 21:23, 31:33] = (20, 30, 200)  # 4 blue pixels showing beside the gripper, off the can's centre
    out = table.copy()
    out[0, 18:23, 29:33] = (20, 30, 200)  # the whole can: 20 pixels
    assert R.object_pixels(np.concatenate([under, out])).tolist() == [[0, 0, 4], [0, 0, 20]]
    assert R.revealed_objects(out, under).tolist() == [[False, False, True]]
    shifted = table.copy()
    shifted[0, 20:25, 31:35] = (20, 30, 200)
    assert R.moved_objects(shifted, out, min_target_pixels=R.WHOLE_OBJECT_PIXELS).tolist() == [[False, False, True]]
    assert not R.revealed_objects(shifted, out).any(), "it moved, but it showed whole before"
    assert not R.revealed_objects(out, table).any(), "hidden altogether before: nothing to tell where it was"


def test_refiner_batches_hold_the_asked_share_of_moved_and_revealed_transitions_revealed_ones_predicted():
    moved = np.zeros(1000, dtype=bool)
    moved[:100] = True
    revealed = np.zeros(1000, dtype=bool)
    revealed[60:90] = True
    config = RefinerConfig(batch_size=16, moved_fraction=0.375, revealed_fraction=0.25, real_fraction=1.0)
    idx, use_real = draw_refiner_batch(moved, revealed, config, np.random.default_rng(0))
    assert moved[idx[:6]].all() and revealed[idx[6:10]].all()
    assert not use_real[6:10].any() and use_real[:6].all() and use_real[10:].all(), "revealed rows decode predictions"
    plain, _ = draw_refiner_batch(moved, revealed, RefinerConfig(batch_size=400, moved_fraction=0.0), np.random.default_rng(0))
    assert moved[plain].mean() < 0.2, "without fractions the batch is drawn from all transitions"


def test_evaluation_reports_model_and_baselines(tiny_world):
    from rlvr_gym.evaluation.robot import evaluate_world_model, summary_line

    root, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    result = evaluate_world_model(world, load_episodes(root / "heldout"), horizon=2)
    single = result["single"]
    assert np.isfinite(single["copy_last_frame"]["psnr"]) and single["copy_last_frame"]["lpips"] >= 0
    assert 0 <= single["model"]["repetition_rate"] <= 1 and single["model"]["n"] == 16
    assert result["multi"]["horizon"] == 2 and len(result["multi"]["per_step"]) == 2
    line = summary_line(result)
    for key in ("mse", "psnr", "ssim", "lpips", "repetition_rate", "moving_repetition_rate", "multi_lpips",
                "multi_repetition_rate", "multi_moving_repetition_rate", "frozen_rate", "multi_frozen_rate", "n",
                "copy_last_frame_psnr", "tokenizer_ceiling_psnr", "tokenizer_ceiling_object_error_px", "multi_step2_copy_psnr"):
        assert key in line
    assert single["tokenizer_ceiling"]["mse"] >= 0 and single["real_repetition_rate"] <= 1
    by_size = single["changed_mse_by_action_size"]
    assert sum(row["n"] for row in by_size) == single["model"]["n"]
    assert len({row["action_size"] for row in by_size}) == len(by_size)
    assert all({"model", "tokenizer_ceiling", "copy_last_frame"} <= set(row) for row in by_size)

    from bench.rt1_world_model import repetition_rejection

    rejected = evaluate_world_model(world, load_episodes(root / "heldout"), horizon=2, choose=repetition_rejection(world))
    for part in ("single", "multi"):
        assert rejected[part]["model"]["repetition_rate"] <= result[part]["model"]["repetition_rate"]


def test_eval_rt1_tokens_only_scores_the_transformers_own_frames(tiny_world, tmp_path):
    from rlvr_gym.evaluation.robot import (
        RT1EvalConfig,
        evaluate_world_model,
        fresh_episodes,
        run_rt1_eval,
        summary_line,
    )

    _, world_dir = tiny_world
    refined = with_random_refiner(RobotWorldModel.load(world_dir), context_from_frames=True).save(tmp_path / "refined")
    config = RT1EvalConfig(checkpoint=str(refined), episodes=1, seed=5, horizon=2, env_horizon=5)
    shown, own = run_rt1_eval(config), run_rt1_eval(RT1EvalConfig(**{**vars(config), "tokens_only": True}))
    expected = summary_line(evaluate_world_model(RobotWorldModel.load(refined).tokens_only(), fresh_episodes(1, 5, 5), 2))
    assert own == pytest.approx(expected, nan_ok=True)
    assert own["lpips"] != shown["lpips"], "the refiner is left out"


def test_a_model_that_feeds_back_its_frames_counts_repeats_against_the_frames_it_was_prompted_with(tiny_world):
    from rlvr_gym.evaluation.robot import (
        evaluate_world_model,
        multi_step_prompts,
        rollout_start,
        tokenize_episodes,
    )
    from rlvr_gym.models.robot_world_model import predict_in_batches

    root, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    world.refiner = MotionRefiner(MotionRefinerConfig(width=8)).eval()
    world.settings.context_from_frames = True
    episodes = load_episodes(root / "heldout")
    result = evaluate_world_model(world, episodes, horizon=3)
    data = tokenize_episodes(world, episodes)
    prompts, future, where = multi_step_prompts(world, data, 3)
    rollout = predict_in_batches(world, prompts, rollout_start(data, where), 3, future)
    repeats = (rollout.codes[:, 1:] == rollout.context[:, :-1]).all(-1).mean(0)
    assert [s["repetition_rate"] for s in result["multi"]["per_step"][1:]] == pytest.approx(repeats.tolist())


def test_tokens_only_decodes_without_the_refiner_feeds_back_the_generated_codes_and_leaves_the_model_as_it_was(tiny_world):
    root, world_dir = tiny_world
    world = with_random_refiner(RobotWorldModel.load(world_dir), context_from_frames=True)
    plain = world.tokens_only()
    assert plain.refiner is None and plain.lm is world.lm and plain.frame_tokenizer is world.frame_tokenizer
    assert world.refiner is not None and world.settings.context_from_frames, "the model itself is untouched"
    assert not plain.settings.context_from_frames
    assert plain.settings.success_thresholds == world.settings.success_thresholds

    episode = load_episodes(root / "heldout")[0]
    frames, actions = episode.frames, episode.actions
    prompt = world.prompt(world.encode(frames[:2], frames[:1]), [False, False], actions[:2])
    start = RolloutStart(frames[1:2], frames[:1], frames[:1], actions[1:2])
    ours = plain.rollout([prompt], start, k=2, future_actions=[actions[2:3]])
    assert np.array_equal(ours.context, ours.codes), "the generated codes go back into the prompt"
    reference = frames[:1] if world.context_frame == "first" else frames[1:2]
    np.testing.assert_array_equal(ours.frames[0, 0], world.decode(ours.codes[0, :1], reference)[0])
    shown = world.rollout([prompt], start, k=2, future_actions=[actions[2:3]])
    assert np.array_equal(ours.codes[0, 0], shown.codes[0, 0]), "the same transformer"
    assert not np.array_equal(ours.frames[0, 0], shown.frames[0, 0]), "the refiner is left out"


def test_half_precision_checkpoints_load_back_as_float32(tiny_world, tmp_path):
    _, world_dir = tiny_world
    world = RobotWorldModel.load(world_dir)
    small = world.save(tmp_path / "fp16", dtype=torch.float16)
    assert next(world.lm.parameters()).dtype == torch.float32, "saving in fp16 leaves the model in memory as it was"
    size = lambda d: sum(f.stat().st_size for f in d.rglob("*.safetensors"))  # noqa: E731
    assert size(small) < 0.6 * size(world_dir)
    loaded = RobotWorldModel.load(small)
    assert next(loaded.lm.parameters()).dtype == torch.float32
    assert next(loaded.frame_tokenizer.parameters()).dtype == torch.float32


def test_a_fresh_tokenizer_spreads_real_frames_over_many_codes(tiny_world):
    # Guards against the collapse seen in a first design: every latent saturated and all frames became one code.
    root, _ = tiny_world
    frames = torch.as_tensor(np.concatenate([e.frames for e in load_episodes(root / "train")]))
    torch.manual_seed(0)
    tokens = FrameTokenizer(FrameTokenizerConfig()).encode(frames)
    assert tokens.unique().numel() > 50


def test_warp_moves_pixels_by_the_flow_and_zero_flow_copies_exactly():
    images = torch.rand(2, 3, 16, 16)
    assert torch.equal(warp(images, torch.zeros(2, 2, 16, 16)), images)
    right = torch.zeros(2, 2, 16, 16)
    right[:, 0] = 1.0  # each pixel samples the one to its right: the picture moves one pixel left
    assert torch.allclose(warp(images, right)[..., :-1], images[..., 1:], atol=1e-5)
    down_half = torch.zeros(2, 2, 16, 16)
    down_half[:, 1] = 0.5
    assert torch.allclose(warp(images, down_half)[..., :-1, :], (images[..., :-1, :] + images[..., 1:, :]) / 2, atol=1e-5)


def test_a_fresh_refiner_mixes_the_last_frame_and_the_decoded_one_evenly():
    refiner = MotionRefiner(MotionRefinerConfig(width=8)).eval()
    last, decoded = np.full((2, 64, 64, 3), 100, np.uint8), np.full((2, 64, 64, 3), 200, np.uint8)
    out = refiner.refine(last, last, decoded, np.zeros((2, 7), np.float32))
    assert (out == 150).all()
    with pytest.raises(ValueError, match="actions of shape"):
        refiner.refine(last, last, decoded, np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="decoded: expected uint8"):
        refiner.refine(last, last, decoded[:, :32], np.zeros((2, 7), np.float32))


def test_motion_refiner_trains_on_the_models_predictions_resumes_and_travels_with_the_world_model(tiny_world, tmp_path):
    root, world_dir = tiny_world
    config = RefinerConfig(run_dir=str(root / "refiner"), world_model=str(world_dir), data=str(root / "train"),
                           heldout=str(root / "heldout"), prediction_episodes=2, steps=2, batch_size=4, save_every=1,
                           width=8, moved_fraction=0.0, eval_transitions=8)
    with pytest.raises(ValueError, match="--moved-fraction"):
        train_motion_refiner(RefinerConfig(**{**vars(config), "moved_fraction": 1.0}))
    with pytest.raises(ValueError, match="--revealed-fraction"):
        train_motion_refiner(RefinerConfig(**{**vars(config), "moved_fraction": 0.5, "revealed_fraction": 0.5}))
    out = train_motion_refiner(config)
    assert sorted(p.name for p in (root / "refiner").glob("predictions_*")) == ["predictions_0_of_1.npz"]
    # A run dir holding the shards of a two-process run reuses them under one process instead of predicting again.
    saved = dict(np.load(root / "refiner" / "predictions_0_of_1.npz"))
    (root / "refiner_from_shards").mkdir()
    for r in range(2):
        np.savez(root / "refiner_from_shards" / f"predictions_{r}_of_2.npz", **{k: v[r::2] for k, v in saved.items()})
    train_motion_refiner(RefinerConfig(**{**vars(config), "run_dir": str(root / "refiner_from_shards"), "steps": 1,
                                          "lpips_weight": 0.5}))
    assert not (root / "refiner_from_shards" / "predictions_0_of_1.npz").exists()
    step = next(row for row in read_log(root / "refiner_from_shards") if "train/lpips" in row)
    assert step["train/lpips"] > 0
    assert step["train/loss"] == pytest.approx(step["train/pixel_loss"] + 0.5 * step["train/lpips"])
    assert all(row.get("train/lpips", 0.0) == 0.0 for row in read_log(root / "refiner")), "off by default"
    evals = [row for row in read_log(root / "refiner") if "eval/psnr_refined" in row]
    assert evals and {"eval/object_error_px_copy", "eval/psnr_decoded"} <= set(evals[-1])
    resumed = train_motion_refiner(RefinerConfig(**{**vars(config), "steps": 3, "resume": True}))
    assert resumed == out and read_log(root / "refiner")[-1]["step"] == 3
    world, plain = RobotWorldModel.load(out), RobotWorldModel.load(world_dir)
    assert world.refiner is not None and plain.refiner is None
    assert world.settings.context_from_frames and not plain.settings.context_from_frames
    assert (out / "initial_states.npz").is_file(), "the learned env can reset from it"
    assert any(p.abs().sum() > 0 for p in world.refiner.head[-1].parameters()), "the refiner learned"

    episode = load_episodes(root / "heldout")[0]
    frames, actions = episode.frames, episode.actions
    codes = world.encode(frames[2:4], frames[:1])[None]
    with pytest.raises(ValueError, match="needs `before`"):
        world.decode_rollout(codes, frames[1:2], frames[:1])
    rolled = world.decode_rollout(codes, frames[1:2], frames[:1], frames[:1], actions[None, 1:3])
    first = world.refiner.refine(frames[:1], frames[1:2], world.decode(codes[0, :1], frames[:1]), actions[1:2])
    second = world.refiner.refine(frames[1:2], first, world.decode(codes[0, 1:], frames[:1]), actions[2:3])
    assert np.array_equal(rolled[0, 0], first[0]) and np.array_equal(rolled[0, 1], second[0]), "refined in order"

    world.refiner = None
    assert RobotWorldModel.load(world.save(tmp_path / "plain")).refiner is None
    world.refiner = RobotWorldModel.load(out).refiner
    copy = world.save(tmp_path / "copy")
    world.refiner = None
    assert RobotWorldModel.load(world.save(copy)).refiner is None, "saving over a refined model drops its refiner"
    world.refiner = RobotWorldModel.load(out).refiner
    world.save(copy)
    (copy / "motion_refiner" / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(CheckpointError, match="motion refiner"):
        RobotWorldModel.load(copy)


def with_random_refiner(world: RobotWorldModel, context_from_frames: bool = False) -> RobotWorldModel:
    """The world model with an untrained refiner whose last layer is not zero, so that it moves pixels."""
    torch.manual_seed(0)
    world.refiner = MotionRefiner(MotionRefinerConfig(width=8)).eval()
    torch.nn.init.normal_(world.refiner.head[-1].weight, std=0.05)
    world.settings.context_from_frames = context_from_frames
    return world


def test_refiner_learns_on_its_own_rollout_frames_refined_from_the_frames_shown_before_them(tiny_world, tmp_path):
    root, world_dir = tiny_world
    world = with_random_refiner(RobotWorldModel.load(world_dir), context_from_frames=True)
    refined_dir = world.save(tmp_path / "refined")
    episodes = load_episodes(root / "train")
    starts = rollout_starts(episodes, depth=3, count=5, seed=0)
    assert len(starts) == 5 and all(b + 3 <= len(episodes[e].actions) for e, b in starts)
    got = rollout_transitions(world, episodes, starts, depth=3)
    assert got["t"].tolist() == [b + j for j in (1, 2) for _, b in starts], "frames 2 and 3 of each rollout"
    # The first start's rollout, run as the env runs it: frames 2 and 3 with the frames shown before each.
    (e, b), rows = starts[0], np.flatnonzero(got["episode"] == starts[0][0])
    prompt = world.prompt(episode_codes(world.frame_tokenizer, episodes[e])[: b + 1], frame_flags(episodes[e])[: b + 1],
                          episodes[e].actions[: b + 1])
    rollout = world.rollout([prompt], RolloutStart.of_episodes(episodes, [(e, b)]), k=3,
                            future_actions=[episodes[e].actions[b + 1 : b + 3]])
    first, second = rows[got["t"][rows] == b + 1][0], rows[got["t"][rows] == b + 2][0]
    assert np.array_equal(got["before"][first], episodes[e].frames[b]) and np.array_equal(got["last"][first], rollout.frames[0, 0])
    assert np.array_equal(got["before"][second], rollout.frames[0, 0]) and np.array_equal(got["last"][second], rollout.frames[0, 1])
    assert np.array_equal(got["codes"][second], rollout.codes[0, 2])

    config = RefinerConfig(run_dir=str(tmp_path / "run"), world_model=str(refined_dir), data=str(root / "train"),
                           model=str(refined_dir / "motion_refiner"), prediction_episodes=2, steps=2, batch_size=4,
                           width=8, moved_fraction=0.0, rollout_depth=3, rollout_starts=5, rollout_fraction=0.5)
    for depth, fraction in ((1, 0.5), (3, 0.0)):
        with pytest.raises(ValueError, match="go together"):
            train_motion_refiner(RefinerConfig(**{**vars(config), "rollout_depth": depth, "rollout_fraction": fraction}))
    with pytest.raises(ValueError, match="--rollout-fraction"):
        train_motion_refiner(RefinerConfig(**{**vars(config), "moved_fraction": 0.5}))
    out = train_motion_refiner(config)
    saved = np.load(tmp_path / "run" / "rollouts_0_of_1.npz")
    assert np.array_equal(saved["last"], got["last"]), "the rollouts of the world model's own refiner, saved once"
    learned = RobotWorldModel.load(out).refiner.state_dict()
    assert any(not torch.equal(v, world.refiner.state_dict()[k]) for k, v in learned.items()), "fine-tuned"


def test_a_rollout_that_feeds_back_its_frames_prompts_with_the_codes_of_what_it_shows(tiny_world):
    root, world_dir = tiny_world
    world = with_random_refiner(RobotWorldModel.load(world_dir), context_from_frames=True)
    episode = load_episodes(root / "heldout")[0]
    frames, actions = episode.frames, episode.actions
    prompt = world.prompt(world.encode(frames[:2], frames[:1]), [False, False], actions[:2])
    start = RolloutStart(frames[1:2], frames[:1], frames[:1], actions[1:2])
    with pytest.raises(ValueError, match="needs a RolloutStart"):
        world.predict([prompt], k=2, future_actions=[actions[2:3]])
    rolled = world.rollout([prompt], start, k=2, future_actions=[actions[2:3]])
    assert rolled.errors == [None]
    shown = world.decode_rollout(rolled.codes, frames[1:2], frames[:1], frames[:1], actions[None, 1:3])
    assert np.array_equal(rolled.frames, shown), "the frames shown are the generated codes, decoded and refined"
    assert np.array_equal(rolled.context[0], world.encode(rolled.frames[0], frames[:1]))

    # Step by step, as the env does: the second frame is predicted from the first one's re-encoded codes.
    one = world.rollout([prompt], start, k=1)
    following = world.slide(prompt, one.context[0, 0], bool(one.success[0, 0] > 0.5), actions[2])
    two = world.rollout([following], RolloutStart(one.frames[:, 0], frames[:1], frames[1:2], actions[2:3]), k=1)
    assert np.array_equal(two.codes[0, 0], rolled.codes[0, 1]) and np.array_equal(two.frames[0, 0], rolled.frames[0, 1])

    world.settings.context_from_frames = False
    plain = world.rollout([prompt, prompt], start.rows([0, 0]), k=2, future_actions=[actions[2:3]] * 2)
    assert np.array_equal(plain.context, plain.codes)
    assert np.array_equal(plain.codes, world.predict([prompt, prompt], k=2, future_actions=[actions[2:3]] * 2)[0])
    with pytest.raises(ValueError, match="a RolloutStart row per prompt"):
        world.rollout([prompt, prompt], start, k=1)


def test_decode_rollout_in_chunks_equals_one_pass(tiny_world, monkeypatch):
    from rlvr_gym.models import robot_world_model

    root, world_dir = tiny_world
    world = with_random_refiner(RobotWorldModel.load(world_dir))
    frames, actions = (lambda e: (e.frames, e.actions))(load_episodes(root / "heldout")[0])
    args = (world.encode(frames[1:6], frames[:1])[:, None], frames[:5], frames[:1], frames[:5], actions[:5, None])
    whole = world.decode_rollout(*args)
    monkeypatch.setattr(robot_world_model, "DECODE_BATCH", 2)
    chunked = world.decode_rollout(*args)
    assert chunked.shape == whole.shape == (5, 1, 64, 64, 3)
    # Convolutions may round differently at another batch size: one grey level at most.
    np.testing.assert_allclose(chunked.astype(int), whole.astype(int), atol=1, rtol=0)


def test_state_reader_learns_states_from_frames_and_decides_the_simulators_success(tiny_world, tmp_path):
    from dataclasses import replace

    import gymnasium as gym

    import rlvr_gym  # noqa: F401  (registers the env ids)
    from envs.robot.tasks import task_from_instruction
    from rlvr_gym.data.episodes import write_shards
    from rlvr_gym.models.state_reader import READ_NAMES, success_probability
    from rlvr_gym.sim.robot import ImagineConfig, _Simulator, imagine, replay_success_scores

    root, world_dir = tiny_world
    config = ReaderConfig(run_dir=str(root / "reader"), world_model=str(world_dir), data=str(root / "train"),
                          heldout=str(root / "heldout"), steps=150, batch_size=16, warmup_steps=0,
                          save_every=75, eval_every=150, eval_frames=16)
    with pytest.raises(ValueError, match="--recon-fraction"):
        train_state_reader(ReaderConfig(**{**vars(config), "recon_fraction": 1.5}))
    imported = [replace(e, states=np.full_like(e.states, np.nan), task="rt1", seed=-1) for e in load_episodes(root / "train")]
    write_shards(imported, tmp_path / "imported", "train")
    with pytest.raises(ValueError, match="imported episodes carry no states"):
        train_state_reader(ReaderConfig(**{**vars(config), "data": str(tmp_path / "imported")}))
    out = train_state_reader(config)
    losses = [row["train/loss"] for row in read_log(root / "reader") if "train/loss" in row]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), "the reader learns the states"
    evals = [row for row in read_log(root / "reader") if "eval/object_xy_cm" in row]
    assert evals and {"eval/drawer_cm", "eval/target_cm", "eval/success_balanced_accuracy"} <= set(evals[-1])
    assert train_state_reader(ReaderConfig(**{**vars(config), "steps": 152, "resume": True})) == out
    assert read_log(root / "reader")[-1]["step"] == 152

    world = RobotWorldModel.load(out)
    assert world.state_reader is not None and RobotWorldModel.load(world_dir).state_reader is None
    assert world.settings.success_thresholds == {}, "flag thresholds do not carry over to the reader"
    episode = load_episodes(root / "heldout")[0]
    read = world.state_reader.read(episode.frames)
    assert read.shape == (len(episode.frames), len(READ_NAMES)) and read.dtype == np.float32
    with pytest.raises(ValueError, match="uint8 frames"):
        world.state_reader.read(episode.frames[0])

    # The simulator's success is the task's test on the state read off the frame it shows.
    env = gym.make("RLVRWorld-RT1-v0", checkpoint=str(out), horizon=4).unwrapped
    obs, info = env.reset(seed=0)
    first = world.state_reader.read(obs[None])
    obs, reward, terminated, _, info = env.step(np.zeros(7, np.float32))
    assert set(info["read_state"]) == set(READ_NAMES)
    expected = success_probability(task_from_instruction(info["instruction"]), world.state_reader.read(obs[None]), first[0])
    assert info["success_prob"] == pytest.approx(expected[0], abs=1e-5)
    assert reward == float(info["success_prob"] > 0.5) == float(terminated)
    venv = gym.make_vec("RLVRWorld-RT1-v0", num_envs=2, vectorization_mode="vector_entry_point", checkpoint=str(out),
                        horizon=4)
    venv.reset(seed=0)
    infos = venv.step(np.zeros((2, 7), np.float32))[4]
    assert infos["read_state"]["drawer_qpos"].shape == (2,) and infos["_read_state"].all()
    sim = _Simulator.load(out, None, 0.0)
    assert replay_success_scores(sim, [episode]).shape == (1,)

    # Imagined episodes: the real ones with the frames the simulator draws for their actions, nothing else changed.
    imagined_dir = imagine(ImagineConfig(out=str(tmp_path / "imagined"), checkpoint=str(out), data=str(root / "heldout"),
                                         num_envs=2))
    real, imagined = load_episodes(root / "heldout"), load_episodes(imagined_dir)
    assert len(imagined) == len(real)
    for a, b in zip(imagined, real):
        assert np.array_equal(a.frames[0], b.frames[0]) and not np.array_equal(a.frames[1:], b.frames[1:])
        for name in ("actions", "states", "success", "rewards"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert (a.task, a.seed, a.policy) == (b.task, b.seed, b.policy)
    rollout = sim.start_from_frame(real[1].frames[0], real[1].task, real[1].instruction)
    for t, action in enumerate(real[1].actions):
        sim.advance([rollout], action[None], torch.Generator().manual_seed(0))
        assert np.array_equal(rollout.frame, imagined[1].frames[t + 1]), "the frames the learned env shows"
    with pytest.raises(FileExistsError):
        imagine(ImagineConfig(out=str(imagined_dir), checkpoint=str(out), data=str(root / "heldout")))

    # --steps 0 from a trained reader adds it to another world model as it is (here read with imagined frames too).
    attached = train_state_reader(ReaderConfig(**{**vars(config), "run_dir": str(tmp_path / "attach"),
                                                  "model": str(root / "reader" / "final"), "steps": 0,
                                                  "data": (str(root / "train"), str(imagined_dir))}))
    for a, b in zip(RobotWorldModel.load(attached).state_reader.parameters(), world.state_reader.parameters()):
        assert torch.equal(a, b)

    world.save(tmp_path / "copy")
    world.state_reader = None
    assert RobotWorldModel.load(world.save(tmp_path / "copy")).state_reader is None, "saving without one drops it"
    world.state_reader = RobotWorldModel.load(out).state_reader
    world.save(tmp_path / "copy")
    (tmp_path / "copy" / "state_reader" / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(CheckpointError, match="state reader"):
        RobotWorldModel.load(tmp_path / "copy")


def test_surprise_flags_mark_the_steps_the_model_got_most_wrong(tiny_world):
    from rlvr_gym.data.robot import rlvr_examples
    from rlvr_gym.train.rt1_rlvr import surprise_flags

    root, world_dir = tiny_world
    world, episodes = RobotWorldModel.load(world_dir), load_episodes(root / "train")
    examples = rlvr_examples(world, episodes, 1)
    flags = surprise_flags(world, episodes, examples)
    assert flags.dtype == bool and flags.shape == (len(examples),)
    assert 0.25 <= flags.mean() < 1.0  # the top quarter by frame error, and any success flag the model got wrong
    with pytest.raises(ValueError, match="surprise-prompts"):
        run_rt1_rlvr(RT1RLVRConfig(data=str(root / "train"), model=str(world_dir), out=str(root / "x"),
                                   rollout_depth=2, surprise_prompts=0.5))


def test_state_dynamics_learn_the_true_state_and_decide_the_simulators_success(tiny_world, tmp_path):
    from dataclasses import replace

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import rlvr_gym  # noqa: F401  (registers the env ids)
    from envs.robot.tasks import task_from_instruction
    from rlvr_gym.data.episodes import STATE_NAMES, write_shards
    from rlvr_gym.data.robot import episode_starts, load_initial_states, write_initial_states
    from rlvr_gym.models.state_dynamics import dynamics_reach_distance, dynamics_success_probability
    from rlvr_gym.sim.robot import STATE_OBSERVATION_NAMES, _Simulator, replay_success_scores, state_observation
    from rlvr_gym.train.state_dynamics import DynamicsConfig, train_state_dynamics

    root, world_dir = tiny_world
    collect(CollectConfig(out=str(tmp_path / "train"), episodes=24, seed=13, horizon=8))
    config = DynamicsConfig(run_dir=str(root / "dynamics"), world_model=str(world_dir), data=(str(tmp_path / "train"),),
                            heldout=str(root / "heldout"), steps=300, batch_size=32, members=2, hidden=64, layers=2,
                            warmup_steps=0, save_every=150)
    imported = [replace(e, states=np.full_like(e.states, np.nan), task="rt1", seed=-1) for e in load_episodes(root / "train")]
    write_shards(imported, tmp_path / "imported", "train")
    with pytest.raises(ValueError, match="no episode carries true states"):
        train_state_dynamics(replace(config, data=(str(tmp_path / "imported"),), run_dir=str(tmp_path / "none")))
    final = train_state_dynamics(config)
    losses = [row["train/loss"] for row in read_log(root / "dynamics") if "train/loss" in row]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), "the ensemble learns the state's changes"
    metrics = json.loads((root / "dynamics" / "eval.json").read_text())
    assert metrics["gripper_mm"] < metrics["gripper_copy_mm"], "the palm follows the action: better than copying it"
    assert {"drawer_mm", "objects_mm", "success_match", "one_step_disagreement"} <= set(metrics)
    assert train_state_dynamics(replace(config, steps=302, resume=True)) == final
    assert read_log(root / "dynamics")[-1]["step"] == 302

    world_out = root / "dynamics" / "world_model"
    world = RobotWorldModel.load(world_out)
    assert world.state_dynamics is not None and RobotWorldModel.load(world_dir).state_dynamics is None
    assert world.settings.success_thresholds == {} and world.settings.success_hold == 1
    # The true start states recorded by resetting the real env at each seed are the ones the episodes recorded.
    starts = load_initial_states(world_out)
    recorded = {int(s): (state, target) for s, state, target in zip(starts.seeds, starts.states, starts.targets)}
    from_episodes = episode_starts(load_episodes(root / "train"))
    assert set(recorded) == set(from_episodes.seeds.tolist()), "the tiny world starts from its training episodes"
    for seed, state, target in zip(from_episodes.seeds, from_episodes.states, from_episodes.targets):
        np.testing.assert_allclose(recorded[int(seed)][0], state, atol=1e-5)
        np.testing.assert_allclose(recorded[int(seed)][1], target, atol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        world.state_dynamics.step(np.zeros((2, 3)), np.zeros((2, 7)), np.zeros((2, 7)))

    # The simulator's success is the task's own test on the state the dynamics predict under the agent's actions.
    env = gym.make("RLVRWorld-RT1-v0", checkpoint=str(world_out), horizon=4).unwrapped
    env.reset(seed=0, options={"index": 0})
    action = np.full(7, 0.5, np.float32)
    _, reward, terminated, _, info = env.step(action)
    expected, _ = world.state_dynamics.step(starts.states[:1], action[None], np.zeros((1, 7)))
    np.testing.assert_allclose([info["predicted_state"][name] for name in STATE_NAMES], expected[0], atol=1e-5)
    probability = dynamics_success_probability(task_from_instruction(info["instruction"]), expected, starts.targets[0])
    assert info["success_prob"] == pytest.approx(probability[0], abs=1e-5)
    assert reward == float(info["success_prob"] > 0.5) == float(terminated) and info["state_disagreement"] >= 0
    reach = dynamics_reach_distance(task_from_instruction(info["instruction"]), expected, starts.targets[0])
    assert info["reach_distance"] == pytest.approx(reach[0], abs=1e-5) and reach[0] > 0

    # Observed as the state: the same dynamics, the same success, no frame drawn; the vector env the same per sub-env.
    state_env = gym.make("RLVRWorld-RT1-v0", checkpoint=str(world_out), horizon=4, observation="state")
    check_env(state_env.unwrapped, skip_render_check=True)
    obs, _ = state_env.reset(seed=0, options={"index": 0})
    assert state_env.observation_space.shape == (len(STATE_OBSERVATION_NAMES),) and obs.dtype == np.float32
    np.testing.assert_allclose(obs, state_observation(starts.states[0], starts.targets[0]))
    obs, state_reward, state_terminated, _, state_info = state_env.step(action)
    np.testing.assert_allclose(obs, state_observation(expected[0], starts.targets[0]), atol=1e-5)
    assert (state_reward, state_terminated) == (reward, terminated)
    assert state_info["success_prob"] == pytest.approx(info["success_prob"], abs=1e-5)
    assert state_info["uncertainty"] == state_info["state_disagreement"] == pytest.approx(info["state_disagreement"])
    vector = gym.make_vec("RLVRWorld-RT1-v0", num_envs=2, vectorization_mode="vector_entry_point",
                          checkpoint=str(world_out), horizon=4, observation="state")
    vector.reset(seed=0, options={"index": 0})
    batch, *_ = vector.step(np.stack([action, action]))
    np.testing.assert_allclose(batch, np.stack([obs, obs]), atol=1e-5)
    with pytest.raises(ValueError, match="no frames to render"):
        gym.make("RLVRWorld-RT1-v0", checkpoint=str(world_out), observation="state", render_mode="rgb_array")
    with pytest.raises(ValueError, match="has none"):
        gym.make("RLVRWorld-RT1-v0", checkpoint=str(world_dir), observation="state")
    with pytest.raises(ValueError, match="observation must be one of"):
        gym.make("RLVRWorld-RT1-v0", checkpoint=str(world_out), observation="pixels")
    sim = _Simulator.load(world_out, None, 0.0)
    episode = load_episodes(root / "heldout")[0]
    assert replay_success_scores(sim, [episode]).shape == (1,)
    with pytest.raises(ValueError, match="true_state"):
        sim.start_from_frame(episode.frames[0], episode.task, episode.instruction)
    with pytest.raises(ValueError, match="true start states"):
        sim.add_starts(replace(starts, states=None, targets=None))
    assert len(sim.states) == len(starts), "a refused start leaves the simulator as it was"

    # Initial states without the true states are refused, naming the command that records them.
    write_initial_states(world_out, replace(starts, states=None, targets=None))
    with pytest.raises(CheckpointError, match="train state-dynamics"):
        _Simulator.load(world_out, None, 0.0)
    (world_out / "state_dynamics" / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(CheckpointError, match="state dynamics"):
        RobotWorldModel.load(world_out)
