from oomlab.cli import main

main()
