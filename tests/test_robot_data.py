import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tensorboard.summary.writer.record_writer import RecordWriter

from rlvr_gym.data import rlds
from rlvr_gym.data.episodes import (
    FORMAT_VERSION,
    MANIFEST,
    STATE_NAMES,
    CollectConfig,
    Episode,
    check_disjoint,
    collect,
    load_episodes,
    read_episodes,
    read_manifest,
    write_shards,
)

ARRAYS = ("frames", "actions", "rewards", "success", "states")


def synthetic_episode(length: int, seed: int, task: str = "move_near") -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        frames=rng.integers(0, 256, (length + 1, 64, 64, 3), dtype=np.uint8),
        actions=rng.uniform(-1, 1, (length, 7)).astype(np.float32),
        rewards=(np.arange(length) == length - 1).astype(np.float32),
        success=np.arange(length) == length - 1,
        states=rng.normal(size=(length + 1, len(STATE_NAMES))).astype(np.float32),
        task=task,
        instruction=f"move the red cube near the green cube {'x' * seed}",
        seed=seed,
        policy="scripted:0.7" if seed % 2 else "random",
    )


def assert_same_episode(a: Episode, b: Episode) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert getattr(a, name).dtype == getattr(b, name).dtype
    assert (a.task, a.instruction, a.seed, a.policy) == (b.task, b.instruction, b.seed, b.policy)


# Shards and manifest.


def test_shards_round_trip_every_array_and_string(tmp_path):
    episodes = [synthetic_episode(length, seed) for seed, length in enumerate([3, 1, 7, 2, 5])]
    write_shards(episodes, tmp_path, "train", episodes_per_shard=2)
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["train-00000.npz", "train-00001.npz", "train-00002.npz"]
    loaded = load_episodes(tmp_path, split="train")
    assert len(loaded) == len(episodes)
    for a, b in zip(episodes, loaded):
        assert_same_episode(a, b)


def test_shards_are_plain_arrays_readable_without_pickle(tmp_path):
    write_shards([synthetic_episode(2, 0), synthetic_episode(3, 1)], tmp_path, "train")
    with np.load(tmp_path / "train-00000.npz", allow_pickle=False) as npz:
        assert npz["episode_starts"].tolist() == [0, 2]
        assert npz["frames"].shape == (2 + 1 + 3 + 1, 64, 64, 3)
        assert npz["task"].dtype.kind == "U" and npz["policy"].tolist() == ["random", "scripted:0.7"]


def test_manifest_lists_shards_episodes_split_and_config(tmp_path):
    episodes = [synthetic_episode(4, 10), synthetic_episode(2, 11, task="open_drawer")]
    write_shards(episodes, tmp_path, "heldout", episodes_per_shard=1, config={"command": "x --seed 1"})
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["version"] == FORMAT_VERSION and manifest["split"] == "heldout"
    assert manifest["shards"] == [
        {"file": "heldout-00000.npz", "episodes": 1, "steps": 4},
        {"file": "heldout-00001.npz", "episodes": 1, "steps": 2},
    ]
    assert [(e["task"], e["seed"], e["policy"], e["length"], e["success"]) for e in manifest["episodes"]] == [
        ("move_near", 10, "random", 4, True),
        ("open_drawer", 11, "scripted:0.7", 2, True),
    ]
    assert manifest["config"] == {"command": "x --seed 1"}
    assert manifest["state_names"] == list(STATE_NAMES)


def test_missing_manifest_says_how_to_make_a_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="no manifest.json.*rlvr-gym collect rt1"):
        load_episodes(tmp_path)


def test_corrupt_shard_error_names_the_file(tmp_path):
    write_shards([synthetic_episode(3, 0)], tmp_path, "train")
    shard = tmp_path / "train-00000.npz"
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError, match="train-00000.npz: corrupt episode shard"):
        load_episodes(tmp_path)


