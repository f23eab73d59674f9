"""`python -m rlvr_gym`: the `rlvr-gym` command line (what torchrun launches)."""

from rlvr_gym.cli import main

main()
