# Coral's everyday commands. `just` alone lists them.

default:
    @just --list

# install Coral with the development tools
setup:
    python -m pip install -e ".[dev]"

# the project's bytecode, before the tests: they start about 150 Python processes that import it (solver
# processes, CLI runs, workers, vLLM servers), and where PYTHONDONTWRITEBYTECODE is set each compiled it again
_bytecode:
    python -m compileall -q coral actors solvers tui

# run the test suite (everything, as CI does), a pytest-xdist worker per core (the vLLM servers' tests in two groups)
test *ARGS: _bytecode
    python -m pytest -n auto --dist loadgroup {{ARGS}}

# the unit tier, for the edit-run loop: no slow tests, no mesh, gateway or vLLM suites, two workers
test-fast *ARGS: _bytecode
    python -m pytest -n 2 --dist loadgroup -m "not slow and not vllm" --ignore=tests/mesh --ignore=tests/gateway --ignore=tests/vllm --ignore=tests/tui/test_real_mesh.py {{ARGS}}

# ruff, mypy and the package contracts (import-linter, [tool.importlinter] in pyproject.toml)
lint:
    ruff check coral actors solvers tui tests bench
    ruff format --check coral actors solvers tui tests bench
    mypy
    lint-imports

# run one benchmark: alloc-bench, at-deadline, bus, compare-stores, gateway, gateway-auth, gateway-proxy, helix, mesh, options, overload, perf-fit, pipeline, placement-bench, placement-paths, plan, ray-build, recovery, sim, steering, sweep, templates, test-tiers, tui-cost, tui-steer
bench NAME *ARGS:
    python bench/{{replace(NAME, "-", "_")}}.py {{ARGS}}

# start the actor mesh on the bundled default scenario
up *ARGS:
    coral up {{ARGS}}

# attach the terminal UI to a running mesh
tui *ARGS:
    coral tui {{ARGS}}
