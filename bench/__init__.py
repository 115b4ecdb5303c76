"""turnlog benchmarks (issue #4): ``python -m bench [--quick] [--scenarios a,b] [--json-out FILE]``.

Modules:

* ``bench.upstream`` – a fast / paced OpenAI-compatible upstream (own process);
* ``bench.floor``    – the floor: a minimal byte relay in front of the upstream (own process);
* ``bench.client``   – the streaming client that counts chunks (own process, one per measurement);
* ``bench.storebench`` – store-level drivers (group-commit append, replay fold), run in a subprocess;
* ``bench.procs``    – spawning, readiness, /proc sampling and guaranteed cleanup of those processes;
* ``bench.scenarios`` – the scenarios, ``bench.run`` – the command line.

See ``bench/README.md``.
"""
