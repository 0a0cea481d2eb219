from matcher.cli import main

main()
