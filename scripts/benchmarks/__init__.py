"""The benchmarks: one entry point (`scripts/benchmark NAME [options]`, see __main__.py), shared
load generation (load.py), process CPU accounting (proc.py) and server start-up (servers.py).
Each benchmark writes its page under docs/ — the only way those pages are refreshed; the test
suite never writes them."""