def test_missing_shard_error_names_the_file(tmp_path):
    write_shards([synthetic_episode(3, 0), synthetic_episode(3, 1)], tmp_path, "train", episodes_per_shard=1)
    (tmp_path / "train-00001.npz").unlink()
    reader = read_episodes(tmp_path)
    next(reader)
    with pytest.raises(FileNotFoundError, match="train-00001.npz: shard listed"):
        next(reader)


def test_version_mismatch_and_wrong_split_are_refused(tmp_path):
    write_shards([synthetic_episode(2, 0)], tmp_path, "train")
    with pytest.raises(ValueError, match="holds split 'train', not 'heldout'"):
        load_episodes(tmp_path, split="heldout")
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["version"] = FORMAT_VERSION + 1
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"version {FORMAT_VERSION + 1}, this rlvr-gym reads version {FORMAT_VERSION}"):
        load_episodes(tmp_path)


def test_existing_dataset_is_kept_unless_overwrite(tmp_path):
    write_shards([synthetic_episode(2, 0)] * 3, tmp_path, "train", episodes_per_shard=1)
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        write_shards([synthetic_episode(2, 5)], tmp_path, "train")
    write_shards([synthetic_episode(2, 5)], tmp_path, "train", overwrite=True)
    assert [p.name for p in tmp_path.glob("*.npz")] == ["train-00000.npz"]
    assert [e.seed for e in load_episodes(tmp_path)] == [5]


def test_malformed_episode_is_refused_before_writing(tmp_path):
    bad = synthetic_episode(3, 0)
    bad.frames = bad.frames[:-1]
    with pytest.raises(ValueError, match=r"Episode.frames must be uint8 \(4, 64, 64, 3\)"):
        write_shards([bad], tmp_path, "train")
    wild = synthetic_episode(3, 0)
    wild.actions[0, 0] = 1.5
    with pytest.raises(ValueError, match=r"within \[-1, 1\]"):
        write_shards([wild], tmp_path, "train")
    assert not (tmp_path / MANIFEST).exists()


def test_check_disjoint_detects_shared_seeds(tmp_path):
    write_shards([synthetic_episode(2, s) for s in (1, 2, 3)], tmp_path / "a", "train")
    write_shards([synthetic_episode(2, s) for s in (4, 5)], tmp_path / "b", "heldout")
    write_shards([synthetic_episode(2, s) for s in (5, 6)], tmp_path / "c", "heldout")
    check_disjoint(tmp_path / "a", tmp_path / "b")
    with pytest.raises(ValueError, match=r"share 1 env seeds \(e.g. \[5\]\).*another --seed"):
        check_disjoint(tmp_path / "b", tmp_path / "c")


# Collection from the real env.


def test_collect_real_episodes_reproduces_env_resets(tmp_path):
    import envs.robot as robot

    config = CollectConfig(out=str(tmp_path / "train"), episodes=3, seed=7, horizon=5, tasks=("open_drawer", "move_near"))
    episodes = load_episodes(collect(config), split="train")
    assert [e.seed for e in episodes] == [7_000_000, 7_000_001, 7_000_002]
    assert [e.task for e in episodes] == ["open_drawer", "move_near", "open_drawer"]
    for episode in episodes:
        assert 1 <= len(episode) <= 5
        assert episode.policy == "random" or episode.policy in {f"scripted:{s:g}" for s in config.skills}
        assert np.isfinite(episode.states).all()
        assert (episode.frames[1:] != episode.frames[:-1]).any(), "the gripper moves, so frames change"
    # The first frame and state are the env's reset with the episode's seed.
    env = robot.RealRT1Env(task="move_near", horizon=5)
    obs, info = env.reset(seed=7_000_001)
    env.close()
    np.testing.assert_array_equal(episodes[1].frames[0], obs)
    np.testing.assert_allclose(episodes[1].states[0, :3], info["gripper_pos"], rtol=1e-6)
    np.testing.assert_allclose(episodes[1].states[0, 4:13], info["object_pos"].ravel(), rtol=1e-6)
    assert episodes[1].instruction == info["instruction"]
    manifest = read_manifest(tmp_path / "train")
    assert manifest["config"]["command"].startswith("rlvr-gym collect rt1 --out ")
    assert "--seed 7" in manifest["config"]["command"] and manifest["config"]["horizon"] == 5


