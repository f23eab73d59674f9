"""Import Open X-Embodiment RLDS TFRecords of RT-1 (`fractal20220817_data`) as `Episode` shards, without TensorFlow.

**Files.** TFDS writes `fractal20220817_data-train.tfrecord-00000-of-01024` etc.: TFRecord framing (uint64 length,
masked CRC-32C of the length, the data, masked CRC-32C of the data; both CRCs are checked), one record per
episode, each a `tf.train.Example` protobuf read here by a small wire-format decoder. TFDS flattens the RLDS
episode into features named by their path, one value (or fixed-size group of values) per step:

| feature                                          | per step                           | used as                    |
|--------------------------------------------------|------------------------------------|----------------------------|
| `steps/observation/image`                        | 1 encoded image (JPEG, 256x320x3)  | frames                     |
| `steps/observation/natural_language_instruction` | 1 string                           | instruction (first step's) |
| `steps/action/world_vector`                      | 3 floats                           | action[0:3]                |
| `steps/action/rotation_delta`                    | 3 floats                           | action[3:6]                |
| `steps/action/gripper_closedness_action`         | 1 float                            | action[6]                  |
| `steps/reward`                                   | 1 float                            | rewards, success           |
| `steps/is_first`, `is_last`, `is_terminal`       | 1 int (bool)                       | not needed                 |
| `steps/action/terminate_episode`                 | 3 ints                             | ignored                    |

RT-1's other features (base displacement, proprioception, the 512-d language embedding) are ignored.

**Steps to transitions.** An RLDS episode of N steps holds N observations; RLDS' last step carries the final
observation, and its action (a terminate action) is not applied to the world. So an `Episode` gets the N frames
and the first N - 1 actions. OXE's demos carry reward 1 on the final step ("1 on final step for demos", RLDS
template of the OXE datasets): the reward of step k says whether observation k shows the task done, so the
`Episode`'s transition t (frame t to t + 1) gets reward k = t + 1, and `success[t]` is whether any reward up to
then was positive.

**Actions.** Our 7-d layout is RT-1's (world_vector, rotation_delta, gripper_closedness), each scaled into
[-1, 1] and clipped:
- world_vector / `world_vector_scale` (default 1.0: RT-1's action spec bounds it to [-1, 1]; in
  fractal20220817_data its 1st / 99th percentiles are about -0.22 / +0.22 (Octo / OpenVLA statistics), with rare outliers up to 22,
  so a scale of 0.25 uses more of the range, at the price of clipping ~1% of values);
- rotation_delta / `rotation_scale` (default pi/2: RT-1's spec bound, which the data's extremes reach;
  1st / 99th percentiles about -0.44 / +0.59);
- gripper: fractal's `gripper_closedness_action` is relative (+1 close, -1 open, 0 keep), ours is the
  absolute closedness (-1 open .. +1 closed). `gripper="relative"` converts: the latest non-zero command
  (|c| > 0.1) sets the state; before the first one the gripper is taken to be in the opposite state (as
  Octo's rel2abs does). `gripper="absolute"` takes the value as it is.

**Frames.** Decoded with Pillow and resized to 64x64 with box (area-average) resampling: each output
pixel is the mean of the 5x4 input pixels it covers (the 320x256 frame is squashed, not cropped, so the
whole workspace stays in view), which antialiases without ringing.

Imported episodes have task "rt1", policy "rt1", seed -1 (no env seed; split held-out data by input file)
and NaN states (the true state is unknown).
"""

from __future__ import annotations

import functools
import io
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image
from tqdm import tqdm

from rlvr_gym.data.episodes import IMAGE_SHAPE, STATE_NAMES, Episode, write_shards

IMAGE_KEY = "steps/observation/image"
INSTRUCTION_KEY = "steps/observation/natural_language_instruction"
WORLD_VECTOR_KEY = "steps/action/world_vector"
ROTATION_KEY = "steps/action/rotation_delta"
GRIPPER_KEY = "steps/action/gripper_closedness_action"
REWARD_KEY = "steps/reward"
GRIPPER_THRESHOLD = 0.1
"""A relative gripper command counts as open / close when its magnitude exceeds this."""

log = logging.getLogger(__name__)


# CRC-32C (Castagnoli), reflected, as TFRecord uses it.

