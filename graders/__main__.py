from graders.cli import main

main()
