from llmlab.cli import main

main()
