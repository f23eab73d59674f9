from rlvr_gym.cli import main

main()
