"""The benchmark harness: torch_hoplite side by side with gloo on loopback or
on an emulated cluster (network namespaces, tbf-limited links).

    python -m torch_hoplite.bench --ops broadcast,reduce,allreduce --sizes 16MB,256MB \\
        --nodes 4,8 --systems hoplite,hoplite-c10d,gloo --rate 1gbit --json out.json --plot out.png

See ``python -m torch_hoplite.bench --help`` and benchmarks/README.md.
"""