_POLY = 0x82F63B78
_MASK_DELTA = 0xA282EAD8
_PARALLEL_MIN = 4096


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _crc_table()
_TABLE_LIST = _TABLE.tolist()
_BITS = np.arange(32, dtype=np.uint32)
# Column b: the register after one zero byte, started from the register 1 << b; the register update is linear.
_ONE_ZERO_BYTE = _TABLE[(np.uint32(1) << _BITS) & 0xFF] ^ ((np.uint32(1) << _BITS) >> np.uint32(8))


def _advance(matrix: np.ndarray, registers: np.ndarray) -> np.ndarray:
    """Apply a GF(2) 32x32 matrix (given by its 32 columns) to each uint32 register."""
    bits = (registers[:, None] >> _BITS) & np.uint32(1)
    return np.bitwise_xor.reduce(bits * matrix, axis=1)


@functools.lru_cache(maxsize=None)
def _zero_bytes_operator(n: int) -> np.ndarray:
    """The matrix that advances a register over n zero bytes, by repeated squaring (n is a power of two here)."""
    result = np.uint32(1) << _BITS
    power = _ONE_ZERO_BYTE
    while n:
        if n & 1:
            result = _advance(power, result)
        power = _advance(power, power)
        n >>= 1
    return result


def crc32c(data: bytes | memoryview) -> int:
    """CRC-32C of data. Long inputs run as interleaved lanes in numpy, then combine: ~200 MB/s against ~15 for a loop."""
    n = len(data)
    if n < _PARALLEL_MIN:
        register, table = 0xFFFFFFFF, _TABLE_LIST
        for byte in bytes(data):
            register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
        return register ^ 0xFFFFFFFF
    # The initial register 0xFFFFFFFF equals a zero register with the first four bytes inverted, and zero bytes
    # before the data leave a zero register unchanged: so pad in front to lanes x width, every lane from zero.
    # Powers of two for both keep the combining operators few and cached.
    width = 1 << max(6, n.bit_length() - 11)
    lanes = 1 << (-(-n // width) - 1).bit_length()
    padded = np.zeros(lanes * width, np.uint8)
    pad = lanes * width - n
    padded[pad:] = np.frombuffer(data, np.uint8)
    padded[pad : pad + 4] ^= 0xFF
    columns = np.ascontiguousarray(padded.reshape(lanes, width).T)
    registers = np.zeros(lanes, np.uint32)
    for column in columns:
        registers = _TABLE[(registers ^ column) & 0xFF] ^ (registers >> np.uint32(8))
    span = width
    while len(registers) > 1:
        registers = _advance(_zero_bytes_operator(span), registers[0::2]) ^ registers[1::2]
        span *= 2
    return int(registers[0]) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_tfrecords(path: str | os.PathLike) -> Iterator[bytes]:
    """Yield the records of an uncompressed TFRecord file, checking both CRCs; errors name the file and record."""
    path = Path(path)
    with open(path, "rb") as f:
        index = 0
        while header := f.read(12):
            if len(header) < 12:
                raise ValueError(f"{path}: record {index} is truncated in its header; the file is incomplete, copy it again")
            length, length_crc = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != length_crc:
                raise ValueError(
                    f"{path}: record {index}: CRC mismatch in the length field; the file is corrupt "
                    "or not an uncompressed TFRecord file"
                )
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                raise ValueError(
                    f"{path}: record {index} is truncated ({len(data)} of {length} data bytes); "
                    "the file is incomplete, copy it again"
                )
            if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
                raise ValueError(f"{path}: record {index}: CRC mismatch in the data; the file is corrupt, copy it again")
            yield data
            index += 1


# Protobuf wire format, just enough for tf.train.Example.


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field of a message: an int for varints, else the raw bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, pos = _varint(buf, pos)
            else:
                size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise ValueError(f"field {number} runs past the end of its message")
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire} in field {number}")
        yield number, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature(buf: memoryview) -> np.ndarray | list[bytes]:
    """A tf.train.Feature: BytesList (1) as a list of bytes, FloatList (2) as float32, Int64List (3) as int64."""
    result: np.ndarray | list[bytes] = []
    for kind, wire, payload in _fields(buf):
        if wire != 2:
            continue
        values = [(number, w, v) for number, w, v in _fields(payload) if number == 1]
        if kind == 1:
            result = [bytes(v) for _, w, v in values if w == 2]
        elif kind == 2:
            # Packed (wire type 2) or one fixed32 per value (wire type 5); the parser must accept both.
            result = np.frombuffer(b"".join(bytes(v) for _, _, v in values), "<f4").astype(np.float32)
        elif kind == 3:
            ints = []
            for _, w, v in values:
                if w == 0:
                    ints.append(_int64(v))
                else:
                    pos = 0
                    while pos < len(v):
                        raw, pos = _varint(v, pos)
                        ints.append(_int64(raw))
            result = np.array(ints, dtype=np.int64)
    return result


def parse_example(data: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """Decode a serialized tf.train.Example into {feature name: float32 / int64 array, or list of bytes}."""
    features: dict[str, np.ndarray | list[bytes]] = {}
    for number, wire, example_field in _fields(memoryview(data)):
        if number != 1 or wire != 2:  # Example.features
            continue
        for entry_number, entry_wire, entry in _fields(example_field):
            if entry_number != 1 or entry_wire != 2:  # Features.feature, a map entry {1: key, 2: Feature}
                continue
            key, value = None, memoryview(b"")
            for part, part_wire, content in _fields(entry):
                if part == 1 and part_wire == 2:
                    key = bytes(content).decode("utf-8")
                elif part == 2 and part_wire == 2:
                    value = content
            if key is None:
                raise ValueError("a feature map entry has no name")
            features[key] = _feature(value)
    return features


# Episodes.


def episode_from_example(
    features: dict[str, np.ndarray | list[bytes]],
    world_vector_scale: float = 1.0,
    rotation_scale: float = np.pi / 2,
    gripper: Literal["relative", "absolute"] = "relative",
) -> Episode:
    """Convert one decoded RLDS episode of RT-1 into an Episode (see the module docstring for the mapping)."""
    required = (IMAGE_KEY, INSTRUCTION_KEY, WORLD_VECTOR_KEY, ROTATION_KEY, GRIPPER_KEY, REWARD_KEY)
    missing = [key for key in required if key not in features]
    if missing:
        raise ValueError(f"missing features {missing}; the record has {sorted(features)}")
    images = features[IMAGE_KEY]
    if not isinstance(images, list):
        raise ValueError(f"{IMAGE_KEY} must be a list of encoded images")
    n = len(images)
    if n < 2:
        raise ValueError(f"the episode has {n} step(s); at least 2 are needed for one transition")
    world = _per_step(features, WORLD_VECTOR_KEY, n, 3)
    rotation = _per_step(features, ROTATION_KEY, n, 3)
    grip = _per_step(features, GRIPPER_KEY, n, 1)[:, 0]
    reward = _per_step(features, REWARD_KEY, n, 1)[:, 0]
    if gripper == "relative":
        grip = _absolute_gripper(grip)
    elif gripper != "absolute":
        raise ValueError(f"gripper must be 'relative' or 'absolute', got {gripper!r}")
    actions = np.concatenate([world / world_vector_scale, rotation / rotation_scale, grip[:, None]], axis=1)
    instruction = features[INSTRUCTION_KEY]
    if not isinstance(instruction, list) or not instruction:
        raise ValueError(f"{INSTRUCTION_KEY} must hold one string per step")
    rewards = reward[1:].astype(np.float32)
    return Episode(
        frames=np.stack([_decode_frame(image, k) for k, image in enumerate(images)]),
        actions=np.clip(actions[:-1], -1.0, 1.0).astype(np.float32),
        rewards=rewards,
        success=np.maximum.accumulate(rewards > 0),
        states=np.full((n, len(STATE_NAMES)), np.nan, np.float32),
        task="rt1",
        instruction=instruction[0].decode("utf-8").strip("\x00 \n"),
        seed=-1,
        policy="rt1",
    )


def read_rlds_episodes(
    path: str | os.PathLike,
    world_vector_scale: float = 1.0,
    rotation_scale: float = np.pi / 2,
    gripper: Literal["relative", "absolute"] = "relative",
) -> Iterator[Episode]:
    """Yield the episodes of one RLDS TFRecord file; episodes of fewer than 2 steps are skipped with a warning."""
    for index, record in enumerate(read_tfrecords(path)):
        try:
            features = parse_example(record)
            if IMAGE_KEY in features and len(features[IMAGE_KEY]) < 2:
                log.warning("%s: record %d skipped: fewer than 2 steps, so no transition", path, index)
                continue
            episode = episode_from_example(features, world_vector_scale, rotation_scale, gripper)
        except ValueError as e:
            raise ValueError(f"{path}: record {index}: not an RT-1 RLDS episode: {e}") from None
        yield episode


def tfrecord_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files named by `paths`: each a TFRecord file, or a directory whose `*.tfrecord*` files are taken in name order."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.glob("*.tfrecord*") if p.is_file())
            if not found:
                raise FileNotFoundError(
                    f"{path}: no *.tfrecord* files; pass the TFDS dataset directory, e.g. fractal20220817_data/0.1.0"
                )
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    if not files:
        raise ValueError("no input paths given")
    return files


def import_rlds(
    paths: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    split: str = "train",
    world_vector_scale: float = 1.0,
    rotation_scale: float = np.pi / 2,
    gripper: Literal["relative", "absolute"] = "relative",
    episodes_per_shard: int = 100,
    overwrite: bool = False,
) -> Path:
    """Convert RT-1 RLDS TFRecord files (or directories of them) into an episode dataset in out_dir; returns out_dir."""
    if world_vector_scale <= 0 or rotation_scale <= 0:
        raise ValueError(
            f"scales must be positive, got world_vector_scale={world_vector_scale}, rotation_scale={rotation_scale}"
        )
    files = tfrecord_files(paths)
    config = {
        "source": "rlds", "paths": [str(p) for p in files], "world_vector_scale": world_vector_scale,
        "rotation_scale": rotation_scale, "gripper": gripper, "image_resampling": "box",
    }  # fmt: skip

    def episodes() -> Iterator[Episode]:
        with tqdm(desc=f"import {split}", unit="ep") as bar:
            for file in files:
                for episode in read_rlds_episodes(file, world_vector_scale, rotation_scale, gripper):
                    bar.update()
                    yield episode

    return write_shards(episodes(), out_dir, split, episodes_per_shard, config, overwrite)


@dataclass
class ImportConfig:
    """Import Open X-Embodiment RLDS TFRecords of RT-1 (fractal20220817_data) as episode shards."""

    paths: tuple[str, ...]
    """TFRecord files, or TFDS directories holding them (e.g. fractal20220817_data/0.1.0)"""
    out: str
    """output directory for the shards and manifest.json"""
    split: str = "train"
    """split name recorded in the manifest; import held-out data from other files into another directory"""
    world_vector_scale: float = 1.0
    """world_vector is divided by this and clipped to [-1, 1] (RT-1's spec bound is 1; its data mostly lie within 0.25)"""
    rotation_scale: float = float(np.pi / 2)
    """rotation_delta (rad) is divided by this and clipped to [-1, 1] (RT-1's spec bound is pi/2)"""
    gripper: Literal["relative", "absolute"] = "relative"
    """how gripper_closedness_action is meant: relative commands (RT-1) or absolute closedness"""
    episodes_per_shard: int = 100
    """episodes per .npz shard"""
    overwrite: bool = False
    """replace a dataset already in `out`"""


def import_rt1(config: ImportConfig) -> Path:
    """`rlvr-gym import rt1`: import_rlds with the config's fields."""
    options = asdict(config)
    return import_rlds(options.pop("paths"), options.pop("out"), **options)


def _per_step(features: dict, key: str, n: int, width: int) -> np.ndarray:
    values = features[key]
    if not isinstance(values, np.ndarray) or values.size != n * width:
        size = values.size if isinstance(values, np.ndarray) else f"{len(values)} byte strings"
        raise ValueError(f"{key} must hold {width} number(s) per step for {n} steps, got {size}")
    return values.astype(np.float32).reshape(n, width)


def _absolute_gripper(relative: np.ndarray) -> np.ndarray:
    commands = np.where(relative > GRIPPER_THRESHOLD, 1.0, np.where(relative < -GRIPPER_THRESHOLD, -1.0, 0.0))
    given = np.flatnonzero(commands)
    if len(given) == 0:
        return np.full(len(relative), -1.0, np.float32)
    state = np.empty(len(relative), np.float32)
    state[: given[0]] = -commands[given[0]]
    # Each command holds until the next one.
    owner = np.maximum.accumulate(np.where(commands != 0, np.arange(len(commands)), -1))
    state[given[0] :] = commands[owner[given[0] :]]
    return state


def _decode_frame(data: bytes, step: int) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as image:
            frame = image.convert("RGB").resize(IMAGE_SHAPE[1::-1], Image.Resampling.BOX)
    except OSError as e:
        raise ValueError(f"step {step}: the image does not decode ({e})") from None
    return np.asarray(frame, dtype=np.uint8)
