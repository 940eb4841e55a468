from torch_hoplite.bench.collectives import main

main()