def test_collect_with_workers_gives_the_same_data_and_disjoint_seeds(tmp_path):
    base = dict(episodes=2, horizon=4, tasks=("push_to_target",), random_fraction=0.5)
    one = load_episodes(collect(CollectConfig(out=str(tmp_path / "one"), seed=1, **base)))
    two = load_episodes(collect(CollectConfig(out=str(tmp_path / "two"), seed=1, workers=2, **base)))
    for a, b in zip(one, two, strict=True):
        assert_same_episode(a, b)
    collect(CollectConfig(out=str(tmp_path / "heldout"), seed=2, split="heldout", **base))
    check_disjoint(tmp_path / "one", tmp_path / "heldout")
    with pytest.raises(ValueError, match="share 2 env seeds"):
        check_disjoint(tmp_path / "one", tmp_path / "two")


def test_collect_trivial_fraction_records_the_probes_constant_actions(tmp_path):
    from envs.robot.policies import TRIVIAL_POLICIES, trivial_action

    config = CollectConfig(out=str(tmp_path), episodes=4, seed=3, horizon=3, tasks=("open_drawer",),
                           random_fraction=0.0, trivial_fraction=1.0)
    episodes = load_episodes(collect(config))
    for episode in episodes:
        kind, name = episode.policy.split(":")
        assert kind == "trivial" and name in TRIVIAL_POLICIES
        assert (episode.actions == trivial_action(name)).all() and not episode.success.any()
    assert np.array_equal(trivial_action("-z"), [0, 0, -1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="sum to at most 1"):
        collect(CollectConfig(out=str(tmp_path / "x"), episodes=1, random_fraction=0.5, trivial_fraction=0.6))
    with pytest.raises(ValueError, match="unknown trivial policy"):
        trivial_action("+w")


def test_collect_defaults_to_every_task_and_rejects_unknown_ones(tmp_path):
    import envs.robot as robot

    assert CollectConfig(out="x").tasks == robot.TASKS
    with pytest.raises(ValueError, match="unknown or no tasks.*fly"):
        collect(CollectConfig(out=str(tmp_path), episodes=1, tasks=("fly",)))


# RLDS importer: TFRecords written here with a minimal protobuf encoder.


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def _feature(kind: str, values, packed: bool) -> bytes:
    if kind == "bytes":
        return _field(1, 2, b"".join(_field(1, 2, v) for v in values))
    if kind == "float":
        floats = np.asarray(values, "<f4").ravel()
        inner = _field(1, 2, floats.tobytes()) if packed else b"".join(_field(1, 5, struct.pack("<f", v)) for v in floats)
        return _field(2, 2, inner)
    ints = np.asarray(values, np.int64).ravel().tolist()
    inner = _field(1, 2, b"".join(map(_varint, ints))) if packed else b"".join(_field(1, 0, _varint(v)) for v in ints)
    return _field(3, 2, inner)


def encode_example(features: dict[str, tuple[str, object]], packed: bool = True) -> bytes:
    entries = b"".join(
        _field(1, 2, _field(1, 2, name.encode()) + _field(2, 2, _feature(kind, values, packed)))
        for name, (kind, values) in features.items()
    )
    return _field(1, 2, entries)


def rt1_frames(n: int, seed: int) -> np.ndarray:
    """RT-1-sized frames (256 x 320) with smooth content, so PNG and JPEG stay small."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:256, 0:320]
    base = np.stack([x * 255 / 319, y * 255 / 255, (x + y) % 256], axis=-1)
    return np.stack([np.clip(base + rng.integers(0, 40, 3) * (k + 1), 0, 255) for k in range(n)]).astype(np.uint8)


def encode_image(frame: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format=fmt)
    return buf.getvalue()


def rt1_example(frames: np.ndarray, fmt: str = "PNG", instruction: bytes = b"pick coke can") -> dict:
    n = len(frames)
    world = np.tile([0.5, -2.0, 0.1], (n, 1))
    world[:, 2] += np.arange(n) * 0.1
    return {
        "steps/observation/image": ("bytes", [encode_image(f, fmt) for f in frames]),
        "steps/observation/natural_language_instruction": ("bytes", [instruction] * n),
        "steps/observation/natural_language_embedding": ("float", np.ones((n, 8))),
        "steps/action/world_vector": ("float", world),
        "steps/action/rotation_delta": ("float", np.tile([np.pi / 4, -np.pi, 0.0], (n, 1))),
        "steps/action/gripper_closedness_action": ("float", [0.0, 1.0, 0.0, -1.0][:n] + [0.0] * max(0, n - 4)),
        "steps/action/terminate_episode": ("int", np.tile([0, 1, 0], (n, 1))),
        "steps/reward": ("float", (np.arange(n) == n - 1).astype(float)),
        "steps/is_first": ("int", np.arange(n) == 0),
        "steps/is_last": ("int", np.arange(n) == n - 1),
        "steps/is_terminal": ("int", np.arange(n) == n - 1),
    }


def write_tfrecord(path: Path, records: list[bytes]) -> Path:
    # tensorboard's RecordWriter frames records with its own CRC-32C: an independent check of ours.
    with open(path, "wb") as f:
        writer = RecordWriter(f)
        for record in records:
            writer.write(record)
    return path


def test_crc32c_matches_known_value_and_tensorboard_on_long_input():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    assert rlds.crc32c(b"123456789") == 0xE3069283
    data = np.random.default_rng(0).integers(0, 256, 70_001, dtype=np.uint8).tobytes()
    assert rlds.masked_crc32c(data) == masked_crc32c(data)
    assert rlds.masked_crc32c(data[:5000]) == masked_crc32c(data[:5000])


@pytest.mark.parametrize("packed", [True, False])
def test_parse_example_decodes_all_list_kinds(packed):
    features = {
        "b": ("bytes", [b"", b"abc"]),
        "f": ("float", [1.5, -2.25, 3e-8]),
        "i": ("int", [0, 1, -5, 2**40, -(2**63)]),
    }
    parsed = rlds.parse_example(encode_example(features, packed=packed))
    assert parsed["b"] == [b"", b"abc"]
    np.testing.assert_array_equal(parsed["f"], np.array([1.5, -2.25, 3e-8], np.float32))
    assert parsed["i"].tolist() == [0, 1, -5, 2**40, -(2**63)]


def test_rt1_episode_conversion_frames_actions_gripper_and_success(tmp_path):
    frames = rt1_frames(4, seed=0)
    path = write_tfrecord(tmp_path / "fractal20220817_data-train.tfrecord-00000-of-00001", [encode_example(rt1_example(frames))])
    (episode,) = rlds.read_rlds_episodes(path)
    episode.validate()
    assert len(episode) == 3 and episode.frames.shape == (4, 64, 64, 3)
    # Box resampling of a 256 x 320 frame is the mean of each 4 x 5 block.
    expected = frames.reshape(4, 64, 4, 64, 5, 3).mean(axis=(2, 4))
    assert np.abs(episode.frames.astype(float) - expected).max() <= 1.0
    np.testing.assert_allclose(episode.actions[:, :3], [[0.5, -1.0, 0.1], [0.5, -1.0, 0.2], [0.5, -1.0, 0.3]], atol=1e-6)
    np.testing.assert_allclose(episode.actions[:, 3:6], np.tile([0.5, -1.0, 0.0], (3, 1)), atol=1e-6)
    # Relative commands [keep, close, keep, open]: open before the first close, then closed.
    assert episode.actions[:, 6].tolist() == [-1.0, 1.0, 1.0]
    assert episode.rewards.tolist() == [0.0, 0.0, 1.0] and episode.success.tolist() == [False, False, True]
    assert (episode.task, episode.policy, episode.seed, episode.instruction) == ("rt1", "rt1", -1, "pick coke can")
    assert np.isnan(episode.states).all()


def test_import_rlds_writes_readable_shards_from_jpeg_and_unpacked_records(tmp_path):
    src = tmp_path / "fractal20220817_data" / "0.1.0"
    src.mkdir(parents=True)
    write_tfrecord(src / "fractal20220817_data-train.tfrecord-00000-of-00002", [
        encode_example(rt1_example(rt1_frames(3, seed=1), "JPEG", b"open top drawer")),
        encode_example(rt1_example(rt1_frames(1, seed=2))),  # a single step has no transition: skipped
    ])  # fmt: skip
    write_tfrecord(src / "fractal20220817_data-train.tfrecord-00001-of-00002", [
        encode_example(rt1_example(rt1_frames(5, seed=3), "PNG", b"place apple"), packed=False),
    ])  # fmt: skip
    out = rlds.import_rlds([src], tmp_path / "rt1", split="train", world_vector_scale=4.0, rotation_scale=np.pi)
    episodes = load_episodes(out, split="train")
    assert [(len(e), e.instruction) for e in episodes] == [(2, "open top drawer"), (4, "place apple")]
    np.testing.assert_allclose(episodes[0].actions[0, :6], [0.125, -0.5, 0.025, 0.25, -1.0, 0.0], atol=1e-6)
    assert episodes[0].frames.dtype == np.uint8 and episodes[0].frames.std() > 10
    manifest = read_manifest(out)
    assert manifest["config"]["world_vector_scale"] == 4.0 and len(manifest["config"]["paths"]) == 2
    check_disjoint(out, out)  # imported episodes have no env seed (-1): nothing to share


def test_rlds_corrupt_data_crc_names_file_and_record(tmp_path):
    records = [encode_example(rt1_example(rt1_frames(2, seed=s))) for s in range(2)]
    path = write_tfrecord(tmp_path / "rt1.tfrecord", records)
    data = bytearray(path.read_bytes())
    second_record_data = 8 + 4 + len(records[0]) + 4 + 12
    data[second_record_data + 100] ^= 0x01
    path.write_bytes(bytes(data))
    reader = rlds.read_tfrecords(path)
    assert next(reader) == records[0]
    with pytest.raises(ValueError, match=r"rt1.tfrecord: record 1: CRC mismatch in the data"):
        next(reader)


def test_rlds_corrupt_length_and_truncated_file_raise(tmp_path):
    record = encode_example(rt1_example(rt1_frames(2, seed=0)))
    path = write_tfrecord(tmp_path / "a.tfrecord", [record, record])
    good = path.read_bytes()
    path.write_bytes(good[:3] + bytes([good[3] ^ 0x10]) + good[4:])
    with pytest.raises(ValueError, match="a.tfrecord: record 0: CRC mismatch in the length field"):
        list(rlds.read_tfrecords(path))
    path.write_bytes(good[:-10])
    with pytest.raises(ValueError, match=r"a.tfrecord: record 1 is truncated"):
        list(rlds.read_tfrecords(path))
    path.write_bytes(good + good[:5])
    with pytest.raises(ValueError, match="record 2 is truncated in its header"):
        list(rlds.read_tfrecords(path))


def test_rlds_record_without_rt1_features_says_what_it_has(tmp_path):
    path = write_tfrecord(tmp_path / "other.tfrecord", [encode_example({"steps/action": ("float", [0.0] * 14)})])
    expected = r"other.tfrecord: record 0: not an RT-1 RLDS episode: missing features.*has \['steps/action'\]"
    with pytest.raises(ValueError, match=expected):
        list(rlds.read_rlds_episodes(path))
