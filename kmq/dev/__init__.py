"""Development tools: the embedded broker (tansu) and Redis, process helpers and
the demo. Used by ``kmq dev``, ``kmq demo``, the benchmarks and the tests; the
library and the services never import them.
"""
