from protospec.bench.cli import main

main()
