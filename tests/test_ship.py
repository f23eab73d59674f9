"""`rlvr-gym ship`: a trained text or web model becomes an fp16 checkpoint with real start states that its env resets to."""

import json

import gymnasium as gym
import pytest
import torch
from safetensors.torch import load_file

import rlvr_gym  # noqa: F401  (registers the env ids)
from envs.web import browser_available
from rlvr_gym.data.textgame import train_tokenizer
from rlvr_gym.models.lm import LlamaSize, build_llama, load_model
from rlvr_gym.ship import ShipConfig, ship


@pytest.fixture
def trained(tmp_path):
    src = tmp_path / "final"
    tokenizer = train_tokenizer(['{"o":[{"n":"door","p":{"isOpen":false}}]} open door', "{}"], 300)
    torch.manual_seed(0)
    build_llama(len(tokenizer), LlamaSize(hidden_size=32, layers=1, heads=2, intermediate_size=64), tokenizer).save_pretrained(src)
    tokenizer.save_pretrained(src)
    (src / "CARD.md").write_text("# card\n")
    return src


def test_ship_textgame_writes_fp16_weights_and_real_start_states(tmp_path, trained):
    out = ship(ShipConfig(src=str(trained), name="t", domain="textgame", out=str(tmp_path / "shipped"), start_states=1))
    weights = load_file(out / "model.safetensors")
    assert all(w.dtype == torch.float16 for w in weights.values())
    model, tokenizer = load_model(out)
    assert next(model.parameters()).dtype == torch.float32 and tokenizer is not None
    assert (out / "CARD.md").read_text() == "# card\n"
    starts = json.loads((out / "textworld_start_states.json").read_text())["start_states"]
    assert len(starts) == 1 and starts[0]["seed"] == 1_000_000 and starts[0]["state"]["objects"]
    env = gym.make("RLVRWorld-TextGame-v0", checkpoint=str(out))
    observation, info = env.reset(seed=0)
    assert starts[0]["objective"] in observation and info["candidates"]
    env.close()


@pytest.mark.skipif(not browser_available(), reason="needs Debian's chromium and chromium-driver (make browser)")
def test_ship_web_records_real_start_pages(tmp_path, trained):
    out = ship(ShipConfig(src=str(trained), name="w", domain="web", out=str(tmp_path / "shipped"), start_states=1))
    pages = json.loads((out / "web_start_pages.json").read_text())
    pages = pages["pages"] if isinstance(pages, dict) else pages
    assert len({p["task"] for p in pages}) >= 10 and all(p["tree"] and p["utterance"] for p in pages)
