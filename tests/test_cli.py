import importlib

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
