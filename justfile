# Coral's everyday commands. `just` alone lists them.

default:
    @just --list

# install Coral with the development tools
setup:
    python -m pip install -e ".[dev]"

# run the test suite
test *ARGS:
    python -m pytest {{ARGS}}

# ruff and mypy over the four packages
lint:
    ruff check coral actors solvers tui tests bench
    ruff format --check coral actors solvers tui tests bench
    mypy

# run one benchmark: alloc-bench, bus, gateway, helix, mesh, overload, perf-fit, placement-bench, placement-paths, plan, recovery, sim, templates
bench NAME *ARGS:
    python bench/{{replace(NAME, "-", "_")}}.py {{ARGS}}

# start the actor mesh on the bundled default scenario
up *ARGS:
    coral up {{ARGS}}

# attach the terminal UI to a running mesh
tui *ARGS:
    coral tui {{ARGS}}
