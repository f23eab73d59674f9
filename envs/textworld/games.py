"""Generate and compile small TextWorld games, deterministically by seed, into a cache directory."""

import os
import shutil
import tempfile
from pathlib import Path

from textworld import GameOptions
from textworld.generator import compile_game
from textworld.generator import make_game as tw_make_game

DEFAULT_GAME_DIR = Path("runs/textworld_games")

# Z-machine header bytes 0x12-0x17 hold the story serial number, which Inform 7 sets to the compile date;
# they lie outside the checksummed region (from 0x40), so fixing them makes the file depend on the seed only.
_SERIAL = slice(0x12, 0x18)
_FIXED_SERIAL = b"000000"


def game_name(seed: int, nb_rooms: int, nb_objects: int, quest_length: int) -> str:
    """File stem of the compiled game for these generation arguments."""
    return f"tw-s{seed}-r{nb_rooms}-o{nb_objects}-q{quest_length}"


def make_game(
    seed: int,
    out_dir: str | Path = DEFAULT_GAME_DIR,
    nb_rooms: int = 3,
    nb_objects: int = 5,
    quest_length: int = 3,
) -> Path:
    """Generate and compile a TextWorld game (`.z8` plus its `.json`); return the `.z8` path.

    The game is a function of the arguments only, so a compiled game already in `out_dir` is reused.
    `nb_objects` counts everything but rooms, doors, the player and the inventory; quest objects count too.
    """
    if nb_rooms < 1 or nb_objects < 0 or quest_length < 1:
        raise ValueError(
            f"make_game needs nb_rooms >= 1, nb_objects >= 0 and quest_length >= 1, "
            f"got nb_rooms={nb_rooms}, nb_objects={nb_objects}, quest_length={quest_length}"
        )
    out_dir = Path(out_dir)
    stem = game_name(seed, nb_rooms, nb_objects, quest_length)
    path = out_dir / f"{stem}.z8"
    if path.is_file() and path.with_suffix(".json").is_file():
        return path

    options = GameOptions()
    options.seeds = seed
    options.nb_rooms = nb_rooms
    options.nb_objects = nb_objects
    options.quest_length = quest_length
    game = tw_make_game(options)

    out_dir.mkdir(parents=True, exist_ok=True)
    # Compile in a private folder and move the files in, so processes sharing the cache never see half a game.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=out_dir))
    try:
        options.path = str(tmp_dir / f"{stem}.z8")
        compiled = Path(compile_game(game, options))
        story = bytearray(compiled.read_bytes())
        story[_SERIAL] = _FIXED_SERIAL
        compiled.write_bytes(story)
        os.replace(compiled.with_suffix(".json"), path.with_suffix(".json"))
        os.replace(compiled, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return path
