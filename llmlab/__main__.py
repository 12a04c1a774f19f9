from llmlab.main import main

main()
