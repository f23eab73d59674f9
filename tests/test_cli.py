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
