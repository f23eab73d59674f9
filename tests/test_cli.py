import importlib
import re
import subprocess
from pathlib import Path

import pytest

from rlvr_gym.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_resolves_and_documents_its_flags(name, capsys):
    module_name, config_name, fn_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    assert callable(getattr(module, fn_name))
    with pytest.raises(SystemExit) as exit_info:
        main([*name.split(), "--help"])
    assert exit_info.value.code == 0
    assert f"rlvr-gym {name}" in capsys.readouterr().out


def test_an_unknown_command_prints_the_list_and_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "nothing"])
    assert exit_info.value.code == 2
    assert "train rt1-mle" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--grpo.run-dir", "elsewhere"], ["--sft.resume"], ["--grpo.model", "rt1-mle"]])
def test_a_nested_flag_the_command_sets_itself_is_refused_before_training(flags, tmp_path):
    with pytest.raises(ValueError, match=f"{flags[0]} is set by this command"):
        main(["demo", "--run-dir", str(tmp_path), *flags])
    assert not (tmp_path / "sft").exists()


def test_rt1_rlvr_refuses_a_max_new_tokens_it_sets_from_the_horizon(tmp_path):
    with pytest.raises(ValueError, match="--grpo.max-new-tokens is set by this command .*here to 65"):
        main(["train", "rt1-rlvr", "--model", "rt1-mle", "--out", str(tmp_path / "rlvr"), "--grpo.max-new-tokens", "7"])


def test_the_docs_scripts_parse_and_name_real_commands():
    """The reproduction scripts under docs/ run for hours, so a typo there shows up late: each must parse, call only
    commands the CLI has, and take torchrun from the venv (a fresh shell has no torchrun on PATH)."""
    scripts = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.sh"))
    assert scripts
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
        text = script.read_text()
        for words in re.findall(r"-m rlvr_gym ((?:[a-z][a-z0-9-]* ?)+)", text):
            words = words.split()
            assert words[0] in COMMANDS or " ".join(words[:2]) in COMMANDS, f"{script.name}: {words}"
        assert not re.search(r"^\s*torchrun\b", text, re.M), f"{script.name} calls torchrun from PATH"
