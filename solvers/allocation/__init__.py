"""Online allocation: how many instances of which serving templates to run in which region.

The program and its letters are stated in ``model``; the solution path in ``solve``. Modules:
``problem`` (input, validation, effort and result types), ``columns`` (the (template, region) columns
after lossless reductions), ``heuristics`` (greedy repair and local search), ``model`` (the HiGHS model),
``relaxation`` (LP, column generation, LP dive), ``stopping`` (deadlines; HiGHS runs stopped at them),
``decomposition`` (MIPs from a warm start; the decomposition by model), ``master`` (restricted master
MIPs over the columns the LP prices cheap), ``neighbourhood`` (fix-and-optimise MIPs over one model's or
one region's columns), ``solve`` (the driver).
"""

from solvers.allocation.problem import (
    MODES,
    RESTRICTIONS,
    AllocationInputError,
    AllocationProblem,
    AllocationResult,
    AllocTemplate,
    SolverEffort,
)
from solvers.allocation.solve import solve_allocation

__all__ = [
    "MODES",
    "RESTRICTIONS",
    "AllocTemplate",
    "AllocationInputError",
    "AllocationProblem",
    "AllocationResult",
    "SolverEffort",
    "solve_allocation",
]
