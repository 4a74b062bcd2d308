from gpux_pack.cli import main

main()
