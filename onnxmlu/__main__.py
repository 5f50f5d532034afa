from onnxmlu.cli import main

main()
